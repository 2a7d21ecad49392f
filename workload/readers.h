// Trace readers: AgentX/WEKA session JSON (one object per file, sub-agents nested) and the
// Mooncake JSONL conversation log; format detection and loading of files and folders.
//
// Errors are InvalidArgument with one message that names the source and where: the line (and
// column) for a JSON syntax error or a JSONL record, the request path ("requests[12]" or
// "requests[3].requests[5]" inside a sub-agent) for a field that is missing, has the wrong type,
// is negative, or whose hash_ids do not match its length.
//
// Thread-safety: the functions are reentrant.
#ifndef KVTIER_WORKLOAD_READERS_H_
#define KVTIER_WORKLOAD_READERS_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/status.h"
#include "workload/trace.h"

namespace kvtier::workload {

// AgentX / WEKA: `block_size` from the file, `hash_id_scope` "local" ids salted with the trace
// id (Namespace{model_id = id}.Root()), "global" ids share one root across files. A sub-agent
// starts at its parent's start + its t, with a fresh context. `source` names the input in errors.
Result<Trace> ParseAgentX(std::string_view json, std::string_view source);

// Mooncake: 512-token blocks (block_tokens overrides), global ids, `timestamp` in ms. Each
// record is a one-request session. `name` salts the root (one namespace per file).
Result<Trace> ParseMooncake(std::string_view jsonl, std::string_view source,
                            uint32_t block_tokens = 512);
// Same, read from a file line by line: the file is never held whole in memory.
Result<Trace> ReadMooncakeFile(const std::string& path, uint32_t block_tokens = 512);

// Detects the format from the first bytes of a file. InvalidArgument when neither fits.
Result<TraceFormat> DetectFormat(std::string_view head, std::string_view source);

// Loads files and folders (a folder: its *.json / *.jsonl files, sorted by name, not
// recursive). The format is detected per file unless `format` is given.
Result<std::vector<Trace>> LoadTraces(std::span<const std::string> paths,
                                      std::optional<TraceFormat> format = std::nullopt);

}  // namespace kvtier::workload

#endif  // KVTIER_WORKLOAD_READERS_H_
