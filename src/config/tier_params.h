// The one reader of tier parameters: a table per kind (key, type, range or choices) turns a
// params map into HostTierParams / DiskTierParams / RemoteTierParams and checks a typed struct
// by the same table, for MakeTier, the YAML reader and the daemon alike.
//
// Errors are InvalidArgument "params.KEY: why"; when bad_key is given it receives KEY (empty
// when no single key is at fault), so the YAML reader can name the key's line.
//
// Thread-safety: pure functions.
#ifndef KVTIER_SRC_CONFIG_TIER_PARAMS_H_
#define KVTIER_SRC_CONFIG_TIER_PARAMS_H_

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "kvtier/tier_factory.h"
#include "kvtier/tier_options.h"

namespace kvtier {

using ParamMap = std::map<std::string, std::string>;

// The config's one boolean vocabulary, for every bool key of the YAML and of params:
// true|yes|on|1, false|no|off|0; nullopt for anything else.
std::optional<bool> ParseBoolWord(std::string_view word);

Result<HostTierParams> ReadHostTierParams(const ParamMap& params, std::string* bad_key = nullptr);
Result<DiskTierParams> ReadDiskTierParams(const ParamMap& params, std::string* bad_key = nullptr);
Result<RemoteTierParams> ReadRemoteTierParams(const ParamMap& params,
                                              std::string* bad_key = nullptr);

// The kinds a host arena serves (HostTier): "host" and "emulated_device".
inline bool IsHostArenaKind(std::string_view kind) {
  return kind == "host" || kind == "emulated_device";
}

// A spec's params for its kind: the typed struct (checked) or the params map (read). Refuses
// both at once, and a typed struct of another kind.
Result<HostTierParams> HostParamsOf(const TierSpec& spec, std::string* bad_key = nullptr);
Result<DiskTierParams> DiskParamsOf(const TierSpec& spec, std::string* bad_key = nullptr);
Result<RemoteTierParams> RemoteParamsOf(const TierSpec& spec, std::string* bad_key = nullptr);

// Checks the params of any kind (a kind without params takes none), as MakeTier would.
Status CheckTierSpecParams(const TierSpec& spec, std::string* bad_key = nullptr);

}  // namespace kvtier

#endif  // KVTIER_SRC_CONFIG_TIER_PARAMS_H_
