// MakeEvictionPolicy: the registry of eviction policies by name.
#include "policy/policies.h"

namespace kvtier {
namespace {

struct PolicyEntry {
  const char* name;
  std::unique_ptr<EvictionPolicy> (*make)(uint64_t capacity_blocks);
};

// Add new policies here.
constexpr PolicyEntry kPolicies[] = {
    {"lru", &MakeLruPolicy},
    {"s3fifo", &MakeS3FifoPolicy},
    {"arc", &MakeArcPolicy},
};

}  // namespace

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name,
                                                           uint64_t capacity_blocks) {
  for (const PolicyEntry& e : kPolicies)
    if (name == e.name) return e.make(capacity_blocks);
  std::string known;
  for (const PolicyEntry& e : kPolicies) known += std::string(known.empty() ? "" : ", ") + e.name;
  return Status::InvalidArgument("unknown eviction policy '" + std::string(name) +
                                 "' (known: " + known + ")");
}

std::vector<std::string> EvictionPolicyNames() {
  std::vector<std::string> out;
  for (const PolicyEntry& e : kPolicies) out.emplace_back(e.name);
  return out;
}

}  // namespace kvtier
