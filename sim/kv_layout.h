// A model's KV cache as layer groups: what each group of layers keeps per token, per compressed
// entry, per sliding window or per request, and how an engine pages it. A model profile states
// its groups under "kv_layout" (doc/replay.md, "KV layout"); an old profile with one
// kv_bytes_per_token is one full-attention group. The groups are meant to map one to one onto
// the library's KvLayout once it grows hybrid layouts, so this is the only schema for them;
// the type is named KvGroupLayout so that it does not shadow kvtier::KvLayout inside sim/.
//
// Thread-safety: values; the functions are reentrant.
#ifndef KVTIER_SIM_KV_LAYOUT_H_
#define KVTIER_SIM_KV_LAYOUT_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/status.h"

namespace kvtier::sim {

enum class KvGroupKind {
  kFull,           // one entry per token (dense / GQA / MHA K and V)
  kLatent,         // one entry per token holding K and V together (MLA)
  kCompressed,     // one entry per `ratio` tokens (compressed attention)
  kIndexer,        // a sparse-attention indexer's keys, one entry per `ratio` tokens
  kSlidingWindow,  // the last `window` tokens of a request
  kState,          // `slots` fixed entries per request (Mamba / linear state, compressor rings)
};

// "full", "latent", ... ; the kind of an unknown name is kFull and *ok is false.
KvGroupKind ParseKvGroupKind(std::string_view name, bool* ok);
const char* KvGroupKindName(KvGroupKind kind);

struct KvGroup {
  std::string name;
  KvGroupKind kind = KvGroupKind::kFull;
  uint32_t layers = 0;
  double entry_bytes = 0;  // one layer's bytes for one entry (token, compressed entry, slot)
  std::string dtype;       // "bf16", "fp16", "fp8" rescale with --kv-dtype; others are fixed
  uint32_t ratio = 1;      // tokens per entry (compressed, indexer)
  uint32_t window = 0;     // sliding window: tokens kept per request
  uint32_t slots = 0;      // state: entries kept per request
  // A page of block_tokens / ratio entries is rounded up to a multiple of this (0 = none).
  uint32_t page_align = 0;
  // State only: the slots live beside the sliding windows (a ring per window page of
  // KvGroupLayout::window_page_tokens tokens) rather than once per request.
  bool in_window_pool = false;

  // True for the kinds whose size grows with the tokens held (full, latent, compressed, indexer).
  bool TokenProportional() const;
};

struct KvGroupLayout {
  uint32_t block_tokens = 0;  // the engine's page in tokens; 0 = no paging (one-number profiles)
  // > 0: sliding windows (and window-pool states) get a pool of this share of the cached tokens,
  // sized with them (SGLang's swa_full_tokens_ratio); 0: each running request holds its own.
  double window_pool_ratio = 0;
  uint32_t window_page_tokens = 0;    // tokens per window page (window-pool states); 0 = no page
  bool replicated_across_tp = false;  // every GPU of a rank keeps the whole KV (MLA-style caches)
  std::vector<KvGroup> groups;

  Status Validate() const;
};

// One group's share of the pool, for a KV element type (`dtype` empty = as stated).
struct KvGroupBytes {
  double page_bytes = 0;        // one layer's page of block_tokens tokens, padded (token groups)
  double per_token = 0;         // bytes per cached token, all layers, padding amortized
  double per_window_token = 0;  // bytes per token of the window pool, all layers
  double per_request = 0;       // fixed bytes per running request, all layers
};

// The bytes of `g` under `layout` stored as `dtype` ("" = the group's own). Unknown dtype names
// leave fixed-layout groups as stated.
KvGroupBytes GroupBytes(const KvGroupLayout& layout, const KvGroup& g, std::string_view dtype = {});

// Bytes per cached token the engine charges: the token groups plus window_pool_ratio x the
// window-pool groups (SGLang's bytes_per_full_token when the layout follows it).
double KvBytesPerCachedToken(const KvGroupLayout& layout, std::string_view dtype = {});
// Fixed bytes per running request: sliding windows and states when there is no window pool,
// else only the states held per request.
double KvBytesPerRunningRequest(const KvGroupLayout& layout, std::string_view dtype = {});
// KV bytes of one request holding `tokens` tokens: token groups in whole pages, sliding windows
// capped at the window, states constant.
double KvBytesForTokens(const KvGroupLayout& layout, uint64_t tokens, std::string_view dtype = {});

// The library's layout (what kvtier stores per block, kvtier/layout.h) as the simulator's groups,
// so a layout a daemon serves is priced by the same accounting: full, latent, sliding_window and
// state map one to one (a state is one slot per request); the engine page is a sliding
// window's page_tokens, else the block. An ungrouped layout is one full or latent group.
KvGroupLayout FromStorageLayout(const kvtier::KvLayout& layout);

// Reads a profile's "kv_layout" object; errors name `source` and the field.
Result<KvGroupLayout> ParseKvGroupLayout(const nlohmann::json& j, std::string_view source);
// The layout of a one-number profile: one full-attention layer of `bytes_per_token` at `dtype`.
KvGroupLayout SingleGroupLayout(double bytes_per_token, std::string_view dtype);

}  // namespace kvtier::sim

#endif  // KVTIER_SIM_KV_LAYOUT_H_
