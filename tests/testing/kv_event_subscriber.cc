#include "testing/kv_event_subscriber.h"

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>
#include <zmq_addon.hpp>

namespace kvtier::testing {
namespace {

uint64_t Be64(const zmq::message_t& m) {
  uint64_t v = 0;
  for (size_t i = 0; i < m.size() && i < 8; ++i) v = v << 8 | m.data<uint8_t>()[i];
  return v;
}

std::string AsString(const msgpack::object& o) {
  if (o.type == msgpack::type::STR) return std::string(o.via.str.ptr, o.via.str.size);
  if (o.type == msgpack::type::BIN) return std::string(o.via.bin.ptr, o.via.bin.size);
  return "";
}

}  // namespace

bool DecodeBatch(const std::string& payload, WireBatch* out) {
  try {
    msgpack::object_handle oh = msgpack::unpack(payload.data(), payload.size());
    const msgpack::object& b = oh.get();
    if (b.type != msgpack::type::ARRAY || b.via.array.size != 3) return false;
    out->ts = b.via.array.ptr[0].as<double>();
    out->dp_rank = b.via.array.ptr[2].as<uint64_t>();
    const msgpack::object& evs = b.via.array.ptr[1];
    out->events.clear();
    for (uint32_t i = 0; i < evs.via.array.size; ++i) {
      const msgpack::object& e = evs.via.array.ptr[i];
      if (e.type != msgpack::type::MAP) return false;
      WireEvent w;
      w.fields = e.via.map.size;
      for (uint32_t j = 0; j < e.via.map.size; ++j) {
        const std::string key = AsString(e.via.map.ptr[j].key);
        const msgpack::object& v = e.via.map.ptr[j].val;
        if (key == "type") w.type = AsString(v);
        if (key == "medium") w.medium = AsString(v);
        if (key == "block_size") w.block_size = v.as<uint64_t>();
        if (key == "block_hashes") {
          for (uint32_t k = 0; k < v.via.array.size; ++k) {
            const msgpack::object& h = v.via.array.ptr[k];
            if (h.type == msgpack::type::POSITIVE_INTEGER) {
              w.int_hashes.push_back(h.as<uint64_t>());
            } else {
              w.hashes.push_back(AsString(h));
            }
          }
        }
        if (key == "parent_block_hash") {
          w.parent_is_int = v.type == msgpack::type::POSITIVE_INTEGER;
          if (w.parent_is_int) {
            w.parent_int = v.as<uint64_t>();
          } else {
            w.parent = AsString(v);
          }
        }
        if (key == "token_ids")
          for (uint32_t k = 0; k < v.via.array.size; ++k)
            w.token_ids.push_back(v.via.array.ptr[k].as<uint64_t>());
      }
      out->events.push_back(std::move(w));
    }
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

EventSubscriber::EventSubscriber(const std::string& endpoint, bool bind, const std::string& topic)
    : sub_(ctx_, zmq::socket_type::sub) {
  sub_.set(zmq::sockopt::subscribe, topic);
  sub_.set(zmq::sockopt::linger, 0);
  if (bind) {
    sub_.bind(endpoint);
    endpoint_ = sub_.get(zmq::sockopt::last_endpoint);
  } else {
    sub_.connect(endpoint);
    endpoint_ = endpoint;
  }
}

bool EventSubscriber::Next(WireBatch* out, int timeout_ms) {
  sub_.set(zmq::sockopt::rcvtimeo, timeout_ms);
  std::vector<zmq::message_t> parts;
  if (!zmq::recv_multipart(sub_, std::back_inserter(parts)) || parts.size() != 3) return false;
  out->topic = parts[0].to_string();
  out->seq = Be64(parts[1]);
  return DecodeBatch(parts[2].to_string(), out);
}

bool Replay(const std::string& endpoint, uint64_t start_seq, std::vector<WireBatch>* out,
            int timeout_ms) {
  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.set(zmq::sockopt::rcvtimeo, timeout_ms);
  dealer.connect(endpoint);
  std::string seq(8, '\0');
  for (int i = 0; i < 8; ++i) seq[i] = static_cast<char>(start_seq >> (56 - 8 * i));
  dealer.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(seq), zmq::send_flags::none);
  for (;;) {
    std::vector<zmq::message_t> parts;  // "", topic, seq, payload
    if (!zmq::recv_multipart(dealer, std::back_inserter(parts)) || parts.size() != 4) return false;
    if (Be64(parts[2]) == ~uint64_t{0}) return true;  // vLLM's END_SEQ (-1)
    WireBatch b;
    b.topic = parts[1].to_string();
    b.seq = Be64(parts[2]);
    if (!DecodeBatch(parts[3].to_string(), &b)) return false;
    out->push_back(std::move(b));
  }
}

}  // namespace kvtier::testing
