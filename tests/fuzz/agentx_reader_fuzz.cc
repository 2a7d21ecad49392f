// Fuzzes the AgentX / WEKA reader: any input either parses into a consistent trace or fails with
// an InvalidArgument that names the source; it never crashes, hangs or reads out of bounds.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "workload/readers.h"
#include "workload/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvtier::workload;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = ParseAgentX(text, "fuzz.json");
  if (!r.ok()) {
    if (r.status().code() != kvtier::StatusCode::kInvalidArgument) std::abort();
    if (r.status().message().rfind("fuzz.json: ", 0) != 0) std::abort();
    return 0;
  }
  const Trace& t = *r;
  for (const auto& s : t.sessions) {
    if (s.parent >= static_cast<int32_t>(t.sessions.size())) std::abort();
    for (const auto& q : s.requests) {
      if (uint64_t{q.ids_begin} + q.ids_count > t.ids.size()) std::abort();
      const uint64_t full = q.prompt_tokens / t.block_tokens;
      if (q.ids_count != full && q.ids_count != full + 1) std::abort();
    }
  }
  auto stream = StreamTraces(std::span<const Trace>(&t, 1));
  ReplayRequest q;
  double last = -1;
  while (stream->Next(&q)) {
    if (q.start_s < last) std::abort();
    last = q.start_s;
  }
  return 0;
}
