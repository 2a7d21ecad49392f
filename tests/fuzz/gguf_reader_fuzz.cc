// Fuzzes the GGUF reader: any file loads into a consistent model or fails with NotFound,
// InvalidArgument or Corruption naming the file; no crash, hang, huge allocation or
// out-of-bounds read (the reader range-checks every count and offset before it trusts it).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "engine/gguf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    const char* dir = std::getenv("TMPDIR");
    return std::string(dir ? dir : "/tmp") + "/kvtier-gguf-fuzz-" + std::to_string(getpid()) +
           ".gguf";
  }();
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) std::abort();
  if (size > 0 && std::fwrite(data, 1, size, f) != size) std::abort();
  std::fclose(f);
  auto r = kvtier::engine::LoadGguf(path);
  if (!r.ok()) {
    const kvtier::StatusCode c = r.status().code();
    if (c != kvtier::StatusCode::kInvalidArgument && c != kvtier::StatusCode::kCorruption &&
        c != kvtier::StatusCode::kNotFound)
      std::abort();
    if (r.status().message().find(path) == std::string::npos) std::abort();
  }
  return 0;
}
