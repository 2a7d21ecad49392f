// The log's level and format for the tools (`kvtier serve --log-level --log-json`): spdlog's
// default logger, read by people (the default pattern) or by log collectors (one JSON object
// per line).
//
// Thread-safety: call before logging starts from other threads (spdlog swaps the formatters
// of every registered logger).
#ifndef KVTIER_SRC_COMMON_LOG_FORMAT_H_
#define KVTIER_SRC_COMMON_LOG_FORMAT_H_

#include <string_view>

#include "kvtier/status.h"

namespace kvtier {

// Sets every registered logger's level ("trace", "debug", "info", "warn", "error", "critical"
// or "off"; "" keeps it) and, when json, its format: one object per line,
// {"time":"2026-12-06T02:10:40.123456Z","level":"info","logger":"kvtier","pid":N,"thread":N,
// "msg":"..."}, the message escaped as a JSON string. InvalidArgument naming a level it does
// not know (spdlog would have taken it as "off").
Status ConfigureLogging(std::string_view level, bool json);

}  // namespace kvtier

#endif  // KVTIER_SRC_COMMON_LOG_FORMAT_H_
