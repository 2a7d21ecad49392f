// What `kvtier serve` exports besides its socket: GET /metrics in the Prometheus text format
// (cpp-httplib) and KV events on a ZeroMQ PUB socket as msgpack shaped like vLLM's KV events
// (cppzmq, msgpack-cxx). They live in the CLI, not the library, so libkvtier's users do not
// inherit an HTTP server and ZeroMQ.
//
// Thread-safety: EventPublisher::Publish may be called from any thread (it is the Cache's
// event callback); each class runs one thread of its own.
#ifndef KVTIER_TOOLS_SERVE_EXPORT_H_
#define KVTIER_TOOLS_SERVE_EXPORT_H_

#include <functional>
#include <memory>
#include <string>

#include "kvtier/events.h"
#include "kvtier/status.h"

namespace kvtier::cli {

class MetricsServer {
 public:
  // Serves GET /metrics on addr ("HOST:PORT"; port 0 = any free one) with text().
  static Result<std::unique_ptr<MetricsServer>> Start(const std::string& addr,
                                                      std::function<std::string()> text);
  ~MetricsServer();
  int port() const;
  class Impl;

 private:
  explicit MetricsServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Publishes every KvEvent in sequence order, without gaps, as a 3-frame message
// [topic "kv-events", u64 big-endian seq, msgpack [ts, [event], null]] where event is
// ["BlockStored", [key], null, [], block_tokens, null, tier] or ["BlockRemoved", [key], tier]
// (keys as 16-byte big-endian binaries).
class EventPublisher {
 public:
  // endpoint: a ZeroMQ endpoint ("tcp://127.0.0.1:5557"; "tcp://127.0.0.1:*" binds any port).
  static Result<std::unique_ptr<EventPublisher>> Start(const std::string& endpoint,
                                                       uint32_t block_tokens,
                                                       std::vector<std::string> tier_names);
  ~EventPublisher();
  void Publish(const KvEvent& e);
  // The bound endpoint (with the real port).
  std::string endpoint() const;
  class Impl;

 private:
  explicit EventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::cli

#endif  // KVTIER_TOOLS_SERVE_EXPORT_H_
