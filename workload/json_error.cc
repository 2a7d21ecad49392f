#include "workload/json_error.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvtier::workload {
namespace {

// Accepts everything and records the first error; returning false stops the parser without
// throwing. It tracks the path of the current value ("requests[3].in"), so an integer too
// large for 64 bits (valid JSON, but refused by simdjson with no position) is named by path.
struct ErrorSax : nlohmann::json_sax<nlohmann::json> {
  struct Frame {
    bool array = false;
    size_t index = 0;
    std::string key;
  };
  std::vector<Frame> frames;

  std::string Path() const {
    std::string p;
    for (const Frame& f : frames) {
      if (f.array) {
        p += "[" + std::to_string(f.index) + "]";
      } else {
        p += (p.empty() ? "" : ".") + f.key;
      }
    }
    return p.empty() ? "top level" : p;
  }
  bool Done() {  // a value ended: the enclosing array moves to its next element
    if (!frames.empty() && frames.back().array) ++frames.back().index;
    return true;
  }

  bool null() override { return Done(); }
  bool boolean(bool) override { return Done(); }
  bool number_integer(number_integer_t) override { return Done(); }
  bool number_unsigned(number_unsigned_t) override { return Done(); }
  bool number_float(number_float_t, const string_t& text) override {
    const bool integer = !text.empty() && text.find_first_of(".eE") == std::string::npos;
    if (integer && !too_large) {
      too_large = true;
      big_path = Path();
      big_text = text.substr(0, 40);
    }
    return Done();
  }
  bool string(string_t&) override { return Done(); }
  bool binary(binary_t&) override { return Done(); }
  bool start_object(std::size_t) override {
    frames.push_back({});
    return true;
  }
  bool key(string_t& k) override {
    frames.back().key = k;
    return true;
  }
  bool end_object() override {
    frames.pop_back();
    return Done();
  }
  bool start_array(std::size_t) override {
    frames.push_back({true, 0, {}});
    return true;
  }
  bool end_array() override {
    frames.pop_back();
    return Done();
  }
  bool parse_error(std::size_t pos, const std::string& last_token,
                   const nlohmann::detail::exception&) override {
    failed = true;
    position = pos;
    token = last_token;
    return false;
  }

  bool failed = false;
  size_t position = 0;
  std::string token;
  bool too_large = false;
  std::string big_path, big_text;
};

}  // namespace

size_t LineOfOffset(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  return 1 + static_cast<size_t>(std::count(text.begin(), text.begin() + offset, '\n'));
}

std::string LocateJsonError(std::string_view text) {
  ErrorSax sax;
  nlohmann::json::sax_parse(text.begin(), text.end(), &sax, nlohmann::json::input_format_t::json,
                            /*strict=*/true);
  if (!sax.failed) {
    if (!sax.too_large) return {};
    return sax.big_path + ": integer " + sax.big_text + " does not fit in 64 bits";
  }
  // nlohmann's position is one past the offending byte.
  const size_t at = sax.position > 0 ? sax.position - 1 : 0;
  const size_t line = LineOfOffset(text, at);
  const size_t line_start = text.rfind('\n', at == 0 ? 0 : at - 1);
  const size_t column = line_start == std::string_view::npos ? at + 1 : at - line_start;
  std::string token = sax.token.substr(0, 24);
  for (char& c : token) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column) +
         ": invalid JSON near '" + token + "'" + (at + 1 >= text.size() ? " (truncated?)" : "");
}

}  // namespace kvtier::workload
