#include "sim/kv_layout.h"

#include <algorithm>
#include <cmath>

namespace kvtier::sim {
namespace {

struct KindName {
  KvGroupKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {KvGroupKind::kFull, "full"},
    {KvGroupKind::kLatent, "latent"},
    {KvGroupKind::kCompressed, "compressed"},
    {KvGroupKind::kIndexer, "indexer"},
    {KvGroupKind::kSlidingWindow, "sliding_window"},
    {KvGroupKind::kState, "state"},
};

// Element bytes of the dtypes --kv-dtype can switch between; 0 for the rest (fixed layouts).
double Rescalable(std::string_view dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "fp8") return 1;
  return 0;
}

double EntryBytes(const KvGroup& g, std::string_view dtype) {
  const double from = Rescalable(g.dtype), to = Rescalable(dtype);
  if (dtype.empty() || from == 0 || to == 0) return g.entry_bytes;
  return g.entry_bytes * to / from;
}

double RoundUp(double bytes, uint32_t align) {
  if (align == 0) return bytes;
  return std::ceil(bytes / align) * align;
}

Status Field(const nlohmann::json& j, const char* key, std::string_view where, double* out) {
  auto it = j.find(key);
  if (it == j.end()) return Status::Ok();
  if (!it->is_number() || !(it->get<double>() >= 0)) {
    return Status::InvalidArgument(std::string(where) + ": '" + key +
                                   "' must be a non-negative number");
  }
  *out = it->get<double>();
  return Status::Ok();
}

Status Count(const nlohmann::json& j, const char* key, std::string_view where, uint32_t* out) {
  double v = *out;
  KVTIER_RETURN_IF_ERROR(Field(j, key, where, &v));
  if (v != std::floor(v) || v > 1e9) {
    return Status::InvalidArgument(std::string(where) + ": '" + key + "' must be an integer");
  }
  *out = static_cast<uint32_t>(v);
  return Status::Ok();
}

Result<KvGroup> ParseGroup(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) return Status::InvalidArgument(where + ": must be an object");
  KvGroup g;
  g.name = j.value("name", std::string());
  bool ok = false;
  g.kind = ParseKvGroupKind(j.value("kind", std::string()), &ok);
  if (!ok) {
    return Status::InvalidArgument(where +
                                   ": 'kind' must be full, latent, compressed, indexer, "
                                   "sliding_window or state");
  }
  g.dtype = j.value("dtype", std::string());
  KVTIER_RETURN_IF_ERROR(Count(j, "layers", where, &g.layers));
  KVTIER_RETURN_IF_ERROR(Field(j, "entry_bytes", where, &g.entry_bytes));
  KVTIER_RETURN_IF_ERROR(Count(j, "ratio", where, &g.ratio));
  KVTIER_RETURN_IF_ERROR(Count(j, "window", where, &g.window));
  KVTIER_RETURN_IF_ERROR(Count(j, "slots", where, &g.slots));
  KVTIER_RETURN_IF_ERROR(Count(j, "page_align", where, &g.page_align));
  g.in_window_pool = j.value("in_window_pool", false);
  // Without entry_bytes an entry is K and V (full) or one latent of heads x head_dim elements.
  if (g.entry_bytes == 0 && j.contains("head_dim")) {
    uint32_t heads = 1, head_dim = 0;
    KVTIER_RETURN_IF_ERROR(Count(j, "heads", where, &heads));
    KVTIER_RETURN_IF_ERROR(Count(j, "head_dim", where, &head_dim));
    const double kv = g.kind == KvGroupKind::kFull || g.kind == KvGroupKind::kSlidingWindow ? 2 : 1;
    g.entry_bytes = kv * heads * head_dim * Rescalable(g.dtype);
  }
  return g;
}

}  // namespace

KvGroupKind ParseKvGroupKind(std::string_view name, bool* ok) {
  for (const KindName& k : kKinds) {
    if (name == k.name) {
      *ok = true;
      return k.kind;
    }
  }
  *ok = false;
  return KvGroupKind::kFull;
}

const char* KvGroupKindName(KvGroupKind kind) {
  for (const KindName& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "?";
}

bool KvGroup::TokenProportional() const {
  return kind == KvGroupKind::kFull || kind == KvGroupKind::kLatent ||
         kind == KvGroupKind::kCompressed || kind == KvGroupKind::kIndexer;
}

Status KvGroupLayout::Validate() const {
  if (groups.empty()) return Status::InvalidArgument("kv_layout: no groups");
  if (!(window_pool_ratio >= 0 && window_pool_ratio <= 1)) {
    return Status::InvalidArgument("kv_layout: window_pool_ratio must be in [0, 1]");
  }
  for (const KvGroup& g : groups) {
    const std::string where = "kv_layout group '" + g.name + "': ";
    if (g.layers == 0 || !(g.entry_bytes > 0)) {
      return Status::InvalidArgument(where + "layers and entry_bytes (or head_dim) must be > 0");
    }
    if (g.ratio == 0) return Status::InvalidArgument(where + "ratio must be >= 1");
    if (block_tokens > 0 && g.TokenProportional() && block_tokens % g.ratio != 0) {
      return Status::InvalidArgument(where + "ratio must divide block_tokens");
    }
    if (g.kind == KvGroupKind::kSlidingWindow && g.window == 0) {
      return Status::InvalidArgument(where + "a sliding window needs 'window' > 0");
    }
    if (g.kind == KvGroupKind::kState && g.slots == 0) {
      return Status::InvalidArgument(where + "a state needs 'slots' > 0");
    }
    if (g.in_window_pool && (window_pool_ratio == 0 || window_page_tokens == 0)) {
      return Status::InvalidArgument(where +
                                     "in_window_pool needs window_pool_ratio and "
                                     "window_page_tokens");
    }
  }
  return Status::Ok();
}

KvGroupBytes GroupBytes(const KvGroupLayout& layout, const KvGroup& g, std::string_view dtype) {
  KvGroupBytes b;
  const double entry = EntryBytes(g, dtype);
  const double layers = g.layers;
  if (g.TokenProportional()) {
    if (layout.block_tokens == 0) {
      b.per_token = layers * entry / g.ratio;
      return b;
    }
    b.page_bytes =
        RoundUp(static_cast<double>(layout.block_tokens / g.ratio) * entry, g.page_align);
    b.per_token = layers * b.page_bytes / layout.block_tokens;
    return b;
  }
  const bool pooled = layout.window_pool_ratio > 0;
  if (g.kind == KvGroupKind::kSlidingWindow) {
    if (pooled) {
      b.per_window_token = layers * entry;
    } else {
      b.per_request = layers * g.window * entry;
    }
    return b;
  }
  // State: a ring of `slots` entries per window page, or `slots` per request.
  if (g.in_window_pool && pooled) {
    b.per_window_token = layers * entry * g.slots / layout.window_page_tokens;
  } else {
    b.per_request = layers * entry * g.slots;
  }
  return b;
}

double KvBytesPerCachedToken(const KvGroupLayout& layout, std::string_view dtype) {
  double total = 0;
  for (const KvGroup& g : layout.groups) {
    const KvGroupBytes b = GroupBytes(layout, g, dtype);
    total += b.per_token + layout.window_pool_ratio * b.per_window_token;
  }
  return total;
}

double KvBytesPerRunningRequest(const KvGroupLayout& layout, std::string_view dtype) {
  double total = 0;
  for (const KvGroup& g : layout.groups) total += GroupBytes(layout, g, dtype).per_request;
  return total;
}

double KvBytesForTokens(const KvGroupLayout& layout, uint64_t tokens, std::string_view dtype) {
  double total = 0;
  const double n = static_cast<double>(tokens);
  for (const KvGroup& g : layout.groups) {
    const double entry = EntryBytes(g, dtype);
    if (g.TokenProportional()) {
      const KvGroupBytes b = GroupBytes(layout, g, dtype);
      if (layout.block_tokens == 0) {
        total += g.layers * std::ceil(n / g.ratio) * entry;
      } else {
        total += g.layers * std::ceil(n / layout.block_tokens) * b.page_bytes;
      }
    } else if (g.kind == KvGroupKind::kSlidingWindow) {
      total += g.layers * std::min<double>(n, g.window) * entry;
    } else {
      total += g.layers * static_cast<double>(g.slots) * entry;
    }
  }
  return total;
}

Result<KvGroupLayout> ParseKvGroupLayout(const nlohmann::json& j, std::string_view source) {
  const std::string where = std::string(source) + ": kv_layout";
  if (!j.is_object()) return Status::InvalidArgument(where + " must be an object");
  KvGroupLayout l;
  KVTIER_RETURN_IF_ERROR(Count(j, "block_tokens", where, &l.block_tokens));
  KVTIER_RETURN_IF_ERROR(Field(j, "window_pool_ratio", where, &l.window_pool_ratio));
  KVTIER_RETURN_IF_ERROR(Count(j, "window_page_tokens", where, &l.window_page_tokens));
  l.replicated_across_tp = j.value("replicated_across_tp", false);
  auto it = j.find("groups");
  if (it == j.end() || !it->is_array()) {
    return Status::InvalidArgument(where + ": 'groups' must be an array");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    KVTIER_ASSIGN_OR_RETURN(KvGroup g,
                            ParseGroup((*it)[i], where + ".groups[" + std::to_string(i) + "]"));
    l.groups.push_back(std::move(g));
  }
  if (Status s = l.Validate(); !s.ok()) return s.WithContext(source);
  return l;
}

KvGroupLayout SingleGroupLayout(double bytes_per_token, std::string_view dtype) {
  KvGroupLayout l;
  KvGroup g;
  g.name = "all layers";
  g.kind = KvGroupKind::kFull;
  g.layers = 1;
  g.entry_bytes = bytes_per_token;
  g.dtype = std::string(dtype);
  l.groups.push_back(std::move(g));
  return l;
}

KvGroupLayout FromStorageLayout(const kvtier::KvLayout& layout) {
  KvGroupLayout out;
  out.block_tokens = layout.block_tokens;
  for (const kvtier::KvLayoutGroup& lg : layout.AsGroups()) {
    KvGroup g;
    g.name = std::string(kvtier::KvGroupKindName(lg.kind));
    g.layers = lg.num_layers;
    g.dtype = std::string(kvtier::DTypeName(lg.dtype));
    switch (lg.kind) {
      case kvtier::KvGroupKind::kFull:
        g.kind = KvGroupKind::kFull;
        break;
      case kvtier::KvGroupKind::kLatent:
        g.kind = KvGroupKind::kLatent;
        break;
      case kvtier::KvGroupKind::kSlidingWindow:
        g.kind = KvGroupKind::kSlidingWindow;
        g.window = lg.window;
        if (lg.page_tokens) out.block_tokens = lg.page_tokens;
        break;
      case kvtier::KvGroupKind::kState:
        g.kind = KvGroupKind::kState;
        g.slots = 1;
        break;
    }
    g.entry_bytes = lg.kind == kvtier::KvGroupKind::kState
                        ? static_cast<double>(lg.state_bytes)
                        : static_cast<double>(lg.bytes_per_token_layer());
    out.groups.push_back(std::move(g));
  }
  return out;
}

}  // namespace kvtier::sim
