#include "workload/json_error.h"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace kvtier::workload {
namespace {

// Accepts everything and records the first error; returning false stops the parser without
// throwing.
struct ErrorSax : nlohmann::json_sax<nlohmann::json> {
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return true; }
  bool key(string_t&) override { return true; }
  bool end_object() override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
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
  if (!sax.failed) return {};
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
