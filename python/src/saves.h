// kvtier.AsyncStore: the background store queue's binding (saves.cc).
#ifndef KVTIER_PYTHON_SRC_SAVES_H_
#define KVTIER_PYTHON_SRC_SAVES_H_

#include <nanobind/nanobind.h>

namespace kvtier {

void RegisterAsyncStore(nanobind::module_& m);

}  // namespace kvtier

#endif  // KVTIER_PYTHON_SRC_SAVES_H_
