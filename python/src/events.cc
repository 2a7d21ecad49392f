// kvtier.EventsOptions and kvtier.EngineBlockHashes (see events.h and doc/python.md).
#include "events.h"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace nb = nanobind;
using namespace nb::literals;

namespace kvtier {
namespace {

std::string Bytes(const nb::bytes& b) { return std::string(b.c_str(), b.size()); }

std::string SocketName(KvEventsOptions::Socket s) {
  switch (s) {
    case KvEventsOptions::Socket::kBind:
      return "bind";
    case KvEventsOptions::Socket::kConnect:
      return "connect";
    case KvEventsOptions::Socket::kAuto:
      break;
  }
  return "auto";
}

}  // namespace

nb::dict EventsInfoDict(const KvEventsInfo& i) {
  nb::dict d;
  d["endpoint"] = i.endpoint;
  d["replay_endpoint"] = i.replay_endpoint;
  d["topic"] = i.topic;
  d["keys_topic"] = i.keys_topic;
  d["events"] = i.events;
  d["batches"] = i.batches;
  d["dropped"] = i.dropped;
  d["engine_hash_blocks"] = i.engine_hash_blocks;
  d["engine_hashes_dropped"] = i.engine_hashes_dropped;
  return d;
}

void RegisterEvents(nb::module_& m) {
  nb::class_<KvEventsOptions>(m, "EventsOptions",
                              "A Cache's KV-event publisher in vLLM's format (doc/events.md); "
                              "off while endpoint is empty.")
      .def(nb::init<>())
      .def_rw("endpoint", &KvEventsOptions::endpoint)
      .def_prop_rw(
          "socket", [](const KvEventsOptions& o) { return SocketName(o.socket); },
          [](KvEventsOptions& o, const std::string& s) {
            if (s == "auto") {
              o.socket = KvEventsOptions::Socket::kAuto;
            } else if (s == "bind") {
              o.socket = KvEventsOptions::Socket::kBind;
            } else if (s == "connect") {
              o.socket = KvEventsOptions::Socket::kConnect;
            } else {
              throw nb::value_error(
                  ("events socket '" + s + "': want auto, bind or connect").c_str());
            }
          })
      .def_rw("replay_endpoint", &KvEventsOptions::replay_endpoint)
      .def_rw("replay_batches", &KvEventsOptions::replay_batches)
      .def_rw("data_parallel_rank", &KvEventsOptions::data_parallel_rank)
      .def_rw("topic", &KvEventsOptions::topic)
      .def_rw("keys_topic_suffix", &KvEventsOptions::keys_topic_suffix)
      .def_rw("topic_host", &KvEventsOptions::topic_host)
      .def_rw("topic_port", &KvEventsOptions::topic_port)
      .def_rw("topic_model", &KvEventsOptions::topic_model)
      .def_rw("max_batch_events", &KvEventsOptions::max_batch_events)
      .def_rw("batch_interval_ms", &KvEventsOptions::batch_interval_ms)
      .def_rw("queue_events", &KvEventsOptions::queue_events)
      .def_rw("media", &KvEventsOptions::media)
      .def_rw("int_hashes", &KvEventsOptions::int_hashes)
      .def_rw("engine_hash_blocks", &KvEventsOptions::engine_hash_blocks);

  nb::class_<EngineBlockHashes>(
      m, "EngineBlockHashes",
      "The engine's own hashes of the engine blocks inside one kvtier block (vLLM: "
      "request.block_hashes), announced in KV events instead of kvtier's key.")
      .def(
          "__init__",
          [](EngineBlockHashes* e, const std::vector<nb::bytes>& hashes, const nb::bytes& parent,
             std::vector<uint32_t> token_ids, std::string lora_name) {
            new (e) EngineBlockHashes{};
            for (const nb::bytes& h : hashes) e->hashes.push_back(Bytes(h));
            e->parent_hash = Bytes(parent);
            e->token_ids = std::move(token_ids);
            e->lora_name = std::move(lora_name);
          },
          "hashes"_a, "parent_hash"_a = nb::bytes(""), "token_ids"_a = std::vector<uint32_t>{},
          "lora_name"_a = "")
      .def_prop_ro("hashes",
                   [](const EngineBlockHashes& e) {
                     nb::list out;
                     for (const std::string& h : e.hashes)
                       out.append(nb::bytes(h.data(), h.size()));
                     return out;
                   })
      .def_prop_ro("parent_hash",
                   [](const EngineBlockHashes& e) {
                     return nb::bytes(e.parent_hash.data(), e.parent_hash.size());
                   })
      .def_ro("token_ids", &EngineBlockHashes::token_ids)
      .def_ro("lora_name", &EngineBlockHashes::lora_name);
}

}  // namespace kvtier
