// MakeTier: builds a tier of a built-in kind from a TierSpec.
#include "kvtier/tier_factory.h"

#include "config/tier_params.h"
#include "tiers/disk/disk_tier.h"
#include "tiers/host/host_tier.h"
#include "tiers/remote/remote_tier.h"

namespace kvtier {

std::vector<std::string> TierKindNames() { return {"emulated_device", "host", "disk", "remote"}; }

Status RenamedTierKind(std::string_view kind) {
  if (kind != "device") return Status::Ok();
  return Status::InvalidArgument(
      "kind 'device' is now 'emulated_device' (a host-memory stand-in for a device tier); use "
      "kind: emulated_device");
}

std::optional<TierKind> TierKindFromName(std::string_view name) {
  for (int k = 0; k < kNumTierKinds; ++k)
    if (TierKindName(static_cast<TierKind>(k)) == name) return static_cast<TierKind>(k);
  return std::nullopt;
}

Result<std::unique_ptr<Tier>> MakeTier(const TierSpec& spec, const KvLayout& layout) {
  const std::string name = spec.name.empty() ? spec.kind : spec.name;
  TierSpec named = spec;
  named.name = name;
  // Every kind's params go through the one reader (config/tier_params.h) first.
  if (Status s = CheckTierSpecParams(named); !s.ok()) return s.WithContext("tier '" + name + "'");
  if (Status s = RenamedTierKind(spec.kind); !s.ok()) return s.WithContext("tier '" + name + "'");
  if (IsHostArenaKind(spec.kind)) {
    KVTIER_ASSIGN_OR_RETURN(HostTierParams p, HostParamsOf(named));
    HostTierOptions o;
    o.name = name;
    o.kind = *TierKindFromName(spec.kind);
    o.capacity_bytes = spec.capacity_bytes;
    o.threads = spec.threads;
    o.prefault = p.prefault;
    o.prefault_background = p.prefault_background;
    o.huge_pages = p.huge_pages;
    o.warm_ahead = p.warm_ahead;
    o.pin = p.pin.value_or(spec.kind == "host");
    KVTIER_ASSIGN_OR_RETURN(auto tier, HostTier::Open(layout, o));
    return std::unique_ptr<Tier>(std::move(tier));
  }
  if (spec.kind == "disk") {
    auto tier = disk::MakeDiskTier(named, layout);
    if (!tier.ok()) return tier.status().WithContext("tier '" + name + "'");
    return std::move(tier).value();
  }
  if (spec.kind == "remote") {
    KVTIER_ASSIGN_OR_RETURN(RemoteTierParams p, RemoteParamsOf(named));
    auto o = remote::RemoteTierOptionsFrom(name, layout, spec.capacity_bytes, p);
    if (!o.ok()) return o.status().WithContext("tier '" + name + "'");
    KVTIER_ASSIGN_OR_RETURN(auto tier, remote::RemoteTier::Open(std::move(o).value()));
    return std::unique_ptr<Tier>(std::move(tier));
  }
  std::string known;
  for (const auto& k : TierKindNames()) known += std::string(known.empty() ? "" : ", ") + k;
  return Status::InvalidArgument("tier '" + name + "': unknown kind '" + spec.kind +
                                 "' (known: " + known + ")");
}

}  // namespace kvtier
