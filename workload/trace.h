// Trace: the request log of one source file (an AgentX/WEKA session with its sub-agents, or the
// Mooncake conversation log), and RequestStream: requests of many traces in replay order.
//
// A trace is a set of sessions. A session is a sequence of model calls that grow one context; an
// AgentX sub-agent is its own session (fresh context) whose parent is the session that spawned
// it. Each request names its prompt as block ids (one per block_tokens tokens); ids mean the same
// content only after the same ids before them, so the replay chains them into BlockKeys from the
// trace's namespace root (ChainKeyFromId in kvtier/block_key.h).
//
// Replay order (doc/replay.md): by absolute start time, ties by file order, then by the order the
// requests appear in their file.
//
// Thread-safety: Trace is a value; a RequestStream is not thread-safe. Ownership: the ids span of
// a ReplayRequest stays valid until the next call to Next() on the stream that produced it.
#ifndef KVTIER_WORKLOAD_TRACE_H_
#define KVTIER_WORKLOAD_TRACE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::workload {

enum class TraceFormat : uint8_t { kAgentX, kMooncake, kSynthetic };
std::string_view TraceFormatName(TraceFormat format);
// "agentx" (also "weka"), "mooncake"; nullopt otherwise.
std::optional<TraceFormat> ParseTraceFormat(std::string_view name);

// Why the model stopped: a tool call comes back fast, an end of turn waits on a person.
enum class StopKind : uint8_t { kUnknown, kToolUse, kEndTurn, kOther };

struct TraceRequest {
  double start_s = 0;   // absolute: session start + the request's own t
  double think_s = -1;  // client wait before it was sent; < 0 = not recorded
  double api_s = -1;    // server time recorded in the trace; < 0 = not recorded
  uint32_t prompt_tokens = 0;
  uint32_t output_tokens = 0;
  uint32_t ids_begin = 0;  // into Trace::ids
  uint32_t ids_count = 0;
  uint32_t order = 0;  // position in file order (sub-agent requests where they appear)
  StopKind stop = StopKind::kUnknown;
};

struct TraceSession {
  std::string name;     // "trace_0274" or "trace_0274/agent_001"
  int32_t parent = -1;  // index into Trace::sessions; -1 = a top-level session
  double start_s = 0;
  std::vector<TraceRequest> requests;
};

struct Trace {
  std::string name;  // the file's id, or its file name
  std::string path;
  TraceFormat format = TraceFormat::kAgentX;
  uint32_t block_tokens = 64;
  BlockKey root;  // namespace root of this trace's ids
  std::vector<uint64_t> ids;
  std::vector<TraceSession> sessions;

  std::span<const uint64_t> IdsOf(const TraceRequest& r) const {
    return {ids.data() + r.ids_begin, r.ids_count};
  }
  uint64_t num_requests() const;
  uint64_t prompt_tokens() const;
};

// One request as the replay sees it.
struct ReplayRequest {
  uint64_t session = 0;         // unique across the stream, >= 1
  uint64_t parent_session = 0;  // 0 = top-level
  uint32_t trace = 0;           // index of the source (file order)
  double start_s = 0;
  double think_s = -1;
  double api_s = -1;
  uint32_t prompt_tokens = 0;
  uint32_t output_tokens = 0;
  uint32_t block_tokens = 64;
  BlockKey root;
  std::span<const uint64_t> ids;
  bool session_first = false;  // the session's first request
  bool session_last = false;   // the session's last request: it finishes after this one
  StopKind stop = StopKind::kUnknown;
};

class RequestStream {
 public:
  virtual ~RequestStream() = default;
  // Fills *out with the next request; false at the end or on error (see status()).
  virtual bool Next(ReplayRequest* out) = 0;
  virtual Status status() const { return Status::Ok(); }
  // Fraction done in [0, 1], for progress lines.
  virtual double progress() const = 0;
  // Starts again from the first request (a stream is replayable).
  virtual void Rewind() = 0;
};

// Streams the requests of `traces` in replay order. `traces` must outlive the stream.
std::unique_ptr<RequestStream> StreamTraces(std::span<const Trace> traces);

// Sessions and totals of a stream, for reports and for the live-context capacity unit.
struct WorkloadStats {
  uint64_t requests = 0;
  uint64_t sessions = 0;
  uint64_t prompt_tokens = 0;
  uint64_t output_tokens = 0;
  uint64_t blocks = 0;
  // Live context of the active sessions (started, not finished: the sum of each one's latest
  // prompt), taken at every request: its peak and its mean over requests.
  uint64_t live_context_peak_tokens = 0;
  double live_context_mean_tokens = 0;
};
// Reads the whole stream once (then rewinds it).
Result<WorkloadStats> ComputeStats(RequestStream& stream);

// A stream materialized in memory (for Belady's MIN, which needs the future).
struct MaterializedRequests {
  std::vector<ReplayRequest> requests;  // ids point into `ids`
  std::vector<uint64_t> ids;
};
// Fails with ResourceExhausted when the stream holds more than max_blocks block ids.
Result<MaterializedRequests> Materialize(RequestStream& stream, uint64_t max_blocks);
std::unique_ptr<RequestStream> StreamMaterialized(const MaterializedRequests& m);

// Collects a stream (e.g. a synthetic one) into one Trace whose sessions keep their parents,
// start times and think times, for the timed replay. ResourceExhausted beyond max_blocks ids.
Result<Trace> StreamToTrace(RequestStream& stream, std::string name, uint64_t max_blocks);

}  // namespace kvtier::workload

#endif  // KVTIER_WORKLOAD_TRACE_H_
