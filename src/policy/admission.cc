#include "kvtier/policy.h"

namespace kvtier {
namespace {
// A direct-mapped table of recent offers: bounded memory; a collision forgets the older key,
// which only delays its admission.
constexpr size_t kCountSlots = size_t{1} << 16;
}  // namespace

Status AdmissionOptions::Validate() const {
  if (kind == Kind::kAfterNHits && hits < 1)
    return Status::InvalidArgument("admission.hits: must be >= 1");
  return Status::Ok();
}

std::string_view AdmissionKindName(AdmissionOptions::Kind kind) {
  switch (kind) {
    case AdmissionOptions::Kind::kAlways:
      return "always";
    case AdmissionOptions::Kind::kMinPrefixTokens:
      return "min-prefix-tokens";
    case AdmissionOptions::Kind::kAfterNHits:
      return "after-n-hits";
  }
  return "?";
}

std::optional<AdmissionOptions::Kind> ParseAdmissionKind(std::string_view name) {
  if (name == "always") return AdmissionOptions::Kind::kAlways;
  if (name == "min-prefix-tokens") return AdmissionOptions::Kind::kMinPrefixTokens;
  if (name == "after-n-hits") return AdmissionOptions::Kind::kAfterNHits;
  return std::nullopt;
}

AdmissionPolicy::AdmissionPolicy(AdmissionOptions options) : options_(options) {
  if (options_.kind == AdmissionOptions::Kind::kAfterNHits) counts_.resize(kCountSlots);
}

bool AdmissionPolicy::Admit(const BlockKey& key, uint64_t prefix_tokens) {
  switch (options_.kind) {
    case AdmissionOptions::Kind::kAlways:
      return true;
    case AdmissionOptions::Kind::kMinPrefixTokens:
      return prefix_tokens >= options_.min_prefix_tokens;
    case AdmissionOptions::Kind::kAfterNHits: {
      auto& [k, n] = counts_[(key.lo ^ key.hi) & (kCountSlots - 1)];
      if (!(k == key)) {
        k = key;
        n = 0;
      }
      return ++n >= options_.hits;
    }
  }
  return true;
}

}  // namespace kvtier
