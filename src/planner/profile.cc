// CostProfile validation, JSON form and the prefill fit (see include/kvtier/planner.h).
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <sstream>
#include <string>

#include "kvtier/planner.h"

namespace kvtier {
namespace {

using nlohmann::json;

bool Positive(double v) { return std::isfinite(v) && v > 0; }
bool NonNegative(double v) { return std::isfinite(v) && v >= 0; }

// Reads a number field; InvalidArgument naming source and key when missing or not a number.
Status GetNumber(const json& obj, const char* key, const std::string& where, double* out,
                 bool required = true) {
  auto it = obj.find(key);
  if (it == obj.end()) {
    if (!required) return Status::Ok();
    return Status::InvalidArgument(where + "." + key + ": missing");
  }
  if (!it->is_number()) return Status::InvalidArgument(where + "." + key + ": not a number");
  *out = it->get<double>();
  return Status::Ok();
}

Status GetString(const json& obj, const char* key, const std::string& where, std::string* out) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::Ok();
  if (!it->is_string()) return Status::InvalidArgument(where + "." + key + ": not a string");
  *out = it->get<std::string>();
  return Status::Ok();
}

}  // namespace

Status CostProfile::Validate() const {
  if (block_tokens == 0) return Status::InvalidArgument("profile: block_tokens: must be > 0");
  if (block_bytes == 0) return Status::InvalidArgument("profile: block_bytes: must be > 0");
  if (threads < 1) return Status::InvalidArgument("profile: threads: must be >= 1");
  if (!NonNegative(prefill.fixed_s)) {
    return Status::InvalidArgument("profile: prefill.fixed_s: must be >= 0");
  }
  if (!NonNegative(load_fixed_s)) {
    return Status::InvalidArgument("profile: load_fixed_s: must be >= 0");
  }
  if (!NonNegative(prefill.context_cap_tokens)) {
    return Status::InvalidArgument("profile: prefill.context_cap_tokens: must be >= 0");
  }
  if (!NonNegative(prefill.per_token_s) || !NonNegative(prefill.per_token_context_s) ||
      !(prefill.per_token_s > 0 || prefill.per_token_context_s > 0)) {
    return Status::InvalidArgument(
        "profile: prefill.per_token_s/per_token_context_s: must be >= 0 and not both 0");
  }
  for (size_t i = 0; i < tiers.size(); ++i) {
    const std::string where = "profile: tiers[" + std::to_string(i) + "]";
    if (tiers[i].name.empty()) return Status::InvalidArgument(where + ".name: must be set");
    if (!NonNegative(tiers[i].latency_s)) {
      return Status::InvalidArgument(where + ".latency_s: must be >= 0");
    }
    if (!Positive(tiers[i].bytes_per_s)) {
      return Status::InvalidArgument(where + ".bytes_per_s: must be > 0");
    }
  }
  return Status::Ok();
}

int CostProfile::FindTier(std::string_view name) const {
  for (size_t i = 0; i < tiers.size(); ++i) {
    if (tiers[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

Result<CostProfile> ParseCostProfile(std::string_view text, std::string_view source) {
  const std::string src(source);
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::InvalidArgument(src + ": not valid JSON");
  if (!j.is_object()) return Status::InvalidArgument(src + ": top level must be an object");
  CostProfile p;
  KVTIER_RETURN_IF_ERROR(GetString(j, "machine", src, &p.machine));
  KVTIER_RETURN_IF_ERROR(GetString(j, "model", src, &p.model));
  double v = 1;
  KVTIER_RETURN_IF_ERROR(GetNumber(j, "threads", src, &v, /*required=*/false));
  p.threads = static_cast<int>(v);
  KVTIER_RETURN_IF_ERROR(GetNumber(j, "block_tokens", src, &v));
  if (!(v >= 1 && v <= 1e6)) return Status::InvalidArgument(src + ".block_tokens: out of range");
  p.block_tokens = static_cast<uint32_t>(v);
  KVTIER_RETURN_IF_ERROR(GetNumber(j, "block_bytes", src, &v));
  if (!(v >= 1 && v <= 1e12)) return Status::InvalidArgument(src + ".block_bytes: out of range");
  p.block_bytes = static_cast<uint64_t>(v);
  auto pre = j.find("prefill");
  if (pre == j.end() || !pre->is_object()) {
    return Status::InvalidArgument(src + ".prefill: missing or not an object");
  }
  const std::string pw = src + ".prefill";
  KVTIER_RETURN_IF_ERROR(GetNumber(*pre, "fixed_s", pw, &p.prefill.fixed_s));
  KVTIER_RETURN_IF_ERROR(GetNumber(*pre, "per_token_s", pw, &p.prefill.per_token_s));
  KVTIER_RETURN_IF_ERROR(
      GetNumber(*pre, "per_token_context_s", pw, &p.prefill.per_token_context_s));
  KVTIER_RETURN_IF_ERROR(GetNumber(*pre, "context_cap_tokens", pw, &p.prefill.context_cap_tokens,
                                   /*required=*/false));
  KVTIER_RETURN_IF_ERROR(GetNumber(j, "load_fixed_s", src, &p.load_fixed_s, /*required=*/false));
  auto tiers = j.find("tiers");
  if (tiers != j.end()) {
    if (!tiers->is_array()) return Status::InvalidArgument(src + ".tiers: not an array");
    for (size_t i = 0; i < tiers->size(); ++i) {
      const json& t = (*tiers)[i];
      const std::string tw = src + ".tiers[" + std::to_string(i) + "]";
      if (!t.is_object()) return Status::InvalidArgument(tw + ": not an object");
      TierCost tc;
      KVTIER_RETURN_IF_ERROR(GetString(t, "name", tw, &tc.name));
      KVTIER_RETURN_IF_ERROR(GetNumber(t, "latency_s", tw, &tc.latency_s));
      KVTIER_RETURN_IF_ERROR(GetNumber(t, "bytes_per_s", tw, &tc.bytes_per_s));
      p.tiers.push_back(std::move(tc));
    }
  }
  Status st = p.Validate();
  if (!st.ok()) return st.WithContext(src);
  return p;
}

std::string CostProfileToJson(const CostProfile& p) {
  json j;
  j["version"] = 1;
  j["machine"] = p.machine;
  j["model"] = p.model;
  j["threads"] = p.threads;
  j["block_tokens"] = p.block_tokens;
  j["block_bytes"] = p.block_bytes;
  j["prefill"] = {{"fixed_s", p.prefill.fixed_s},
                  {"per_token_s", p.prefill.per_token_s},
                  {"per_token_context_s", p.prefill.per_token_context_s}};
  if (p.prefill.context_cap_tokens > 0) {
    j["prefill"]["context_cap_tokens"] = p.prefill.context_cap_tokens;
  }
  j["load_fixed_s"] = p.load_fixed_s;
  j["tiers"] = json::array();
  for (const TierCost& t : p.tiers) {
    j["tiers"].push_back(
        {{"name", t.name}, {"latency_s", t.latency_s}, {"bytes_per_s", t.bytes_per_s}});
  }
  return j.dump(2) + "\n";
}

Result<CostProfile> LoadCostProfile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return ParseCostProfile(ss.str(), path);
}

Status SaveCostProfile(const CostProfile& profile, const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return Status::Unavailable(path + ": cannot write");
  out << CostProfileToJson(profile);
  out.close();
  if (!out) return Status::Unavailable(path + ": write failed");
  return Status::Ok();
}

Result<PrefillCost> FitPrefillCost(const std::vector<PrefillSample>& samples) {
  if (samples.size() < 3) {
    return Status::InvalidArgument("prefill fit: need at least 3 samples, got " +
                                   std::to_string(samples.size()));
  }
  // Minimise sum(((f + a x1 + b x2) - y) / y)^2: normal equations of a 3x3 system.
  double m[3][4] = {};
  for (const PrefillSample& s : samples) {
    if (!Positive(s.seconds) || !NonNegative(s.tokens) || !NonNegative(s.context)) {
      return Status::InvalidArgument("prefill fit: samples need seconds > 0, tokens/context >= 0");
    }
    const double pairs = s.pairs >= 0 ? s.pairs : s.tokens * s.context + s.tokens * s.tokens / 2;
    const double row[3] = {1.0 / s.seconds, s.tokens / s.seconds, pairs / s.seconds};
    for (int r = 0; r < 3; ++r) {
      for (int c = 0; c < 3; ++c) m[r][c] += row[r] * row[c];
      m[r][3] += row[r];  // target y / y = 1
    }
  }
  for (int col = 0; col < 3; ++col) {  // Gauss-Jordan with partial pivoting
    int piv = col;
    for (int r = col + 1; r < 3; ++r) {
      if (std::fabs(m[r][col]) > std::fabs(m[piv][col])) piv = r;
    }
    if (std::fabs(m[piv][col]) < 1e-300) {
      return Status::InvalidArgument("prefill fit: samples do not determine the model");
    }
    for (int c = 0; c < 4; ++c) std::swap(m[col][c], m[piv][c]);
    for (int r = 0; r < 3; ++r) {
      if (r == col) continue;
      const double k = m[r][col] / m[col][col];
      for (int c = col; c < 4; ++c) m[r][c] -= k * m[col][c];
    }
  }
  PrefillCost cost;
  cost.fixed_s = std::max(0.0, m[0][3] / m[0][0]);
  cost.per_token_s = std::max(0.0, m[1][3] / m[1][1]);
  cost.per_token_context_s = std::max(0.0, m[2][3] / m[2][2]);
  if (!(cost.per_token_s > 0 || cost.per_token_context_s > 0)) {
    return Status::InvalidArgument("prefill fit: samples give no positive per-token cost");
  }
  return cost;
}

}  // namespace kvtier
