// The planner's binding: kvtier.Planner over a cost profile (the library's Planner, the same
// cost model as `kvtier plan` and the timed replay) and kvtier.fit_prefill.
#ifndef KVTIER_PYTHON_SRC_PLANNER_H_
#define KVTIER_PYTHON_SRC_PLANNER_H_

#include <nanobind/nanobind.h>

#include "kvtier/status.h"

namespace kvtier {

// Raises the kvtier.<Code> exception of a non-OK status (module.cc).
[[noreturn]] void RaiseStatus(const Status& s);
void RegisterPlanner(nanobind::module_& m);

}  // namespace kvtier

#endif  // KVTIER_PYTHON_SRC_PLANNER_H_
