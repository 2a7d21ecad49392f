#include "tiers/remote/resp_reader.h"

#include <algorithm>
#include <charconv>
#include <cstring>

namespace kvtier::remote {
namespace {

// A long bulk with nothing buffered is read straight into its sink from this size on.
constexpr size_t kDirectReadMin = 4096;

}  // namespace

RespReader::RespReader(size_t buffer_bytes, size_t max_text_bytes)
    : buf_(std::max<size_t>(buffer_bytes, 64)), max_text_bytes_(max_text_bytes) {}

void RespReader::Expect(BulkSink sink) { sinks_.push_back(sink); }

Status RespReader::Fail(std::string what) {
  if (error_.ok()) error_ = Status::Corruption("RESP reply: " + what);
  return error_;
}

std::span<std::byte> RespReader::BulkRegion() {
  const BulkSink& sink = sinks_.front();
  if (bulk_done_ < sink.head.size()) return sink.head.subspan(bulk_done_);
  const uint64_t in_body = bulk_done_ - sink.head.size();
  if (in_body < sink.body.size()) return sink.body.subspan(in_body);
  return sink.tail.subspan(in_body - sink.body.size());
}

std::span<std::byte> RespReader::DirectRegion() {
  if (error_.ok() && state_ == State::kBulk && cur_.in_sink && begin_ == end_) {
    std::span<std::byte> region = BulkRegion();
    if (region.size() >= kDirectReadMin) return region;
  }
  return {};
}

std::span<std::byte> RespReader::ReadTarget() {
  std::span<std::byte> region = DirectRegion();
  direct_ = !region.empty();
  if (direct_) return region;
  if (begin_ == end_) {
    begin_ = end_ = 0;
  } else if (begin_ > 0 && buf_.size() - end_ < kDirectReadMin) {
    std::memmove(buf_.data(), buf_.data() + begin_, end_ - begin_);
    end_ -= begin_;
    begin_ = 0;
  }
  if (end_ == buf_.size()) {
    // Only reachable after a protocol error (Commit fails on an over-long line): give scratch
    // space so a caller that keeps reading does not spin on an empty target.
    begin_ = end_ = 0;
  }
  return std::span<std::byte>(buf_).subspan(end_);
}

size_t RespReader::DirectBytesDue() { return DirectRegion().size(); }

Status RespReader::Commit(size_t n) {
  if (!error_.ok()) return error_;
  if (direct_) {
    direct_ = false;
    const BulkSink& sink = sinks_.front();
    const bool in_body =
        bulk_done_ >= sink.head.size() && bulk_done_ < sink.head.size() + sink.body.size();
    if (in_body && sink.on_body != nullptr && n > 0) {
      sink.on_body(sink.context, BulkRegion().first(n));
    }
    bulk_done_ += n;
    if (bulk_done_ == cur_.bulk_bytes) state_ = State::kBulkEnd;
  } else {
    end_ += n;
  }
  return Parse();
}

Status RespReader::Feed(std::span<const std::byte> bytes) {
  while (!bytes.empty()) {
    std::span<std::byte> target = ReadTarget();
    size_t n = std::min(target.size(), bytes.size());
    std::memcpy(target.data(), bytes.data(), n);
    bytes = bytes.subspan(n);
    KVTIER_RETURN_IF_ERROR(Commit(n));
  }
  return Status::Ok();
}

bool RespReader::Next(RespReply* out) {
  if (done_.empty()) return false;
  *out = std::move(done_.front());
  done_.pop_front();
  return true;
}

void RespReader::CopyBulk(const std::byte* src, size_t n) {
  if (cur_.in_sink) {
    const BulkSink& sink = sinks_.front();
    while (n > 0) {
      const bool in_body =
          bulk_done_ >= sink.head.size() && bulk_done_ < sink.head.size() + sink.body.size();
      std::span<std::byte> region = BulkRegion();
      size_t take = std::min(n, region.size());
      std::memcpy(region.data(), src, take);
      if (in_body && sink.on_body != nullptr) sink.on_body(sink.context, region.first(take));
      src += take;
      n -= take;
      bulk_done_ += take;
    }
    return;
  }
  if (!cur_.dropped) std::memcpy(cur_.text.data() + bulk_done_, src, n);
  bulk_done_ += n;
}

void RespReader::Complete() {
  done_.push_back(std::move(cur_));
  sinks_.pop_front();
  cur_ = RespReply();
  bulk_done_ = 0;
  state_ = State::kLine;
}

Status RespReader::HandleLine(const char* line, size_t len) {
  if (sinks_.empty()) return Fail("a reply arrived that no command asked for");
  if (len == 0) return Fail("empty line");
  std::string_view rest(line + 1, len - 1);
  auto parse_int = [&](int64_t* v) {
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), *v);
    return ec == std::errc() && p == rest.data() + rest.size() && !rest.empty();
  };
  switch (line[0]) {
    case '+':
      cur_.type = RespReply::Type::kStatus;
      cur_.text.assign(rest);
      Complete();
      return Status::Ok();
    case '-':
      cur_.type = RespReply::Type::kError;
      cur_.text.assign(rest);
      Complete();
      return Status::Ok();
    case ':':
      cur_.type = RespReply::Type::kInteger;
      if (!parse_int(&cur_.integer)) return Fail("bad integer '" + std::string(rest) + "'");
      Complete();
      return Status::Ok();
    case '$': {
      int64_t n = 0;
      if (!parse_int(&n) || n < -1) return Fail("bad bulk length '" + std::string(rest) + "'");
      if (n == -1) {
        cur_.type = RespReply::Type::kNil;
        Complete();
        return Status::Ok();
      }
      cur_.type = RespReply::Type::kBulk;
      cur_.bulk_bytes = static_cast<uint64_t>(n);
      const BulkSink& sink = sinks_.front();
      if (!sink.empty() && sink.total() == cur_.bulk_bytes) {
        cur_.in_sink = true;
      } else if (cur_.bulk_bytes <= max_text_bytes_) {
        cur_.text.resize(cur_.bulk_bytes);
      } else {
        cur_.dropped = true;
      }
      bulk_done_ = 0;
      state_ = cur_.bulk_bytes == 0 ? State::kBulkEnd : State::kBulk;
      return Status::Ok();
    }
    case '*':
      return Fail("unexpected array reply");
    default:
      return Fail("unknown reply type byte " + std::to_string(static_cast<unsigned char>(line[0])));
  }
}

Status RespReader::Parse() {
  while (true) {
    switch (state_) {
      case State::kLine: {
        const char* base = reinterpret_cast<const char*>(buf_.data());
        const void* lf = std::memchr(base + begin_, '\n', end_ - begin_);
        if (lf == nullptr) {
          if (end_ - begin_ >= buf_.size()) return Fail("line longer than the read buffer");
          return Status::Ok();
        }
        size_t lf_at = static_cast<const char*>(lf) - base;
        if (lf_at == begin_ || base[lf_at - 1] != '\r') return Fail("line not ended by CRLF");
        size_t start = begin_;
        begin_ = lf_at + 1;
        KVTIER_RETURN_IF_ERROR(HandleLine(base + start, lf_at - 1 - start));
        break;
      }
      case State::kBulk: {
        size_t avail = end_ - begin_;
        if (avail == 0) return Status::Ok();
        size_t take = static_cast<size_t>(std::min<uint64_t>(avail, cur_.bulk_bytes - bulk_done_));
        CopyBulk(buf_.data() + begin_, take);
        begin_ += take;
        if (bulk_done_ < cur_.bulk_bytes) return Status::Ok();
        state_ = State::kBulkEnd;
        break;
      }
      case State::kBulkEnd: {
        if (end_ - begin_ < 2) return Status::Ok();
        if (buf_[begin_] != std::byte{'\r'} || buf_[begin_ + 1] != std::byte{'\n'}) {
          return Fail("bulk string not ended by CRLF");
        }
        begin_ += 2;
        Complete();
        break;
      }
    }
  }
}

}  // namespace kvtier::remote
