// Mooncake JSONL reader: one request per line, global block ids, timestamps in ms.
#include <simdjson.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "workload/json_error.h"
#include "workload/readers.h"

namespace kvtier::workload {
namespace {

using simdjson::dom::array;
using simdjson::dom::element;
using simdjson::dom::object;

std::string BaseName(std::string_view path) {
  size_t slash = path.rfind('/');
  std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  size_t dot = base.rfind('.');
  if (dot != std::string_view::npos && dot > 0) base = base.substr(0, dot);
  return std::string(base);
}

}  // namespace

namespace {

class MooncakeParser {
 public:
  MooncakeParser(std::string_view source, uint32_t block_tokens) : source_(source) {
    trace_.format = TraceFormat::kMooncake;
    trace_.path = std::string(source);
    trace_.name = BaseName(source);
    trace_.block_tokens = block_tokens;
    // Ids are global inside the file: one namespace per file.
    trace_.root = Namespace{.model_id = "mooncake:" + trace_.name}.Root();
  }

  // One line of the file (without its newline).
  Status Line(std::string_view line);
  Trace Take() { return std::move(trace_); }

 private:
  std::string_view source_;
  Trace trace_;
  simdjson::dom::parser parser_;
  size_t line_no_ = 0;
  uint32_t order_ = 0;
};

Status MooncakeParser::Line(std::string_view line) {
  ++line_no_;
  const uint32_t block_tokens = trace_.block_tokens;
  auto fail = [&](const std::string& what) {
    return Status::InvalidArgument(std::string(source_) + ":" + std::to_string(line_no_) + ": " +
                                   what);
  };
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return Status::Ok();
  element doc;
  if (auto err = parser_.parse(line.data(), line.size()).get(doc); err != simdjson::SUCCESS) {
    std::string located = LocateJsonError(line);
    if (located.empty()) return fail(simdjson::error_message(err));
    // Within one line: its column, or the key path of a number too large.
    return fail(located.starts_with("line ") ? located.substr(located.find(',') + 2) : located);
  }
  object o;
  if (doc.get_object().get(o) != simdjson::SUCCESS) return fail("record is not a JSON object");
  double ts = 0;
  if (o["timestamp"].get_double().get(ts) != simdjson::SUCCESS) {
    return fail("missing or non-numeric 'timestamp'");
  }
  if (!(ts >= 0) || !std::isfinite(ts)) return fail("'timestamp' must be >= 0");
  auto count = [&](const char* key, bool required, uint64_t* out) -> Status {
    element e;
    if (o[key].get(e) != simdjson::SUCCESS) {
      return required ? fail(std::string("missing '") + key + "'") : Status::Ok();
    }
    int64_t i = 0;
    if (e.get_uint64().get(*out) == simdjson::SUCCESS) return Status::Ok();
    if (e.get_int64().get(i) == simdjson::SUCCESS) {
      return fail(std::string("'") + key + "' is negative (" + std::to_string(i) + ")");
    }
    return fail(std::string("'") + key + "' must be a non-negative integer");
  };
  uint64_t in = 0, out = 0;
  KVTIER_RETURN_IF_ERROR(count("input_length", true, &in));
  KVTIER_RETURN_IF_ERROR(count("output_length", false, &out));
  if (in > UINT32_MAX || out > UINT32_MAX) return fail("token count over 2^32");
  array ids;
  if (o["hash_ids"].get(ids) != simdjson::SUCCESS) return fail("missing or non-array 'hash_ids'");
  TraceRequest q;
  q.start_s = ts / 1000.0;
  q.prompt_tokens = static_cast<uint32_t>(in);
  q.output_tokens = static_cast<uint32_t>(out);
  q.ids_begin = static_cast<uint32_t>(trace_.ids.size());
  for (element id : ids) {
    uint64_t v = 0;
    if (id.get_uint64().get(v) != simdjson::SUCCESS) {
      return fail("hash_ids[" + std::to_string(trace_.ids.size() - q.ids_begin) +
                  "] is not a non-negative integer");
    }
    trace_.ids.push_back(v);
  }
  if (trace_.ids.size() > UINT32_MAX) return fail("more than 2^32 block ids");
  q.ids_count = static_cast<uint32_t>(trace_.ids.size() - q.ids_begin);
  const uint64_t full = in / block_tokens;
  const uint64_t all = (in + block_tokens - 1) / block_tokens;
  if (q.ids_count != full && q.ids_count != all) {
    return fail("hash_ids has " + std::to_string(q.ids_count) + " ids but input_length " +
                std::to_string(in) + " needs " + std::to_string(all) + " blocks of " +
                std::to_string(block_tokens));
  }
  q.order = order_++;
  TraceSession s;
  s.name = trace_.name + "#" + std::to_string(line_no_);
  s.start_s = 0;
  s.requests.push_back(q);
  trace_.sessions.push_back(std::move(s));
  return Status::Ok();
}

}  // namespace

Result<Trace> ParseMooncake(std::string_view jsonl, std::string_view source,
                            uint32_t block_tokens) {
  if (block_tokens == 0) return Status::InvalidArgument("mooncake block_tokens must be > 0");
  MooncakeParser parser(source, block_tokens);
  size_t pos = 0;
  while (pos < jsonl.size()) {
    size_t end = jsonl.find('\n', pos);
    if (end == std::string_view::npos) end = jsonl.size();
    KVTIER_RETURN_IF_ERROR(parser.Line(jsonl.substr(pos, end - pos)));
    pos = end + 1;
  }
  return parser.Take();
}

Result<Trace> ReadMooncakeFile(const std::string& path, uint32_t block_tokens) {
  if (block_tokens == 0) return Status::InvalidArgument("mooncake block_tokens must be > 0");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::InvalidArgument(path + ": cannot open");
  // A record is a few KiB; a "line" past this is no record (a binary or sparse file).
  constexpr size_t kMaxLine = 64u << 20;
  MooncakeParser parser(path, block_tokens);
  std::vector<char> chunk(1u << 20);
  std::string carry;  // the current line's start, from earlier chunks
  size_t line_no = 1;
  for (;;) {
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    const size_t got = static_cast<size_t>(in.gcount());
    if (got == 0) break;
    std::string_view rest(chunk.data(), got);
    for (size_t nl; (nl = rest.find('\n')) != std::string_view::npos; rest.remove_prefix(nl + 1)) {
      if (carry.empty()) {
        KVTIER_RETURN_IF_ERROR(parser.Line(rest.substr(0, nl)));
      } else {
        carry.append(rest.substr(0, nl));
        KVTIER_RETURN_IF_ERROR(parser.Line(carry));
        carry.clear();
      }
      ++line_no;
    }
    if (carry.size() + rest.size() > kMaxLine) {
      return Status::InvalidArgument(path + ":" + std::to_string(line_no) +
                                     ": line longer than 64 MiB: not a Mooncake record");
    }
    carry.append(rest);
  }
  if (in.bad()) return Status::InvalidArgument(path + ": read error");
  if (!carry.empty()) KVTIER_RETURN_IF_ERROR(parser.Line(carry));
  return parser.Take();
}

}  // namespace kvtier::workload
