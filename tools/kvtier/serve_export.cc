#include "serve_export.h"

#define MSGPACK_NO_BOOST 1
#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <msgpack.hpp>
#include <mutex>
#include <thread>
#include <zmq.hpp>

namespace kvtier::cli {

class MetricsServer::Impl {
 public:
  httplib::Server http;
  std::thread thread;
  int port = 0;
};

Result<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& addr,
                                                            std::function<std::string()> text) {
  const auto colon = addr.rfind(':');
  if (colon == std::string::npos)
    return Status::InvalidArgument("metrics address '" + addr + "': want HOST:PORT");
  const std::string host = addr.substr(0, colon);
  int port = 0;
  try {
    port = std::stoi(addr.substr(colon + 1));
  } catch (...) {
    return Status::InvalidArgument("metrics address '" + addr + "': bad port");
  }
  // httplib takes the port as an int and binds it modulo 65536 (99999 became 34463).
  if (port < 0 || port > 65535)
    return Status::InvalidArgument("metrics address '" + addr + "': port out of 0..65535");
  auto impl = std::make_unique<Impl>();
  impl->http.Get("/metrics", [text](const httplib::Request&, httplib::Response& res) {
    res.set_content(text(), "text/plain; version=0.0.4");
  });
  impl->port = port == 0 ? impl->http.bind_to_any_port(host.c_str())
                         : (impl->http.bind_to_port(host.c_str(), port) ? port : -1);
  if (impl->port <= 0) return Status::Unavailable("metrics address '" + addr + "': cannot bind");
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->http.listen_after_bind(); });
  return std::unique_ptr<MetricsServer>(new MetricsServer(std::move(impl)));
}

MetricsServer::MetricsServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MetricsServer::~MetricsServer() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}
int MetricsServer::port() const { return impl_->port; }

class EventPublisher::Impl {
 public:
  zmq::context_t ctx{1};
  zmq::socket_t pub{ctx, zmq::socket_type::pub};
  std::string endpoint;
  uint32_t block_tokens = 0;
  std::vector<std::string> tiers;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, KvEvent> pending;  // by seq: callbacks may arrive out of order
  uint64_t next_seq = 1;
  bool stop = false;
  std::thread thread;

  void Send(const KvEvent& e) {
    msgpack::sbuffer buf;
    msgpack::packer<msgpack::sbuffer> pk(&buf);
    const double ts =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    pk.pack_array(3);
    pk.pack(ts);
    pk.pack_array(1);
    char key[16];
    for (int i = 0; i < 8; ++i) {
      key[i] = static_cast<char>(e.key.hi >> (56 - 8 * i));
      key[8 + i] = static_cast<char>(e.key.lo >> (56 - 8 * i));
    }
    const std::string tier =
        e.tier >= 0 && static_cast<size_t>(e.tier) < tiers.size() ? tiers[e.tier] : "?";
    if (e.type == KvEvent::Type::kStored) {
      pk.pack_array(7);
      pk.pack(std::string("BlockStored"));
      pk.pack_array(1);
      pk.pack_bin(16);
      pk.pack_bin_body(key, 16);
      pk.pack_nil();     // parent_block_hash
      pk.pack_array(0);  // token_ids: the daemon sees keys, not tokens
      pk.pack(block_tokens);
      pk.pack_nil();  // lora_id: folded into the key's namespace
      pk.pack(tier);  // medium
    } else {
      pk.pack_array(3);
      pk.pack(std::string("BlockRemoved"));
      pk.pack_array(1);
      pk.pack_bin(16);
      pk.pack_bin_body(key, 16);
      pk.pack(tier);
    }
    pk.pack_nil();  // data_parallel_rank
    char seq[8];
    for (int i = 0; i < 8; ++i) seq[i] = static_cast<char>(e.seq >> (56 - 8 * i));
    pub.send(zmq::buffer(std::string_view("kv-events")), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(seq, 8), zmq::send_flags::sndmore);
    pub.send(zmq::buffer(buf.data(), buf.size()), zmq::send_flags::none);
  }

  void Run() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv.wait(lk, [&] { return stop || (!pending.empty() && pending.begin()->first == next_seq); });
      if (stop && (pending.empty() || pending.begin()->first != next_seq)) return;
      KvEvent e = pending.begin()->second;
      pending.erase(pending.begin());
      ++next_seq;
      lk.unlock();
      Send(e);
      lk.lock();
    }
  }
};

Result<std::unique_ptr<EventPublisher>> EventPublisher::Start(const std::string& endpoint,
                                                              uint32_t block_tokens,
                                                              std::vector<std::string> tiers) {
  auto impl = std::make_unique<Impl>();
  impl->block_tokens = block_tokens;
  impl->tiers = std::move(tiers);
  try {
    impl->pub.set(zmq::sockopt::sndhwm, 1000000);  // a slow subscriber loses nothing soon
    impl->pub.bind(endpoint);
    impl->endpoint = impl->pub.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("events address '" + endpoint + "': " + e.what());
  }
  Impl* raw = impl.get();
  impl->thread = std::thread([raw] { raw->Run(); });
  return std::unique_ptr<EventPublisher>(new EventPublisher(std::move(impl)));
}

EventPublisher::EventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EventPublisher::~EventPublisher() {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
  impl_->pub.set(zmq::sockopt::linger, 0);
}

void EventPublisher::Publish(const KvEvent& e) {
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->pending.emplace(e.seq, e);
  }
  impl_->cv.notify_one();
}

std::string EventPublisher::endpoint() const { return impl_->endpoint; }

}  // namespace kvtier::cli
