#include "sim/profiles.h"

#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace kvtier::sim {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool Exists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

Result<std::string> Resolve(std::string_view name_or_path, std::string_view kind,
                            std::string_view extra_dir) {
  std::string s(name_or_path);
  if (s.ends_with(".json") || s.find('/') != std::string::npos) {
    if (Exists(s)) return s;
    return Status::InvalidArgument(s + ": no such profile file");
  }
  const std::string file = Lower(s) + ".json";
  std::vector<std::string> dirs;
  if (!extra_dir.empty()) dirs.push_back(std::string(extra_dir) + "/" + std::string(kind));
  dirs.push_back(BuiltinProfilesDir() + "/" + std::string(kind));
  for (const auto& d : dirs) {
    if (Exists(d + "/" + file)) return d + "/" + file;
  }
  std::string known;
  for (const auto& n : ProfileNames(kind)) known += (known.empty() ? "" : ", ") + n;
  return Status::InvalidArgument("unknown " + std::string(kind == "gpus" ? "GPU" : "model") +
                                 " profile '" + s + "' (known: " + known + ")");
}

Result<std::string> ReadAll(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::InvalidArgument(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<nlohmann::json> ParseObject(std::string_view json, std::string_view source) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument(std::string(source) + ": not a JSON object");
  }
  return j;
}

// "sources": an object of field name -> text.
Status Sources(const nlohmann::json& j, std::string_view source,
               std::map<std::string, std::string>* out) {
  auto it = j.find("sources");
  if (it == j.end()) return Status::Ok();
  if (!it->is_object()) {
    return Status::InvalidArgument(std::string(source) + ": 'sources' must be an object");
  }
  for (auto kv = it->begin(); kv != it->end(); ++kv) {
    if (!kv.value().is_string()) {
      return Status::InvalidArgument(std::string(source) + ": 'sources." + kv.key() +
                                     "' must be a string");
    }
    (*out)[kv.key()] = kv.value().get<std::string>();
  }
  return Status::Ok();
}

Status Number(const nlohmann::json& j, const char* key, std::string_view source, bool required,
              double* out) {
  auto it = j.find(key);
  if (it == j.end()) {
    return required ? Status::InvalidArgument(std::string(source) + ": missing '" + key + "'")
                    : Status::Ok();
  }
  if (!it->is_number()) {
    return Status::InvalidArgument(std::string(source) + ": '" + key + "' must be a number");
  }
  *out = it->get<double>();
  return Status::Ok();
}

}  // namespace

std::string BuiltinProfilesDir() {
  if (const char* env = std::getenv("KVTIER_PROFILES_DIR")) return env;
#ifdef KVTIER_PROFILES_DIR
  return KVTIER_PROFILES_DIR;
#else
  return "sim/profiles";
#endif
}

std::vector<std::string> ProfileNames(std::string_view kind) {
  std::vector<std::string> names;
  const std::string dir = BuiltinProfilesDir() + "/" + std::string(kind);
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string n = e->d_name;
      if (n.ends_with(".json")) names.push_back(n.substr(0, n.size() - 5));
    }
    closedir(d);
  }
  std::sort(names.begin(), names.end());
  return names;
}

Status GpuProfile::Validate() const {
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("GPU profile " + name + ": " + what);
  };
  if (!(hbm_gb > 0)) return bad("hbm_gb must be > 0");
  if (!(hbm_tbps > 0)) return bad("hbm_tbps must be > 0");
  if (!(bf16_tflops > 0)) return bad("bf16_tflops must be > 0");
  if (!(mfu > 0 && mfu <= 1)) return bad("mfu must be in (0, 1]");
  if (!(hbm_efficiency > 0 && hbm_efficiency <= 1)) return bad("hbm_efficiency must be in (0, 1]");
  if (!(host_link_gbps > 0)) return bad("host_link_gbps must be > 0");
  if (!(host_link_latency_us >= 0)) return bad("host_link_latency_us must be >= 0");
  if (!(attention_mfu >= 0 && attention_mfu <= 1)) return bad("attention_mfu must be in [0, 1]");
  if (!(load_fixed_ms >= 0)) return bad("load_fixed_ms must be >= 0");
  return Status::Ok();
}

Status ModelProfile::Validate() const {
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("model profile " + name + ": " + what);
  };
  if (!(params_b > 0)) return bad("params_b must be > 0");
  if (!(active_params_b > 0 && active_params_b <= params_b)) {
    return bad("active_params_b must be in (0, params_b]");
  }
  if (!(weight_bytes_per_param > 0)) return bad("weight_bytes_per_param must be > 0");
  if (layers == 0 || q_heads == 0 || head_dim == 0) return bad("layers, q_heads, head_dim > 0");
  if (kv_bytes_per_token == 0) return bad("kv_bytes_per_token must be > 0");
  if (!kv_layout.groups.empty()) {
    if (Status s = kv_layout.Validate(); !s.ok()) return bad(s.message());
  }
  if (expert_params_b > 0 &&
      !(expert_params_b < params_b && expert_bytes_per_param > 0 && dense_bytes_per_param > 0)) {
    return bad("expert_params_b needs expert_ and dense_bytes_per_param and must be < params_b");
  }
  if (KvDtypeBytes(kv_dtype) == 0) return bad("kv_dtype must be bf16, fp16 or fp8");
  if (!(spec_acceptance_length >= 1)) return bad("spec_acceptance_length must be >= 1");
  return Status::Ok();
}

double KvDtypeBytes(std::string_view dtype) {
  if (dtype == "bf16" || dtype == "fp16") return 2;
  if (dtype == "fp8") return 1;
  return 0;
}

double ModelProfile::expert_bytes() const {
  return expert_params_b > 0 ? expert_params_b * 1e9 * expert_bytes_per_param : 0;
}

double ModelProfile::dense_bytes() const {
  if (expert_params_b > 0) return (params_b - expert_params_b) * 1e9 * dense_bytes_per_param;
  return params_b * 1e9 * weight_bytes_per_param;
}

double ModelProfile::weight_bytes() const { return expert_bytes() + dense_bytes(); }

uint64_t ModelProfile::KvBytesPerToken(std::string_view dtype) const {
  if (dtype.empty()) return kv_bytes_per_token;
  if (KvDtypeBytes(dtype) == 0 || KvDtypeBytes(kv_dtype) == 0) return 0;
  const KvGroupLayout layout =
      kv_layout.groups.empty()
          ? SingleGroupLayout(static_cast<double>(kv_bytes_per_token), kv_dtype)
          : kv_layout;
  return static_cast<uint64_t>(std::llround(KvBytesPerCachedToken(layout, dtype)));
}

double ModelProfile::AttentionFlopsPerPair() const {
  return 2.0 * layers * q_heads * (head_dim + (v_head_dim ? v_head_dim : head_dim));
}

double ModelProfile::PrefillFlops(uint64_t from, uint64_t to) const {
  if (to <= from) return 0;
  const double n = static_cast<double>(to - from);
  const double weights = 2.0 * active_params_b * 1e9 * n;
  // Sum over positions p in [from, to) of p = (to - 1 + from) * n / 2.
  const double positions = (static_cast<double>(to) - 1 + static_cast<double>(from)) * n / 2;
  const double attn = AttentionFlopsPerPair() * positions;
  return weights + attn;
}

Result<GpuProfile> ParseGpuProfile(std::string_view json, std::string_view source) {
  KVTIER_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(json, source));
  GpuProfile g;
  g.name = j.value("name", std::string(source));
  KVTIER_RETURN_IF_ERROR(Number(j, "hbm_gb", source, true, &g.hbm_gb));
  KVTIER_RETURN_IF_ERROR(Number(j, "hbm_tbps", source, true, &g.hbm_tbps));
  KVTIER_RETURN_IF_ERROR(Number(j, "bf16_tflops", source, true, &g.bf16_tflops));
  KVTIER_RETURN_IF_ERROR(Number(j, "mfu", source, false, &g.mfu));
  KVTIER_RETURN_IF_ERROR(Number(j, "hbm_efficiency", source, false, &g.hbm_efficiency));
  KVTIER_RETURN_IF_ERROR(Number(j, "host_link_gbps", source, false, &g.host_link_gbps));
  KVTIER_RETURN_IF_ERROR(Number(j, "host_link_latency_us", source, false, &g.host_link_latency_us));
  KVTIER_RETURN_IF_ERROR(Number(j, "attention_mfu", source, false, &g.attention_mfu));
  KVTIER_RETURN_IF_ERROR(Number(j, "load_fixed_ms", source, false, &g.load_fixed_ms));
  KVTIER_RETURN_IF_ERROR(Sources(j, source, &g.sources));
  if (j.contains("note") && j["note"].is_string()) g.note = j["note"].get<std::string>();
  if (Status s = g.Validate(); !s.ok()) return s.WithContext(source);
  return g;
}

Result<ModelProfile> ParseModelProfile(std::string_view json, std::string_view source) {
  KVTIER_ASSIGN_OR_RETURN(nlohmann::json j, ParseObject(json, source));
  ModelProfile m;
  m.name = j.value("name", std::string(source));
  double layers = 0, q = 0, kv = 0, hd = 0, kvb = 0, vhd = 0, topk = 0;
  KVTIER_RETURN_IF_ERROR(Number(j, "params_b", source, true, &m.params_b));
  m.active_params_b = m.params_b;
  KVTIER_RETURN_IF_ERROR(Number(j, "active_params_b", source, false, &m.active_params_b));
  KVTIER_RETURN_IF_ERROR(
      Number(j, "weight_bytes_per_param", source, false, &m.weight_bytes_per_param));
  KVTIER_RETURN_IF_ERROR(Number(j, "layers", source, true, &layers));
  KVTIER_RETURN_IF_ERROR(Number(j, "q_heads", source, true, &q));
  KVTIER_RETURN_IF_ERROR(Number(j, "kv_heads", source, false, &kv));
  KVTIER_RETURN_IF_ERROR(Number(j, "head_dim", source, true, &hd));
  KVTIER_RETURN_IF_ERROR(Number(j, "kv_bytes_per_token", source, !j.contains("kv_layout"), &kvb));
  KVTIER_RETURN_IF_ERROR(Number(j, "expert_params_b", source, false, &m.expert_params_b));
  KVTIER_RETURN_IF_ERROR(
      Number(j, "expert_bytes_per_param", source, false, &m.expert_bytes_per_param));
  KVTIER_RETURN_IF_ERROR(
      Number(j, "dense_bytes_per_param", source, false, &m.dense_bytes_per_param));
  KVTIER_RETURN_IF_ERROR(Number(j, "v_head_dim", source, false, &vhd));
  KVTIER_RETURN_IF_ERROR(Number(j, "attention_topk", source, false, &topk));
  KVTIER_RETURN_IF_ERROR(
      Number(j, "spec_acceptance_length", source, false, &m.spec_acceptance_length));
  for (double v : {layers, q, kv, hd, kvb, vhd, topk}) {
    if (!(v >= 0) || v != std::floor(v) || v > 1e12) {
      return Status::InvalidArgument(std::string(source) +
                                     ": layer/head/dim/kv counts must be non-negative integers");
    }
  }
  m.layers = static_cast<uint32_t>(layers);
  m.q_heads = static_cast<uint32_t>(q);
  m.kv_heads = static_cast<uint32_t>(kv);
  m.head_dim = static_cast<uint32_t>(hd);
  m.kv_bytes_per_token = static_cast<uint64_t>(kvb);
  m.v_head_dim = static_cast<uint32_t>(vhd);
  m.attention_topk = static_cast<uint32_t>(topk);
  m.attention = j.value("attention", std::string("gqa"));
  if (auto it = j.find("kv_dtype"); it != j.end()) {
    if (!it->is_string()) {
      return Status::InvalidArgument(std::string(source) + ": 'kv_dtype' must be a string");
    }
    m.kv_dtype = it->get<std::string>();
  }
  if (auto it = j.find("kv_layout"); it != j.end()) {
    KVTIER_ASSIGN_OR_RETURN(m.kv_layout, ParseKvGroupLayout(*it, source));
    const double per_token = KvBytesPerCachedToken(m.kv_layout);
    if (kvb > 0 && std::llround(per_token) != std::llround(kvb)) {
      return Status::InvalidArgument(
          std::string(source) + ": kv_bytes_per_token " + std::to_string(std::llround(kvb)) +
          " disagrees with kv_layout's " + std::to_string(std::llround(per_token)));
    }
    m.kv_bytes_per_token = static_cast<uint64_t>(std::llround(per_token));
  } else {
    m.kv_layout = SingleGroupLayout(static_cast<double>(m.kv_bytes_per_token), m.kv_dtype);
  }
  KVTIER_RETURN_IF_ERROR(Sources(j, source, &m.sources));
  if (j.contains("note") && j["note"].is_string()) m.note = j["note"].get<std::string>();
  if (Status s = m.Validate(); !s.ok()) return s.WithContext(source);
  return m;
}

Result<GpuProfile> LoadGpuProfile(std::string_view name_or_path, std::string_view extra_dir) {
  KVTIER_ASSIGN_OR_RETURN(std::string path, Resolve(name_or_path, "gpus", extra_dir));
  KVTIER_ASSIGN_OR_RETURN(std::string text, ReadAll(path));
  return ParseGpuProfile(text, path);
}

Result<ModelProfile> LoadModelProfile(std::string_view name_or_path, std::string_view extra_dir) {
  KVTIER_ASSIGN_OR_RETURN(std::string path, Resolve(name_or_path, "models", extra_dir));
  KVTIER_ASSIGN_OR_RETURN(std::string text, ReadAll(path));
  return ParseModelProfile(text, path);
}

}  // namespace kvtier::sim
