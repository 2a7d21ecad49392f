// MakeTier: builds a tier of a built-in kind from a TierSpec.
#include <charconv>

#include "kvtier/cache.h"
#include "tiers/disk/disk_tier.h"
#include "tiers/host/host_tier.h"
#include "tiers/metadata/metadata_tier.h"

namespace kvtier {
namespace {

// Kind-specific params that a kind does not know are an error, named.
Status CheckParams(const TierSpec& spec, std::initializer_list<std::string_view> known) {
  for (const auto& [key, value] : spec.params) {
    bool ok = false;
    for (std::string_view k : known) ok |= key == k;
    if (!ok) {
      std::string list;
      for (std::string_view k : known)
        list += std::string(list.empty() ? "" : ", ") + std::string(k);
      return Status::InvalidArgument(
          "tier '" + spec.name + "': unknown param '" + key + "'" +
          (list.empty() ? " (this kind takes none)" : " (known: " + list + ")"));
    }
  }
  return Status::Ok();
}

Result<bool> BoolParam(const TierSpec& spec, const std::string& key, bool fallback) {
  auto it = spec.params.find(key);
  if (it == spec.params.end()) return fallback;
  if (it->second == "true" || it->second == "1" || it->second == "yes") return true;
  if (it->second == "false" || it->second == "0" || it->second == "no") return false;
  return Status::InvalidArgument("tier '" + spec.name + "'.params." + key +
                                 ": want true/false, got '" + it->second + "'");
}

}  // namespace

std::vector<std::string> TierKindNames() { return {"device", "host", "metadata", "disk"}; }

Result<std::unique_ptr<Tier>> MakeTier(const TierSpec& spec, const KvLayout& layout) {
  const std::string name = spec.name.empty() ? spec.kind : spec.name;
  TierSpec named = spec;
  named.name = name;
  if (spec.kind == "host" || spec.kind == "device") {
    KVTIER_RETURN_IF_ERROR(CheckParams(named, {"prefault", "huge_pages", "pin"}));
    HostTierOptions o;
    o.name = name;
    o.kind = spec.kind == "host" ? TierKind::kHost : TierKind::kDevice;
    o.capacity_bytes = spec.capacity_bytes;
    o.threads = spec.threads;
    KVTIER_ASSIGN_OR_RETURN(o.prefault, BoolParam(named, "prefault", true));
    KVTIER_ASSIGN_OR_RETURN(o.huge_pages, BoolParam(named, "huge_pages", true));
    KVTIER_ASSIGN_OR_RETURN(o.pin, BoolParam(named, "pin", spec.kind == "host"));
    KVTIER_ASSIGN_OR_RETURN(auto tier, HostTier::Open(layout, o));
    return std::unique_ptr<Tier>(std::move(tier));
  }
  if (spec.kind == "metadata") {
    KVTIER_RETURN_IF_ERROR(CheckParams(named, {}));
    KVTIER_ASSIGN_OR_RETURN(auto tier, MetadataTier::Open(layout, name, spec.capacity_bytes));
    return std::unique_ptr<Tier>(std::move(tier));
  }
  if (spec.kind == "disk") {
    auto tier = disk::MakeDiskTier(named, layout);
    if (!tier.ok()) return tier.status().WithContext("tier '" + name + "'");
    return std::move(tier).value();
  }
  std::string known;
  for (const auto& k : TierKindNames()) known += std::string(known.empty() ? "" : ", ") + k;
  return Status::InvalidArgument("tier '" + name + "': unknown kind '" + spec.kind +
                                 "' (known: " + known + ")");
}

}  // namespace kvtier
