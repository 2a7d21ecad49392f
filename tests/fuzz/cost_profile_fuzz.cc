// Fuzzes the cost-profile JSON reader: any text parses into a profile that validates, or fails
// with InvalidArgument naming the source; no crash or exception escapes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "kvtier/planner.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto r = kvtier::ParseCostProfile(text, "fuzz.json");
  if (!r.ok()) {
    if (r.status().code() != kvtier::StatusCode::kInvalidArgument) std::abort();
    if (r.status().message().find("fuzz.json") == std::string_view::npos) std::abort();
    return 0;
  }
  if (!r->Validate().ok()) std::abort();
  return 0;
}
