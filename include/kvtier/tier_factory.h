// Tier factory: builds a tier of a built-in kind from a TierSpec, the form a config's `tiers:`
// entry takes. Cache::Open calls MakeTier for every spec without an instance; an engine may
// call it too, to build a tier it shares between caches (TierSpec::instance).
//
// Thread-safety: pure functions; a tier made here is thread-safe (see tier.h).
// Ownership: the caller owns the tier MakeTier returns.
#ifndef KVTIER_TIER_FACTORY_H_
#define KVTIER_TIER_FACTORY_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/layout.h"
#include "kvtier/policy.h"
#include "kvtier/status.h"
#include "kvtier/tier.h"
#include "kvtier/tier_options.h"

namespace kvtier {

struct TierSpec {
  std::string kind;  // one of TierKindNames(): "emulated_device", "host", "disk", "remote"
  std::string name;  // defaults to kind
  uint64_t capacity_bytes = 0;   // required, > 0, at least one block
  int threads = 1;               // copy threads for host/emulated_device tiers (1..64)
  std::string eviction = "lru";  // for cache-managed tiers: see EvictionPolicyNames()
  AdmissionOptions admission;
  std::map<std::string, std::string> params;  // kind-specific settings (path, url, ...)
  // The same settings typed (tier_options.h): at most the one of kind, and not with params.
  std::optional<HostTierParams> host;  // kind host or emulated_device
  std::optional<DiskTierParams> disk;
  std::optional<RemoteTierParams> remote;
  std::shared_ptr<Tier> instance;  // a pre-built tier; kind is then ignored
};

// Makes a tier from a spec (the built-in kinds). InvalidArgument for an unknown kind or a bad
// param, naming it.
Result<std::unique_ptr<Tier>> MakeTier(const TierSpec& spec, const KvLayout& layout);

// The spec kinds MakeTier builds, in the order the docs list them.
std::vector<std::string> TierKindNames();
// The TierKind of a spec kind (the inverse of TierKindName); nullopt for an unknown name.
std::optional<TierKind> TierKindFromName(std::string_view name);
// OK for every kind but a retired name: InvalidArgument for "device", saying to use
// "emulated_device" (what that tier always was: host memory standing in for HBM).
Status RenamedTierKind(std::string_view kind);

}  // namespace kvtier

#endif  // KVTIER_TIER_FACTORY_H_
