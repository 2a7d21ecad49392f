// RespReader: a resumable reader of RESP2 replies for the pipelined data path. It parses the
// replies of commands sent in order and can land a bulk string straight in the caller's memory
// (a 48-byte value header into one buffer, the block into another), so a GET of a multi-MiB
// block is read from the socket without an intermediate copy.
//
// Usage per connection: Expect(sink) once per command sent, in order; then repeatedly read from
// the socket into ReadTarget() and Commit(n); Next() hands out complete replies in order.
// Only the reply kinds the data path needs are accepted: status (+), error (-), integer (:),
// bulk ($, including nil). Arrays, or bytes that are not RESP, are a protocol error after which
// the reader (and its connection) must be dropped.
//
// Thread-safety: not thread-safe; one connection's reader is used by one thread at a time.
// Ownership: sinks point to caller memory that must stay valid until the reply completes.
#ifndef KVTIER_TIERS_REMOTE_RESP_READER_H_
#define KVTIER_TIERS_REMOTE_RESP_READER_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "kvtier/status.h"

namespace kvtier::remote {

// Where a bulk reply's bytes go: the first head.size() bytes into head, the next body.size()
// into body, the last tail.size() into tail. Used only when the bulk is exactly that long.
struct BulkSink {
  std::span<std::byte> head;
  std::span<std::byte> body;
  std::span<std::byte> tail;
  // Called with each run of body bytes right after they land (while they are still in cache),
  // e.g. to checksum a block without a second pass over it. Optional.
  void (*on_body)(void* context, std::span<const std::byte> bytes) = nullptr;
  void* context = nullptr;
  size_t total() const { return head.size() + body.size() + tail.size(); }
  bool empty() const { return total() == 0; }
};

struct RespReply {
  enum class Type : uint8_t { kStatus, kError, kInteger, kBulk, kNil };
  Type type = Type::kNil;
  std::string text;  // status or error text; a bulk's bytes when not in the sink
  int64_t integer = 0;
  uint64_t bulk_bytes = 0;  // length of a bulk reply
  bool in_sink = false;     // the bulk's bytes were written to the sink
  bool dropped = false;     // a bulk that fit neither the sink nor max_text_bytes: discarded
};

class RespReader {
 public:
  // buffer_bytes bounds a reply line (status, error, length); max_text_bytes bounds a bulk that
  // does not go to a sink (larger ones are read and discarded, with dropped = true).
  explicit RespReader(size_t buffer_bytes = 64 * 1024, size_t max_text_bytes = 64 * 1024);

  // Declares the sink of the next reply (an empty sink: none). Call once per command sent.
  void Expect(BulkSink sink = {});

  // Memory the next socket read should fill; never empty. Straight into a sink when a long bulk
  // is being read, else the reader's own buffer.
  std::span<std::byte> ReadTarget();
  // Bytes that must still arrive for the sink region being read straight from the socket
  // (the bulk's length is known), or 0 when the next read is not such a direct read.
  size_t DirectBytesDue();

  // n bytes (<= ReadTarget().size()) were written into ReadTarget(); parses them. Corruption
  // on a protocol error (not RESP, an array, or a reply nobody Expect()ed); sticky.
  Status Commit(size_t n);

  // Copies bytes in through ReadTarget()/Commit(): for tests and the fuzzer.
  Status Feed(std::span<const std::byte> bytes);

  // Moves the oldest complete reply into *out; false when there is none.
  bool Next(RespReply* out);

  // Replies Expect()ed and not yet complete.
  size_t outstanding() const { return sinks_.size(); }
  bool failed() const { return !error_.ok(); }

 private:
  enum class State : uint8_t { kLine, kBulk, kBulkEnd };

  Status Parse();
  Status HandleLine(const char* line, size_t len);
  void CopyBulk(const std::byte* src, size_t n);
  std::span<std::byte> BulkRegion();  // the sink region the next bulk byte goes to
  // BulkRegion() when the next read goes straight into it, else empty.
  std::span<std::byte> DirectRegion();
  void Complete();
  Status Fail(std::string what);

  std::vector<std::byte> buf_;
  size_t begin_ = 0;  // parsed up to here
  size_t end_ = 0;    // filled up to here
  size_t max_text_bytes_;
  bool direct_ = false;  // the last ReadTarget() pointed into a sink

  std::deque<BulkSink> sinks_;
  std::deque<RespReply> done_;
  State state_ = State::kLine;
  RespReply cur_;
  uint64_t bulk_done_ = 0;
  Status error_;
};

}  // namespace kvtier::remote

#endif  // KVTIER_TIERS_REMOTE_RESP_READER_H_
