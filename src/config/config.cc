#include <yaml-cpp/yaml.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "config/tier_params.h"
#include "kvtier/config.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier {
namespace {

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  Status Error(const YAML::Node& node, const std::string& path, const std::string& what) const {
    return Status::InvalidArgument(Where(node) + ": " + path + ": " + what);
  }
  // s (whose message names its own path) said at node's line.
  Status AtLine(const YAML::Node& node, const Status& s) const {
    return Status::InvalidArgument(Where(node) + ": " + std::string(s.message()));
  }
  std::string Where(const YAML::Node& node) const {
    std::string where = source_;
    if (node.IsDefined() && node.Mark().line >= 0)
      where += ":" + std::to_string(node.Mark().line + 1);
    return where;
  }

  Status CheckKeys(const YAML::Node& map, const std::string& path,
                   std::initializer_list<const char*> known) const {
    if (!map.IsMap()) return Error(map, path.empty() ? "(top level)" : path, "want a mapping");
    for (const auto& kv : map) {
      std::string key = kv.first.as<std::string>();
      bool ok = false;
      for (const char* k : known) ok |= key == k;
      if (!ok) {
        std::string list;
        for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
        return Error(kv.first, Join(path, key), "unknown key (known: " + list + ")");
      }
    }
    return Status::Ok();
  }

  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  Result<std::string> String(const YAML::Node& n, const std::string& path) const {
    if (!n.IsScalar()) return Error(n, path, "want a scalar");
    return n.as<std::string>();
  }
  Result<uint64_t> Uint(const YAML::Node& n, const std::string& path) const {
    KVTIER_ASSIGN_OR_RETURN(std::string s, String(n, path));
    uint64_t v = 0;
    size_t used = 0;
    try {
      if (!s.empty() && s[0] == '-') throw std::invalid_argument("negative");
      v = std::stoull(s, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != s.size())
      return Error(n, path, "want a non-negative integer, got '" + s + "'");
    return v;
  }
  Result<bool> Bool(const YAML::Node& n, const std::string& path) const {
    KVTIER_ASSIGN_OR_RETURN(std::string s, String(n, path));
    std::optional<bool> b = ParseBoolWord(s);
    if (!b) return Error(n, path, "want true or false, got '" + s + "'");
    return *b;
  }
  Result<uint64_t> Size(const YAML::Node& n, const std::string& path) const {
    KVTIER_ASSIGN_OR_RETURN(std::string s, String(n, path));
    auto v = ParseByteSize(s);
    if (!v.ok()) return Error(n, path, v.status().message());
    return *v;
  }

  Result<DType> DTypeOf(const YAML::Node& n, const std::string& path) const {
    KVTIER_ASSIGN_OR_RETURN(std::string d, String(n, path));
    auto dt = ParseDType(d);
    if (!dt) return Error(n, path, "unknown dtype '" + d + "' (bf16, fp16, fp8, fp32)");
    return *dt;
  }

  // A u32 key of map n, when present, into *out.
  Status U32(const YAML::Node& n, const std::string& path, const char* key, uint32_t* out) const {
    if (!n[key]) return Status::Ok();
    KVTIER_ASSIGN_OR_RETURN(uint64_t v, Uint(n[key], Join(path, key)));
    if (v > UINT32_MAX) return Error(n[key], Join(path, key), "too large");
    *out = static_cast<uint32_t>(v);
    return Status::Ok();
  }

  // One entry of layout.groups (its kind's fields; num_kv_heads defaults to 1 for latent).
  Result<KvLayoutGroup> Group(const YAML::Node& n, const std::string& path) const {
    KVTIER_RETURN_IF_ERROR(CheckKeys(n, path,
                                     {"kind", "num_layers", "num_kv_heads", "head_dim", "dtype",
                                      "window", "page_tokens", "state_bytes"}));
    KvLayoutGroup g;
    if (!n["kind"]) return Error(n, Join(path, "kind"), "missing");
    KVTIER_ASSIGN_OR_RETURN(std::string kind, String(n["kind"], Join(path, "kind")));
    auto k = ParseKvGroupKind(kind);
    if (!k)
      return Error(n["kind"], Join(path, "kind"),
                   "unknown kind '" + kind + "' (full, latent, sliding_window, state)");
    g.kind = *k;
    if (g.kind == KvGroupKind::kLatent) g.num_kv_heads = 1;
    KVTIER_RETURN_IF_ERROR(U32(n, path, "num_layers", &g.num_layers));
    KVTIER_RETURN_IF_ERROR(U32(n, path, "num_kv_heads", &g.num_kv_heads));
    KVTIER_RETURN_IF_ERROR(U32(n, path, "head_dim", &g.head_dim));
    KVTIER_RETURN_IF_ERROR(U32(n, path, "window", &g.window));
    KVTIER_RETURN_IF_ERROR(U32(n, path, "page_tokens", &g.page_tokens));
    if (n["dtype"]) {
      KVTIER_ASSIGN_OR_RETURN(g.dtype, DTypeOf(n["dtype"], Join(path, "dtype")));
    }
    if (n["state_bytes"]) {
      KVTIER_ASSIGN_OR_RETURN(g.state_bytes, Size(n["state_bytes"], Join(path, "state_bytes")));
    }
    return g;
  }

  // layout.groups: a grouped layout, which has no top-level shape. Validate()'s errors
  // ("layout.groups[1].window: ...") are said at the line of the group they name.
  Result<KvLayout> GroupedLayout(const YAML::Node& n, const std::string& path,
                                 uint32_t block_tokens) const {
    for (const char* key :
         {"preset", "num_layers", "num_kv_heads", "head_dim", "dtype", "attention"})
      if (n[key])
        return Error(n[key], Join(path, key),
                     "not with groups (a grouped layout's shape is its groups')");
    const YAML::Node& groups = n["groups"];
    const std::string gpath = Join(path, "groups");
    if (!groups.IsSequence() || groups.size() == 0)
      return Error(groups, gpath, "want a non-empty list of groups");
    KvLayout l;
    l.block_tokens = block_tokens;
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::string where = gpath + "[" + std::to_string(i) + "]";
      KVTIER_ASSIGN_OR_RETURN(KvLayoutGroup g, Group(groups[i], where));
      if (Status v = g.Validate(block_tokens, where); !v.ok()) return AtLine(groups[i], v);
      l.groups.push_back(g);
    }
    if (Status v = l.Validate(); !v.ok()) return AtLine(n, v);  // the layout-wide bounds
    return l;
  }

  Result<KvLayout> Layout(const YAML::Node& n, const std::string& path) const {
    KVTIER_RETURN_IF_ERROR(CheckKeys(n, path,
                                     {"preset", "num_layers", "num_kv_heads", "head_dim", "dtype",
                                      "block_tokens", "attention", "groups"}));
    uint32_t block_tokens = 64;
    if (n["block_tokens"]) {
      KVTIER_ASSIGN_OR_RETURN(uint64_t bt, Uint(n["block_tokens"], Join(path, "block_tokens")));
      block_tokens = static_cast<uint32_t>(bt);
    }
    if (n["groups"]) return GroupedLayout(n, path, block_tokens);
    KvLayout l;
    if (n["preset"]) {
      KVTIER_ASSIGN_OR_RETURN(std::string p, String(n["preset"], Join(path, "preset")));
      auto preset = LayoutPreset(p, block_tokens);
      if (!preset.ok()) return Error(n["preset"], Join(path, "preset"), preset.status().message());
      l = *preset;
    }
    l.block_tokens = block_tokens;
    KVTIER_RETURN_IF_ERROR(U32(n, path, "num_layers", &l.num_layers));
    KVTIER_RETURN_IF_ERROR(U32(n, path, "num_kv_heads", &l.num_kv_heads));
    KVTIER_RETURN_IF_ERROR(U32(n, path, "head_dim", &l.head_dim));
    if (n["dtype"]) {
      KVTIER_ASSIGN_OR_RETURN(l.dtype, DTypeOf(n["dtype"], Join(path, "dtype")));
    }
    if (n["attention"]) {
      KVTIER_ASSIGN_OR_RETURN(std::string a, String(n["attention"], Join(path, "attention")));
      auto ak = ParseAttentionKind(a);
      if (!ak)
        return Error(n["attention"], Join(path, "attention"),
                     "unknown attention '" + a + "' (mha, gqa, mla)");
      l.attention = *ak;
    }
    Status v = l.Validate();
    if (!v.ok()) return Error(n, path, v.message());
    return l;
  }

  // `admission:` as the rule's fields ({min_reuse: 2, min_prefix_tokens: 4096}), or one of the
  // older kind forms, mapped onto them: always (no rule), min-prefix-tokens (min_prefix_tokens),
  // after-n-hits (hits: N, default 2, is min_reuse: N).
  Result<AdmissionOptions> Admission(const YAML::Node& n, const std::string& path) const {
    static constexpr const char* kKinds = " (always, min-prefix-tokens, after-n-hits)";
    AdmissionOptions a;
    std::string kind;
    if (n.IsScalar()) {
      KVTIER_ASSIGN_OR_RETURN(kind, String(n, path));
    } else {
      KVTIER_RETURN_IF_ERROR(CheckKeys(
          n, path,
          {"kind", "min_reuse", "min_prefix_tokens", "hits", "count_reuse_after_eviction"}));
      if (n["kind"]) {
        KVTIER_ASSIGN_OR_RETURN(kind, String(n["kind"], Join(path, "kind")));
      }
    }
    const YAML::Node& at = n.IsScalar() || !n["kind"] ? n : n["kind"];
    if (!kind.empty() && kind != "always" && kind != "min-prefix-tokens" && kind != "after-n-hits")
      return Error(at, n.IsScalar() ? path : Join(path, "kind"),
                   "unknown admission '" + kind + "'" + kKinds);
    if (kind == "after-n-hits") a.min_reuse = 2;
    if (n.IsScalar()) return a;
    if (n["hits"]) {
      if (kind != "after-n-hits")
        return Error(n["hits"], Join(path, "hits"),
                     "only with kind: after-n-hits (or use min_reuse)");
      KVTIER_ASSIGN_OR_RETURN(uint64_t h, Uint(n["hits"], Join(path, "hits")));
      if (h < 1 || h > 65535) return Error(n["hits"], Join(path, "hits"), "must be in 1..65535");
      a.min_reuse = static_cast<uint32_t>(h);
    }
    if (n["min_reuse"]) {
      if (kind == "after-n-hits" || kind == "always")
        return Error(n["min_reuse"], Join(path, "min_reuse"), "not with kind: " + kind);
      KVTIER_ASSIGN_OR_RETURN(uint64_t r, Uint(n["min_reuse"], Join(path, "min_reuse")));
      if (r > 65535) return Error(n["min_reuse"], Join(path, "min_reuse"), "must be in 0..65535");
      a.min_reuse = static_cast<uint32_t>(r);
    }
    if (n["min_prefix_tokens"]) {
      if (kind == "always")
        return Error(n["min_prefix_tokens"], Join(path, "min_prefix_tokens"),
                     "not with kind: always");
      KVTIER_ASSIGN_OR_RETURN(a.min_prefix_tokens,
                              Uint(n["min_prefix_tokens"], Join(path, "min_prefix_tokens")));
    }
    if (n["count_reuse_after_eviction"]) {
      KVTIER_ASSIGN_OR_RETURN(
          a.count_reuse_after_eviction,
          Bool(n["count_reuse_after_eviction"], Join(path, "count_reuse_after_eviction")));
    }
    Status v = a.Validate();
    if (!v.ok()) return Error(n, path, std::string(v.message()));
    return a;
  }

  // A kind's params are read here, where each key's line is known, by the reader MakeTier uses
  // (config/tier_params.h), into the kind's typed struct.
  Status ReadTierParams(const YAML::Node& n, const std::string& path, TierSpec* t,
                        const KvLayout& layout) const {
    std::string key;
    Status st;
    if (IsHostArenaKind(t->kind)) {
      auto r = HostParamsOf(*t, &key);  // names the kind: host or emulated_device
      if (r.ok()) t->host = *r;
      st = r.status();
    } else if (t->kind == "disk") {
      auto r = ReadDiskTierParams(t->params, &key);
      if (r.ok()) t->disk = *r;
      st = r.status();
    } else if (t->kind == "remote") {
      auto r = ReadRemoteTierParams(t->params, &key);
      if (r.ok()) {
        t->remote = *r;
        // Checks that need the layout and capacity ("url: a cluster has only database 0").
        st = remote::RemoteTierOptionsFrom(t->name.empty() ? t->kind : t->name, layout,
                                           t->capacity_bytes, *r)
                 .status();
      } else {
        st = r.status();
      }
    } else {
      st = CheckTierSpecParams(*t, &key);
    }
    if (st.ok()) {
      if (t->host || t->disk || t->remote) t->params.clear();
      return st;
    }
    std::string msg(st.message());
    if (key.empty() && msg.starts_with("params.") && msg.find(": ") != std::string::npos)
      key = msg.substr(7, msg.find(": ") - 7);
    const std::string prefix = "params." + key + ": ";
    if (!key.empty() && msg.starts_with(prefix)) msg = msg.substr(prefix.size());
    const YAML::Node& params = n["params"];
    if (!key.empty() && params && params.IsMap() && params[key]) {
      return Error(params[key], Join(Join(path, "params"), key), msg);
    }
    return Error(params ? params : n, Join(path, key.empty() ? "params" : "params." + key), msg);
  }

  Result<TierSpec> Tier(const YAML::Node& n, const std::string& path,
                        const KvLayout& layout) const {
    KVTIER_RETURN_IF_ERROR(CheckKeys(
        n, path, {"kind", "name", "capacity", "threads", "eviction", "admission", "params"}));
    TierSpec t;
    if (!n["kind"]) return Error(n, Join(path, "kind"), "missing");
    KVTIER_ASSIGN_OR_RETURN(t.kind, String(n["kind"], Join(path, "kind")));
    if (Status s = RenamedTierKind(t.kind); !s.ok())
      return Error(n["kind"], Join(path, "kind"), std::string(s.message()));
    if (n["name"]) {
      KVTIER_ASSIGN_OR_RETURN(t.name, String(n["name"], Join(path, "name")));
    }
    if (!n["capacity"]) return Error(n, Join(path, "capacity"), "missing");
    KVTIER_ASSIGN_OR_RETURN(t.capacity_bytes, Size(n["capacity"], Join(path, "capacity")));
    if (n["threads"]) {
      KVTIER_ASSIGN_OR_RETURN(uint64_t th, Uint(n["threads"], Join(path, "threads")));
      if (th < 1 || th > 64) return Error(n["threads"], Join(path, "threads"), "must be in 1..64");
      t.threads = static_cast<int>(th);
    }
    if (n["eviction"]) {
      KVTIER_ASSIGN_OR_RETURN(t.eviction, String(n["eviction"], Join(path, "eviction")));
      auto probe = MakeEvictionPolicy(t.eviction, 1);
      if (!probe.ok())
        return Error(n["eviction"], Join(path, "eviction"), probe.status().message());
    }
    if (n["admission"]) {
      KVTIER_ASSIGN_OR_RETURN(t.admission, Admission(n["admission"], Join(path, "admission")));
    }
    if (n["params"]) {
      const YAML::Node& p = n["params"];
      if (!p.IsMap()) return Error(p, Join(path, "params"), "want a mapping");
      for (const auto& kv : p) {
        std::string key = kv.first.as<std::string>();
        KVTIER_ASSIGN_OR_RETURN(std::string value,
                                String(kv.second, Join(Join(path, "params"), key)));
        t.params[key] = value;
      }
    }
    KVTIER_RETURN_IF_ERROR(ReadTierParams(n, path, &t, layout));
    return t;
  }

  Result<CacheOptions> Options(const YAML::Node& root) const {
    // "serve" holds the daemon's keys, read by src/serve/serve_config.cc.
    KVTIER_RETURN_IF_ERROR(
        CheckKeys(root, "",
                  {"model_id", "model_revision", "layout", "tenant", "lora_id", "write_mode",
                   "verify_checksums", "promote_on_load", "write_queue_blocks", "tiers", "serve"}));
    CacheOptions o;
    if (root["model_id"]) {
      KVTIER_ASSIGN_OR_RETURN(o.model_id, String(root["model_id"], "model_id"));
    }
    if (root["model_revision"]) {
      KVTIER_ASSIGN_OR_RETURN(o.model_revision, String(root["model_revision"], "model_revision"));
    }
    if (!root["layout"]) return Error(root, "layout", "missing");
    KVTIER_ASSIGN_OR_RETURN(o.layout, Layout(root["layout"], "layout"));
    if (root["tenant"]) {
      KVTIER_ASSIGN_OR_RETURN(o.tenant, String(root["tenant"], "tenant"));
    }
    if (root["lora_id"]) {
      KVTIER_ASSIGN_OR_RETURN(o.lora_id, String(root["lora_id"], "lora_id"));
    }
    if (root["write_mode"]) {
      KVTIER_ASSIGN_OR_RETURN(std::string m, String(root["write_mode"], "write_mode"));
      if (m == "write-through")
        o.write_mode = WriteMode::kWriteThrough;
      else if (m == "write-back")
        o.write_mode = WriteMode::kWriteBack;
      else
        return Error(root["write_mode"], "write_mode",
                     "unknown mode '" + m + "' (write-through, write-back)");
    }
    if (root["verify_checksums"]) {
      KVTIER_ASSIGN_OR_RETURN(o.verify_checksums,
                              Bool(root["verify_checksums"], "verify_checksums"));
    }
    if (root["promote_on_load"]) {
      KVTIER_ASSIGN_OR_RETURN(o.promote_on_load, Bool(root["promote_on_load"], "promote_on_load"));
    }
    if (root["write_queue_blocks"]) {
      KVTIER_ASSIGN_OR_RETURN(uint64_t q, Uint(root["write_queue_blocks"], "write_queue_blocks"));
      if (q > (1u << 20))  // CacheOptions::Validate's bound, said here with the line
        return Error(root["write_queue_blocks"], "write_queue_blocks",
                     "at most 1048576 blocks (0 = synchronous writes)");
      o.write_queue_blocks = static_cast<uint32_t>(q);
    }
    const YAML::Node& tiers = root["tiers"];
    if (!tiers || !tiers.IsSequence() || tiers.size() == 0)
      return Error(root, "tiers", "want a non-empty list of tiers");
    for (size_t i = 0; i < tiers.size(); ++i) {
      KVTIER_ASSIGN_OR_RETURN(TierSpec t,
                              Tier(tiers[i], "tiers[" + std::to_string(i) + "]", o.layout));
      if (i == 0 && !t.admission.admits_all())  // CacheOptions::Validate's rule, with the line
        return Error(tiers[i]["admission"], "tiers[0].admission", kFirstTierAdmits);
      o.tiers.push_back(std::move(t));
    }
    Status v = o.Validate();
    if (!v.ok()) return Status::InvalidArgument(source_ + ": " + v.message());
    return o;
  }

 private:
  std::string source_;
};

}  // namespace

namespace {

// Loads `text` and runs read(root) on it; a YAML error in either names `source` and the line.
template <typename Read>
auto ReadYaml(std::string_view text, std::string_view source, Read read)
    -> decltype(read(YAML::Node{})) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(e.mark.line + 1) +
                                   ": not valid YAML: " + e.msg);
  }
  try {
    return read(root);
  } catch (const YAML::Exception& e) {
    return Status::InvalidArgument(std::string(source) + ":" + std::to_string(e.mark.line + 1) +
                                   ": " + e.msg);
  }
}

}  // namespace

Result<CacheOptions> ParseCacheOptionsYaml(std::string_view text, std::string_view source) {
  return ReadYaml(text, source, [&](const YAML::Node& root) {
    return Reader(std::string(source)).Options(root);
  });
}

Result<KvLayout> ParseLayoutYaml(std::string_view text, std::string_view source) {
  return ReadYaml(text, source, [&](const YAML::Node& root) {
    // The mapping itself, or a document holding it under `layout:`.
    const bool wrapped = root.IsMap() && root.size() == 1 && root["layout"];
    return Reader(std::string(source)).Layout(wrapped ? root["layout"] : root, "layout");
  });
}

Result<std::string> ReadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument(path + ": cannot open: " + std::strerror(errno));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<CacheOptions> LoadCacheOptionsFile(const std::string& path) {
  KVTIER_ASSIGN_OR_RETURN(std::string text, ReadConfigFile(path));
  return ParseCacheOptionsYaml(text, path);
}

}  // namespace kvtier
