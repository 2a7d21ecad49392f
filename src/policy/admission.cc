#include "kvtier/policy.h"

namespace kvtier {

Status AdmissionOptions::Validate() const {
  // The index keeps reuse in 16 bits (saturating); a larger threshold could never be reached.
  if (min_reuse > 65535)
    return Status::InvalidArgument("min_reuse: must be in 0..65535, got " +
                                   std::to_string(min_reuse));
  return Status::Ok();
}

AdmissionVerdict JudgeAdmission(const AdmissionOptions& options, uint32_t reuse,
                                uint64_t prefix_tokens) {
  if (prefix_tokens < options.min_prefix_tokens) return AdmissionVerdict::kSkipPrefix;
  if (reuse < options.min_reuse) return AdmissionVerdict::kSkipReuse;
  return AdmissionVerdict::kAdmit;
}

}  // namespace kvtier
