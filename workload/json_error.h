// Where a JSON text stops being valid, as "line L, column C", found with nlohmann's SAX parser
// (simdjson reports only an error code). Used on the error path only.
//
// Thread-safety: reentrant.
#ifndef KVTIER_WORKLOAD_JSON_ERROR_H_
#define KVTIER_WORKLOAD_JSON_ERROR_H_

#include <string>
#include <string_view>

namespace kvtier::workload {

// "line 3, column 17: syntax error ..." for invalid JSON; "requests[2].in: integer ... does not
// fit in 64 bits" for valid JSON with such an integer (which simdjson refuses); else empty.
std::string LocateJsonError(std::string_view text);

// Line (1-based) holding byte `offset` of `text`.
size_t LineOfOffset(std::string_view text, size_t offset);

}  // namespace kvtier::workload

#endif  // KVTIER_WORKLOAD_JSON_ERROR_H_
