// CacheOptions from a YAML file, the format vLLM and LMCache users already write:
//
//   model_id: llama-3.1-8b
//   layout: {preset: llama-3.1-8b, block_tokens: 64}   # or num_layers, num_kv_heads, ...
//   tenant: team-a                 # optional
//   write_mode: write-through      # or write-back
//   verify_checksums: true
//   tiers:
//     - {kind: host, capacity: 8GiB, threads: 2, eviction: lru}
//     - kind: disk
//       capacity: 100GiB
//       admission: {kind: after-n-hits, hits: 2}
//       params: {path: /mnt/nvme/kvtier}
//
// Errors name the file, the key path and, where known, the line: "kvtier.yaml:7:
// tiers[1].capacity: cannot parse '8XB' as a size". Unknown keys are errors (a typo must not
// silently fall back to a default). See doc/config.md.
//
// Thread-safety: pure functions.
#ifndef KVTIER_CONFIG_H_
#define KVTIER_CONFIG_H_

#include <string>
#include <string_view>

#include "kvtier/cache.h"
#include "kvtier/status.h"

namespace kvtier {

// Parses YAML text; `source` names it in errors. The result is validated.
Result<CacheOptions> ParseCacheOptionsYaml(std::string_view text, std::string_view source);
// A KvLayout from the YAML of a config's `layout:` mapping (or a document holding it under
// `layout:`), read by the same reader and validated; errors as ParseCacheOptionsYaml's.
Result<KvLayout> ParseLayoutYaml(std::string_view text, std::string_view source);
// Reads and parses a file.
Result<CacheOptions> LoadCacheOptionsFile(const std::string& path);
// The text of a config file; InvalidArgument naming the file when it cannot be read.
Result<std::string> ReadConfigFile(const std::string& path);

}  // namespace kvtier

#endif  // KVTIER_CONFIG_H_
