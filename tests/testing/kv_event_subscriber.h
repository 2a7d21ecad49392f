// A test subscriber of kvtier's KV events: receives vLLM-format messages on a ZeroMQ SUB socket
// (connecting or binding) and decodes them with msgpack-cxx, and asks a replay socket.
#ifndef KVTIER_TESTS_TESTING_KV_EVENT_SUBSCRIBER_H_
#define KVTIER_TESTS_TESTING_KV_EVENT_SUBSCRIBER_H_

#include <cstdint>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace kvtier::testing {

struct WireEvent {
  std::string type;                  // "BlockStored", "BlockRemoved", "AllBlocksCleared"
  std::vector<std::string> hashes;   // block_hashes sent as bytes
  std::vector<uint64_t> int_hashes;  // block_hashes sent as ints (vLLM's int form)
  bool parent_is_int = false;        // parent_block_hash: an int (in parent_int) or bytes
  std::string parent;                // bytes; empty when nil or an int
  uint64_t parent_int = 0;
  std::vector<uint64_t> token_ids;
  std::string medium;
  uint64_t block_size = 0;
  size_t fields = 0;  // map entries
};

struct WireBatch {
  std::string topic;
  uint64_t seq = 0;
  double ts = 0;
  uint64_t dp_rank = 0;
  std::vector<WireEvent> events;
};

// Decodes a KVEventBatch payload ([ts, [event maps], dp_rank]); false when malformed.
bool DecodeBatch(const std::string& payload, WireBatch* out);

class EventSubscriber {
 public:
  // bind: binds endpoint (e.g. "tcp://127.0.0.1:*"); otherwise connects to it.
  EventSubscriber(const std::string& endpoint, bool bind, const std::string& topic = "");
  std::string endpoint() const { return endpoint_; }
  // The next message within timeout_ms; false on timeout or a malformed message.
  bool Next(WireBatch* out, int timeout_ms = 2000);

 private:
  zmq::context_t ctx_;
  zmq::socket_t sub_;
  std::string endpoint_;
};

// Asks a replay ROUTER for batches from start_seq; false on timeout. The end marker is not
// returned.
bool Replay(const std::string& endpoint, uint64_t start_seq, std::vector<WireBatch>* out,
            int timeout_ms = 2000);

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_TESTING_KV_EVENT_SUBSCRIBER_H_
