// Fuzzes the Mooncake JSONL reader: any input parses into a consistent trace or fails with an
// InvalidArgument naming the source and line; no crash, hang or out-of-bounds read.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "workload/readers.h"
#include "workload/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::workload;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = ParseMooncake(text, "fuzz.jsonl");
  if (!r.ok()) {
    if (r.status().code() != kvtier::StatusCode::kInvalidArgument) std::abort();
    if (r.status().message().rfind("fuzz.jsonl:", 0) != 0) std::abort();
    return 0;
  }
  for (const auto& s : r->sessions) {
    for (const auto& q : s.requests) {
      if (uint64_t{q.ids_begin} + q.ids_count > r->ids.size()) std::abort();
      const uint64_t full = q.prompt_tokens / r->block_tokens;
      if (q.ids_count != full && q.ids_count != full + 1) std::abort();
    }
  }
  (void)DetectFormat(text, "fuzz.jsonl");
  return 0;
}
