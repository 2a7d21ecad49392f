// KvEventPublisher: a Cache's KV events on a ZeroMQ PUB socket in vLLM's wire format
// (doc/events.md). Each message is [topic, seq as 8-byte big-endian from 0 per topic, payload
// from BatchEncoder]. Events are put back in the index's order (KvEvent::seq), batched by count
// and age, and sent from the publisher's own thread, which also answers replay requests on an
// optional ROUTER socket from a buffer of the last batches.
//
// Thread-safety: Add may be called from any thread; the sockets belong to the publisher's
// thread alone. The destructor sends what is queued, then closes.
#ifndef KVTIER_EVENTS_KV_EVENT_PUBLISHER_H_
#define KVTIER_EVENTS_KV_EVENT_PUBLISHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvtier/events.h"
#include "kvtier/status.h"

namespace kvtier::events {

struct PublisherSetup {
  KvEventsOptions options;
  std::vector<std::string> media;  // resolved, one per tier
  uint32_t block_tokens = 0;
  std::string model;  // {model} when options.topic_model is empty
};

struct PublisherStats {
  uint64_t events = 0;   // handed to the encoder
  uint64_t batches = 0;  // messages sent on the PUB socket
  uint64_t dropped = 0;  // events dropped on a full queue
  uint64_t skipped = 0;  // index numbers never delivered, given up on after a second
};

// vLLM's endpoint rules, exposed for tests.
bool IsBindEndpoint(const std::string& endpoint);
// tcp: port + rank (a port of 0 or "*" stays); inproc: "_dp<rank>" appended; others unchanged.
std::string OffsetEndpoint(const std::string& endpoint, uint32_t rank);
// The topic template with {host}, {port}, {model}, {dp_rank} substituted.
std::string ExpandTopic(const std::string& tmpl, const std::string& host, const std::string& port,
                        const std::string& model, uint32_t rank);

class KvEventPublisher {
 public:
  // Opens the sockets and queues AllBlocksCleared on both topics (a fresh start: whatever a
  // router learned from an earlier run is gone). Unavailable when a socket cannot bind or
  // connect; InvalidArgument for bad options.
  static Result<std::unique_ptr<KvEventPublisher>> Start(PublisherSetup setup);
  ~KvEventPublisher();
  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues e in the order of e.seq (1, 2, ... with no gaps, as the Cache numbers them).
  void Add(const KvEvent& e);

  std::string endpoint() const;         // as bound (with the real port) or connected
  std::string replay_endpoint() const;  // as bound; empty without replay
  std::string topic() const;            // the engine-hash topic
  std::string keys_topic() const;       // the kvtier-key topic
  PublisherStats stats() const;

  class Impl;

 private:
  explicit KvEventPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvtier::events

#endif  // KVTIER_EVENTS_KV_EVENT_PUBLISHER_H_
