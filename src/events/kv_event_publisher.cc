#include "events/kv_event_publisher.h"

#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/clock.h"
#include "common/mutex.h"
#include "events/kv_event_codec.h"

namespace kvtier::events {
namespace {

constexpr auto kGapTimeout = std::chrono::seconds(1);
constexpr auto kReplayPoll = std::chrono::milliseconds(10);

std::string Be64(uint64_t v) {
  std::string b(8, '\0');
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(v >> (56 - 8 * i));
  return b;
}

std::string Hostname() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

bool IsBindEndpoint(const std::string& endpoint) {
  return endpoint.find('*') != std::string::npos || endpoint.find("::") != std::string::npos ||
         endpoint.starts_with("ipc://") || endpoint.starts_with("inproc://");
}

std::string OffsetEndpoint(const std::string& endpoint, uint32_t rank) {
  if (endpoint.empty() || rank == 0) return endpoint;
  if (endpoint.starts_with("inproc://")) return endpoint + "_dp" + std::to_string(rank);
  if (!endpoint.starts_with("tcp://")) return endpoint;
  const auto colon = endpoint.rfind(':');
  const std::string port = endpoint.substr(colon + 1);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string::npos) return endpoint;
  const unsigned long p = std::stoul(port);
  if (p == 0) return endpoint;  // any port: the OS picks one per rank anyway
  return endpoint.substr(0, colon + 1) + std::to_string(p + rank);
}

std::string ExpandTopic(const std::string& tmpl, const std::string& host, const std::string& port,
                        const std::string& model, uint32_t rank) {
  const std::pair<std::string_view, std::string> fields[] = {
      {"{host}", host}, {"{port}", port}, {"{model}", model}, {"{dp_rank}", std::to_string(rank)}};
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    bool matched = false;
    for (const auto& [name, value] : fields) {
      if (tmpl.compare(i, name.size(), name) == 0) {
        out += value;
        i += name.size();
        matched = true;
        break;
      }
    }
    if (!matched) out += tmpl[i++];
  }
  return out;
}

class KvEventPublisher::Impl {
 public:
  PublisherSetup setup;
  std::string topic, keys_topic, endpoint, replay_endpoint;
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;

  Mutex mu;
  CondVar cv;
  // By index number; nullopt: dropped on a full queue (the order still advances past it).
  std::map<uint64_t, std::optional<KvEvent>> pending KVTIER_GUARDED_BY(mu);
  uint64_t next_seq KVTIER_GUARDED_BY(mu) = 1;
  MonotonicClock::time_point gap_since KVTIER_GUARDED_BY(mu);
  std::deque<KvEvent> ready KVTIER_GUARDED_BY(mu);  // in order, waiting for a batch
  MonotonicClock::time_point oldest_ready KVTIER_GUARDED_BY(mu);
  size_t queued KVTIER_GUARDED_BY(mu) = 0;  // events held in pending and ready
  bool stop KVTIER_GUARDED_BY(mu) = false;
  PublisherStats stats KVTIER_GUARDED_BY(mu);
  std::thread thread;

  // The publisher thread's own.
  uint64_t seq_topic = 0, seq_keys = 0;
  struct Sent {
    const std::string* topic;
    uint64_t seq;
    std::string payload;
  };
  std::deque<Sent> buffer;

  void Push(KvEvent e) KVTIER_REQUIRES(mu) {
    if (ready.empty()) {
      oldest_ready = MonotonicNow();
      cv.Signal();
    }
    ready.push_back(std::move(e));
    if (ready.size() >= setup.options.max_batch_events) cv.Signal();
  }

  // Moves the run of consecutive numbers from pending to ready.
  void Advance() KVTIER_REQUIRES(mu) {
    const uint64_t before = next_seq;
    while (!pending.empty() && pending.begin()->first <= next_seq) {
      auto node = pending.extract(pending.begin());
      if (node.key() == next_seq) ++next_seq;
      if (node.mapped()) Push(std::move(*node.mapped()));
    }
    if (next_seq != before) gap_since = MonotonicNow();  // a gap, if any, starts now
  }

  void Add(const KvEvent& e) {
    MutexLock lock(&mu);
    if (e.seq < next_seq) {  // after a gap was given up on: too late to keep the order
      ++stats.skipped;
      return;
    }
    if (pending.empty()) gap_since = MonotonicNow();
    if (queued >= setup.options.queue_events) {
      ++stats.dropped;
      pending.emplace(e.seq, std::nullopt);
    } else {
      ++queued;
      pending.emplace(e.seq, e);
    }
    Advance();
  }

  const std::string& Medium(int tier) const {
    static const std::string kNone;
    return tier >= 0 && static_cast<size_t>(tier) < setup.media.size() ? setup.media[tier] : kNone;
  }

  void Send(const std::string& t, uint64_t* seq, const BatchEncoder& enc) {
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    Sent s{&t, (*seq)++, enc.Finish(ts)};
    const std::string seq_bytes = Be64(s.seq);
    pub.send(zmq::buffer(t), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(s.payload), zmq::send_flags::none);
    if (replay) {
      buffer.push_back(std::move(s));
      while (buffer.size() > setup.options.replay_batches) buffer.pop_front();
    }
  }

  // Encodes events into one batch per topic and sends them; returns the batches sent.
  uint64_t SendBatch(const std::vector<KvEvent>& events) {
    const uint32_t rank = setup.options.data_parallel_rank;
    BatchEncoder by_engine(setup.block_tokens, rank, setup.options.int_hashes);
    BatchEncoder by_key(setup.block_tokens, rank);
    const bool one_topic = topic == keys_topic;
    BatchEncoder& keys = one_topic ? by_engine : by_key;
    for (const KvEvent& e : events) {
      switch (e.type) {
        case KvEvent::Type::kCleared:
          by_engine.Cleared();
          if (!one_topic) by_key.Cleared();
          if (e.resident)
            for (const KvEventBlock& b : *e.resident) {
              if (b.engine) {
                by_engine.EngineStored(b.engine.get(), Medium(b.tier));
              } else {
                keys.Stored(b.key, Medium(b.tier));
              }
            }
          break;
        case KvEvent::Type::kStored:
          if (e.engine) {
            by_engine.EngineStored(e.engine.get(), Medium(e.tier));
          } else {
            keys.Stored(e.key, Medium(e.tier));
          }
          break;
        case KvEvent::Type::kRemoved:
          if (e.engine) {
            by_engine.EngineRemoved(e.engine.get(), Medium(e.tier));
          } else {
            keys.Removed(e.key, Medium(e.tier));
          }
          break;
      }
    }
    uint64_t sent = 0;
    try {
      if (!by_engine.empty()) {
        Send(topic, &seq_topic, by_engine);
        ++sent;
      }
      if (!one_topic && !by_key.empty()) {
        Send(keys_topic, &seq_keys, by_key);
        ++sent;
      }
    } catch (const zmq::error_t&) {
      // The context is going away: nothing more can be sent.
    }
    return sent;
  }

  void ServiceReplay() {
    static const std::string kEnd = Be64(~uint64_t{0});  // -1 as 8 bytes, vLLM's END_SEQ
    for (;;) {
      std::vector<zmq::message_t> req;
      auto got = zmq::recv_multipart(*replay, std::back_inserter(req), zmq::recv_flags::dontwait);
      if (!got) return;
      if (req.size() != 3 || req[2].size() != 8) continue;  // vLLM ignores a malformed request
      uint64_t start = 0;
      for (int i = 0; i < 8; ++i) start = start << 8 | req[2].data<uint8_t>()[i];
      const std::string id = req[0].to_string();
      for (const Sent& s : buffer) {
        if (s.seq < start) continue;
        const std::string seq_bytes = Be64(s.seq);
        const std::array<zmq::const_buffer, 5> frames = {
            zmq::buffer(id), zmq::const_buffer(nullptr, 0), zmq::buffer(*s.topic),
            zmq::buffer(seq_bytes), zmq::buffer(s.payload)};
        (void)zmq::send_multipart(*replay, frames);
      }
      const std::array<zmq::const_buffer, 5> end = {
          zmq::buffer(id), zmq::const_buffer(nullptr, 0), zmq::const_buffer(nullptr, 0),
          zmq::buffer(kEnd), zmq::const_buffer(nullptr, 0)};
      (void)zmq::send_multipart(*replay, end);
    }
  }

  void Run() {
    const auto interval = std::chrono::milliseconds(setup.options.batch_interval_ms);
    const size_t max_batch = setup.options.max_batch_events;
    mu.Lock();
    for (;;) {
      const auto now = MonotonicNow();
      if (!pending.empty() && pending.begin()->first > next_seq &&
          (stop || now - gap_since >= kGapTimeout)) {
        // A number that never came (it should not happen): give up waiting for it.
        stats.skipped += pending.begin()->first - next_seq;
        next_seq = pending.begin()->first;
        Advance();
      }
      if (!ready.empty() && (stop || ready.size() >= max_batch || now >= oldest_ready + interval)) {
        const size_t n = std::min(ready.size(), max_batch);
        std::vector<KvEvent> batch(std::make_move_iterator(ready.begin()),
                                   std::make_move_iterator(ready.begin() + n));
        ready.erase(ready.begin(), ready.begin() + n);
        queued -= n;
        oldest_ready = now;
        mu.Unlock();
        const uint64_t sent = SendBatch(batch);
        mu.Lock();
        stats.events += n;
        stats.batches += sent;
        continue;
      }
      if (stop && ready.empty() && pending.empty()) break;
      if (replay) {
        mu.Unlock();
        ServiceReplay();
        mu.Lock();
      }
      auto deadline = MonotonicClock::time_point::max();
      if (!ready.empty()) deadline = oldest_ready + interval;
      if (!pending.empty()) deadline = std::min(deadline, gap_since + kGapTimeout);
      if (replay) deadline = std::min(deadline, MonotonicNow() + kReplayPoll);
      if (stop) continue;
      if (deadline == MonotonicClock::time_point::max()) {
        cv.Wait(&mu);
      } else {
        cv.WaitUntil(&mu, deadline);
      }
    }
    mu.Unlock();
  }
};

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(PublisherSetup setup) {
  KVTIER_RETURN_IF_ERROR(setup.options.Validate());
  if (!setup.options.enabled()) return Status::InvalidArgument("events.endpoint: empty");
  auto impl = std::make_unique<Impl>();
  const KvEventsOptions& o = setup.options;
  const uint32_t rank = o.data_parallel_rank;
  impl->topic = ExpandTopic(o.topic, o.topic_host.empty() ? Hostname() : o.topic_host, o.topic_port,
                            o.topic_model.empty() ? setup.model : o.topic_model, rank);
  impl->keys_topic = impl->topic + o.keys_topic_suffix;
  const std::string ep = OffsetEndpoint(o.endpoint, rank);
  const bool bind = o.socket == KvEventsOptions::Socket::kBind ||
                    (o.socket == KvEventsOptions::Socket::kAuto && IsBindEndpoint(ep));
  try {
    impl->pub.set(zmq::sockopt::sndhwm, o.send_hwm);
    impl->pub.set(zmq::sockopt::linger, 1000);  // the last batches leave on shutdown
    if (ep.find('[') != std::string::npos || ep.find("::") != std::string::npos)
      impl->pub.set(zmq::sockopt::ipv6, 1);
    if (bind) {
      impl->pub.bind(ep);
      impl->endpoint = impl->pub.get(zmq::sockopt::last_endpoint);
    } else {
      impl->pub.connect(ep);
      impl->endpoint = ep;
    }
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("events endpoint '" + ep + "' (" + (bind ? "bind" : "connect") +
                               "): " + e.what());
  }
  if (!o.replay_endpoint.empty()) {
    const std::string rep = OffsetEndpoint(o.replay_endpoint, rank);
    try {
      impl->replay.emplace(impl->ctx, zmq::socket_type::router);
      impl->replay->set(zmq::sockopt::linger, 0);
      impl->replay->bind(rep);
      impl->replay_endpoint = impl->replay->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      return Status::Unavailable("events replay endpoint '" + rep + "': " + e.what());
    }
  }
  impl->setup = std::move(setup);
  {
    MutexLock lock(&impl->mu);
    KvEvent cleared;
    cleared.type = KvEvent::Type::kCleared;
    cleared.tier = -1;
    impl->Push(std::move(cleared));
    ++impl->queued;
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] {
    // Named, so a profile (or bench serve's CPU split) tells it from the store path.
    pthread_setname_np(pthread_self(), "kvtier-events");
    raw->Run();
  });
  return std::unique_ptr<KvEventPublisher>(new KvEventPublisher(std::move(impl)));
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvEventPublisher::~KvEventPublisher() {
  {
    MutexLock lock(&impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.SignalAll();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void KvEventPublisher::Add(const KvEvent& e) { impl_->Add(e); }
std::string KvEventPublisher::endpoint() const { return impl_->endpoint; }
std::string KvEventPublisher::replay_endpoint() const { return impl_->replay_endpoint; }
std::string KvEventPublisher::topic() const { return impl_->topic; }
std::string KvEventPublisher::keys_topic() const { return impl_->keys_topic; }

PublisherStats KvEventPublisher::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->stats;
}

}  // namespace kvtier::events

namespace kvtier {

Status KvEventsOptions::Validate() const {
  if (!enabled()) return Status::Ok();
  if (max_batch_events == 0) return Status::InvalidArgument("events.max_batch_events: must be > 0");
  if (queue_events == 0) return Status::InvalidArgument("events.queue_events: must be > 0");
  if (replay_batches == 0 && !replay_endpoint.empty())
    return Status::InvalidArgument("events.replay_batches: must be > 0 with a replay endpoint");
  if (send_hwm < 0) return Status::InvalidArgument("events.send_hwm: must be >= 0");
  if (!endpoint.starts_with("tcp://") && !endpoint.starts_with("ipc://") &&
      !endpoint.starts_with("inproc://"))
    return Status::InvalidArgument("events.endpoint '" + endpoint +
                                   "': want tcp://, ipc:// or inproc://");
  return Status::Ok();
}

}  // namespace kvtier
