// kvtier.KvLayout, kvtier.KvLayoutGroup and the paged-KV copies (gather_pages, scatter_pages).
#ifndef KVTIER_PYTHON_SRC_PAGED_H_
#define KVTIER_PYTHON_SRC_PAGED_H_

#include <nanobind/nanobind.h>

namespace kvtier {

void RegisterLayout(nanobind::module_& m);
void RegisterPaged(nanobind::module_& m);

}  // namespace kvtier

#endif  // KVTIER_PYTHON_SRC_PAGED_H_
