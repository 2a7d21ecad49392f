// Constructors of the built-in eviction policies (see MakeEvictionPolicy in kvtier/policy.h).
#ifndef KVTIER_SRC_POLICY_POLICIES_H_
#define KVTIER_SRC_POLICY_POLICIES_H_

#include <memory>

#include "kvtier/policy.h"
#include "policy/list_policy.h"

namespace kvtier {

std::unique_ptr<EvictionPolicy> MakeLruPolicy(uint64_t capacity_blocks);
std::unique_ptr<EvictionPolicy> MakeS3FifoPolicy(uint64_t capacity_blocks);
std::unique_ptr<EvictionPolicy> MakeArcPolicy(uint64_t capacity_blocks);

}  // namespace kvtier

#endif  // KVTIER_SRC_POLICY_POLICIES_H_
