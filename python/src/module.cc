// kvtier._kvtier: the Python binding of kvtier (see doc/python.md).
//
// Everything is bound against KvCache, the interface, so a daemon Client needs only its own
// constructor here. Block buffers cross as nanobind ndarrays (numpy, torch via DLPack): the
// library reads and writes the caller's memory, nothing is copied into Python objects. Every
// call that moves or hashes data releases the GIL.
//
// Errors: a non-OK Status raises kvtier.<Code> (a subclass of kvtier.KvtierError; InvalidArgument
// is also a ValueError) carrying kvtier's message; .code holds the code's name.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "arrays.h"
#include "events.h"
#include "kvtier/block_key.h"
#include "kvtier/cache.h"
#include "kvtier/client.h"
#include "kvtier/config.h"
#include "kvtier/kv_cache.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"
#include "paged.h"
#include "planner.h"
#include "saves.h"
#include "serve/serve_options.h"
#include "stats.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvtier {
namespace {

// Python exception classes by StatusCode (index = code); filled at module init.
std::array<PyObject*, 7> g_errors{};

[[noreturn]] void Raise(const Status& s) {
  PyObject* cls = g_errors[static_cast<size_t>(s.code())];
  nb::object err = nb::steal(PyObject_CallFunction(cls, "s", s.message().c_str()));
  if (!err.is_valid()) throw nb::python_error();
  nb::setattr(err, "code", nb::str(std::string(StatusCodeName(s.code())).c_str()));
  PyErr_SetObject(cls, err.ptr());
  throw nb::python_error();
}

void Check(const Status& s) {
  if (!s.ok()) Raise(s);
}

template <typename T>
T Take(Result<T> r) {
  if (!r.ok()) Raise(r.status());
  return std::move(r).value();
}

[[noreturn]] void RaiseInvalid(const std::string& message) {
  Raise(Status::InvalidArgument(message));
}

RequestOptions Request(const std::string& tenant, const std::string& lora_id, uint64_t session_id) {
  return RequestOptions{tenant, lora_id, session_id};
}

SessionEvent SessionEventFrom(const std::string& name) {
  if (name == "thinking") return SessionEvent::kThinking;
  if (name == "active") return SessionEvent::kActive;
  if (name == "finished") return SessionEvent::kFinished;
  RaiseInvalid("session event '" + name + "': not thinking, active or finished");
}

}  // namespace

[[noreturn]] void RaiseStatus(const Status& s) { Raise(s); }
}  // namespace kvtier

namespace kvtier {
namespace {

void RegisterErrors(nb::module_& m) {
  // Exceptions, by code. InvalidArgument is also a ValueError, NotFound also a KeyError.
  PyObject* base = PyErr_NewException("kvtier.KvtierError", PyExc_RuntimeError, nullptr);
  m.attr("KvtierError") = nb::handle(base);
  struct Named {
    StatusCode code;
    const char* name;
    PyObject* also;
  };
  const Named named[] = {
      {StatusCode::kNotFound, "NotFound", PyExc_KeyError},
      {StatusCode::kInvalidArgument, "InvalidArgument", PyExc_ValueError},
      {StatusCode::kUnavailable, "Unavailable", nullptr},
      {StatusCode::kResourceExhausted, "ResourceExhausted", nullptr},
      {StatusCode::kCorruption, "Corruption", nullptr},
      {StatusCode::kInternal, "Internal", nullptr},
  };
  g_errors[0] = base;
  for (const auto& n : named) {
    nb::object bases = n.also ? nb::make_tuple(nb::handle(base), nb::handle(n.also))
                              : nb::make_tuple(nb::handle(base));
    PyObject* cls =
        PyErr_NewException((std::string("kvtier.") + n.name).c_str(), bases.ptr(), nullptr);
    g_errors[static_cast<size_t>(n.code)] = cls;
    m.attr(n.name) = nb::handle(cls);
  }
}

void RegisterKeys(nb::module_& m) {
  nb::class_<BlockKey>(m, "BlockKey", "A block's 128-bit chained key.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](BlockKey* k, uint64_t hi, uint64_t lo) {
            new (k) BlockKey{hi, lo};
          },
          "hi"_a, "lo"_a)
      .def_rw("hi", &BlockKey::hi)
      .def_rw("lo", &BlockKey::lo)
      .def("hex", &BlockKey::ToHex)
      .def_static("from_hex", [](const std::string& hex) { return Take(BlockKey::FromHex(hex)); })
      .def("__eq__", [](const BlockKey& a, const BlockKey& b) { return a == b; })
      .def("__hash__", [](const BlockKey& k) { return BlockKeyHash{}(k); })
      .def("__repr__", [](const BlockKey& k) { return "BlockKey('" + k.ToHex() + "')"; })
      .def("__getstate__", [](const BlockKey& k) { return std::make_pair(k.hi, k.lo); })
      .def("__setstate__", [](BlockKey& k, const std::pair<uint64_t, uint64_t>& s) {
        new (&k) BlockKey{s.first, s.second};
      });

  nb::class_<Namespace>(m, "Namespace", "What separates one cache namespace from another.")
      .def(
          "__init__",
          [](Namespace* n, std::string model_id, std::string model_revision,
             uint64_t layout_fingerprint, std::string tenant, std::string lora_id) {
            new (n) Namespace{std::move(model_id), std::move(model_revision), layout_fingerprint,
                              std::move(tenant), std::move(lora_id)};
          },
          "model_id"_a, "model_revision"_a = "", "layout_fingerprint"_a = 0, "tenant"_a = "",
          "lora_id"_a = "")
      .def("root", &Namespace::Root);

  m.def(
      "hash_prefix",
      [](const BlockKey& root, uint32_t block_tokens, const std::vector<TokenId>& tokens) {
        if (block_tokens == 0) RaiseInvalid("hash_prefix: block_tokens must be > 0");
        std::vector<BlockKey> keys;
        {
          nb::gil_scoped_release release;
          HashPrefix(root, block_tokens, tokens, &keys);
        }
        return keys;
      },
      "root"_a, "block_tokens"_a, "tokens"_a,
      "Keys of the full blocks of tokens (a partial last block has none).");
  m.def("state_keys", &StateKeys, "block"_a, "n"_a,
        "The keys block's state record is stored under (layout.state_blocks of them).");
  m.def(
      "checksum64",
      [](AnyConstArray a) {
        auto b = BytesOf(a, "checksum64");
        return Checksum64(b);
      },
      "buffer"_a);
}

void RegisterOptions(nb::module_& m) {
  nb::class_<TierSpec>(m, "TierSpec")
      .def(
          "__init__",
          [](TierSpec* t, std::string kind, uint64_t capacity_bytes, std::string name, int threads,
             std::string eviction, std::map<std::string, std::string> params) {
            new (t) TierSpec{};
            t->kind = std::move(kind);
            t->capacity_bytes = capacity_bytes;
            t->name = std::move(name);
            t->threads = threads;
            t->eviction = std::move(eviction);
            t->params = std::move(params);
          },
          "kind"_a, "capacity_bytes"_a, "name"_a = "", "threads"_a = 1, "eviction"_a = "lru",
          "params"_a = std::map<std::string, std::string>{})
      .def_rw("kind", &TierSpec::kind)
      .def_rw("name", &TierSpec::name)
      .def_rw("capacity_bytes", &TierSpec::capacity_bytes)
      .def_rw("threads", &TierSpec::threads)
      .def_rw("eviction", &TierSpec::eviction)
      .def_rw("params", &TierSpec::params);

  nb::class_<CacheOptions>(m, "CacheOptions")
      .def(
          "__init__",
          [](CacheOptions* o, const KvLayout& layout, std::vector<TierSpec> tiers,
             std::string model_id, std::string model_revision, std::string tenant,
             std::string lora_id, std::string write_mode, bool verify_checksums,
             bool promote_on_load) {
            new (o) CacheOptions{};
            o->layout = layout;
            o->tiers = std::move(tiers);
            o->model_id = std::move(model_id);
            o->model_revision = std::move(model_revision);
            o->tenant = std::move(tenant);
            o->lora_id = std::move(lora_id);
            if (write_mode == "write-through") {
              o->write_mode = WriteMode::kWriteThrough;
            } else if (write_mode == "write-back") {
              o->write_mode = WriteMode::kWriteBack;
            } else {
              RaiseInvalid("write_mode '" + write_mode + "': not write-through or write-back");
            }
            o->verify_checksums = verify_checksums;
            o->promote_on_load = promote_on_load;
          },
          "layout"_a, "tiers"_a, "model_id"_a = "default", "model_revision"_a = "", "tenant"_a = "",
          "lora_id"_a = "", "write_mode"_a = "write-through", "verify_checksums"_a = true,
          "promote_on_load"_a = true)
      .def_static(
          "from_yaml",
          [](const std::string& text, const std::string& source) {
            return Take(serve::CacheOptionsWithEvents(text, source));
          },
          "text"_a, "source"_a = "<yaml>")
      .def_static(
          "from_file",
          [](const std::string& path) { return Take(serve::CacheOptionsWithEventsFile(path)); },
          "path"_a)
      .def_rw("layout", &CacheOptions::layout)
      .def_rw("tiers", &CacheOptions::tiers)
      .def_rw("model_id", &CacheOptions::model_id)
      .def_rw("model_revision", &CacheOptions::model_revision)
      .def_rw("tenant", &CacheOptions::tenant)
      .def_rw("lora_id", &CacheOptions::lora_id)
      .def_rw("verify_checksums", &CacheOptions::verify_checksums)
      .def_rw("promote_on_load", &CacheOptions::promote_on_load)
      .def_rw("events", &CacheOptions::events)
      .def("validate", [](const CacheOptions& o) { Check(o.Validate()); });
}

void RegisterResults(nb::module_& m) {
  nb::class_<LookupResult>(m, "LookupResult",
                           "Which leading blocks are cached. Holds pins on them until "
                           "release() (or the end of a with block).")
      .def_ro("keys", &LookupResult::keys)
      .def_ro("hit_blocks", &LookupResult::hit_blocks)
      .def_ro("block_tokens", &LookupResult::block_tokens)
      .def_prop_ro("hit_tokens", &LookupResult::hit_tokens)
      .def_prop_ro(
          "source",
          [](const LookupResult& r) { return std::vector<int>(r.source.begin(), r.source.end()); })
      .def_prop_ro("blocks_by_tier",
                   [](const LookupResult& r) {
                     return std::vector<uint32_t>(r.blocks_by_tier.begin(), r.blocks_by_tier.end());
                   })
      .def_prop_ro("pinned", [](const LookupResult& r) { return r.pins.held(); })
      .def("release", [](LookupResult& r) { r.pins.Release(); })
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](LookupResult& r, nb::args) { r.pins.Release(); });

  nb::class_<LoadResult>(m, "LoadResult")
      .def_ro("loaded_blocks", &LoadResult::loaded_blocks)
      .def_ro("bytes", &LoadResult::bytes)
      .def_prop_ro("block_errors", [](const LoadResult& r) {
        // One entry per requested block: None when it loaded, else "Code: message".
        nb::list out;
        for (const auto& s : r.block_status)
          out.append(s.ok() ? nb::none() : nb::cast(s.ToString()));
        return out;
      });

  nb::class_<StoreResult>(m, "StoreResult")
      .def_ro("stored_blocks", &StoreResult::stored_blocks)
      .def_ro("present_blocks", &StoreResult::present_blocks)
      .def_ro("failed_blocks", &StoreResult::failed_blocks)
      .def_prop_ro("first_error", [](const StoreResult& r) -> nb::object {
        if (r.first_error.ok()) return nb::none();
        return nb::cast(r.first_error.ToString());
      });
}

// The one body of store and store_keys: blocks as spans, the engine's hashes on the request,
// `store` run with the GIL released.
template <typename StoreFn>
StoreResult StoreBlocks(KvCache& c, nb::handle blocks, RequestOptions rq,
                        const std::vector<EngineBlockHashes>& engine_hashes, StoreFn store) {
  auto spans = Blocks<AnyConstArray, ConstBlock>(blocks, c.layout().bytes_per_block(), "blocks");
  rq.engine_hashes = engine_hashes;
  Result<StoreResult> r = Status::Internal("unset");
  {
    nb::gil_scoped_release release;
    r = store(std::span<const ConstBlock>(spans), rq);
  }
  return Take(std::move(r));
}

// KvCache's stores, session events and stats (RegisterKvCache binds the rest).
void BindKvCacheWrites(nb::class_<KvCache>& cls) {
  cls.def(
         "store",
         [](KvCache& c, const std::vector<TokenId>& tokens, nb::handle blocks, uint32_t first_block,
            const std::string& tenant, const std::string& lora_id, uint64_t session_id,
            const std::vector<EngineBlockHashes>& engine_hashes) {
           return StoreBlocks(c, blocks, Request(tenant, lora_id, session_id), engine_hashes,
                              [&](std::span<const ConstBlock> spans, const RequestOptions& rq) {
                                return c.Store(tokens, spans, first_block, rq);
                              });
         },
         "tokens"_a, "blocks"_a, "first_block"_a = 0, "tenant"_a = "", "lora_id"_a = "",
         "session_id"_a = 0, "engine_hashes"_a = std::vector<EngineBlockHashes>{},
         "engine_hashes: one kvtier.EngineBlockHashes per block (or none), announced in the "
         "cache's KV events instead of kvtier's keys (see wants_engine_hashes).")
      .def(
          "store_keys",
          [](KvCache& c, const std::vector<BlockKey>& keys, nb::handle blocks, uint32_t first_block,
             const std::string& tenant, const std::string& lora_id, uint64_t session_id,
             const std::vector<EngineBlockHashes>& engine_hashes) {
            return StoreBlocks(c, blocks, Request(tenant, lora_id, session_id), engine_hashes,
                               [&](std::span<const ConstBlock> spans, const RequestOptions& rq) {
                                 return c.StoreKeys(keys, spans, first_block, rq);
                               });
          },
          "keys"_a, "blocks"_a, "first_block"_a = 0, "tenant"_a = "", "lora_id"_a = "",
          "session_id"_a = 0, "engine_hashes"_a = std::vector<EngineBlockHashes>{})
      .def_prop_ro("wants_engine_hashes", &KvCache::WantsEngineHashes,
                   "Whether stores' engine_hashes are used: the cache (or its daemon) publishes "
                   "KV events.")
      .def(
          "notify_session",
          [](KvCache& c, uint64_t session_id, const std::string& event) {
            c.NotifySession(session_id, SessionEventFrom(event));
          },
          "session_id"_a, "event"_a)
      .def(
          "note_declined",
          [](KvCache& c, const std::vector<uint32_t>& blocks_by_tier) {
            nb::gil_scoped_release release;
            c.NoteDeclined(blocks_by_tier);
          },
          "blocks_by_tier"_a,
          "The engine recomputed blocks_by_tier[t] hit blocks of tier t rather than load them "
          "(counted as each tier's declined_blocks).")
      .def("stats", [](const KvCache& c) {
        // Without the GIL: a remote tier's usage is a round trip now and then, and an engine's
        // step must not wait on it (its stats are written from a background thread).
        CacheStats s;
        {
          nb::gil_scoped_release release;
          s = c.stats();
        }
        return StatsDict(s);
      });
}

void RegisterKvCache(nb::module_& m) {
  // The interface: what the vLLM connector and any engine call. A daemon Client binds as a
  // subclass of this with only its constructor.
  auto cls = nb::class_<KvCache>(m, "KvCache");
  cls.def_prop_ro("layout", &KvCache::layout)
      .def(
          "root",
          [](const KvCache& c, const std::string& tenant, const std::string& lora_id) {
            return c.Root(Request(tenant, lora_id, 0));
          },
          "tenant"_a = "", "lora_id"_a = "")
      .def(
          "lookup",
          [](KvCache& c, const std::vector<TokenId>& tokens, const std::string& tenant,
             const std::string& lora_id, uint64_t session_id) {
            Result<LookupResult> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = c.Lookup(tokens, Request(tenant, lora_id, session_id));
            }
            return Take(std::move(r));
          },
          "tokens"_a, "tenant"_a = "", "lora_id"_a = "", "session_id"_a = 0, nb::keep_alive<0, 1>())
      .def(
          "lookup_keys",
          [](KvCache& c, const std::vector<BlockKey>& keys, const std::string& tenant,
             const std::string& lora_id, uint64_t session_id) {
            Result<LookupResult> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = c.LookupKeys(keys, Request(tenant, lora_id, session_id));
            }
            return Take(std::move(r));
          },
          "keys"_a, "tenant"_a = "", "lora_id"_a = "", "session_id"_a = 0, nb::keep_alive<0, 1>())
      .def(
          "load",
          [](KvCache& c, const LookupResult& lookup, nb::handle dst, uint32_t first) {
            auto blocks = Blocks<AnyArray, MutableBlock>(dst, c.layout().bytes_per_block(), "dst");
            Result<LoadResult> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = c.Load(lookup, first, blocks);
            }
            return Take(std::move(r));
          },
          "lookup"_a, "dst"_a, "first"_a = 0,
          "Copies the lookup's hit blocks first, first + 1, ... into dst: one C-contiguous array "
          "of whole blocks, or a list of one-block arrays. Returns how many loaded, in order "
          "from first (a long hit loads in chunks through one buffer this way).");
  BindKvCacheWrites(cls);
}

void RegisterCache(nb::module_& m) {
  nb::class_<Cache, KvCache>(m, "Cache", "The in-process cache (tiers in this process).")
      .def_static(
          "open",
          [](CacheOptions options) {
            Result<std::unique_ptr<Cache>> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = Cache::Open(std::move(options));
            }
            return Take(std::move(r));
          },
          "options"_a)
      .def_prop_ro("num_tiers", &Cache::num_tiers)
      .def(
          "wait_for_writes",
          [](Cache& c) {
            nb::gil_scoped_release release;
            c.WaitForWrites();
          },
          "Waits for the background writes to lower tiers (nothing is dropped).")
      .def("prometheus_text", &Cache::PrometheusText)
      .def(
          "events_info", [](const Cache& c) { return EventsInfoDict(c.events_info()); },
          "The KV-event publisher: its endpoints, topics and counters (empty endpoint: off).");
}

void RegisterClient(nb::module_& m) {
  m.def("default_socket_path", &DefaultSocketPath,
        "$XDG_RUNTIME_DIR/kvtier/kvtier.sock, else /run/kvtier/kvtier.sock.");

  nb::class_<Client, KvCache>(
      m, "Client",
      "A KvCache served by the node's `kvtier serve` daemon: the same calls as Cache. Every call "
      "has a deadline; a dead daemon is a miss, and the client reconnects in the background.")
      .def_static(
          "connect",
          [](const KvLayout& layout, const std::string& socket, const std::string& model_id,
             const std::string& model_revision, const std::string& tenant,
             const std::string& lora_id, const std::string& token, uint32_t timeout_ms) {
            ClientOptions o;
            o.socket_path = socket;
            o.layout = layout;
            o.model_id = model_id;
            o.model_revision = model_revision;
            o.tenant = tenant;
            o.lora_id = lora_id;
            o.token = token;
            o.timeout_ms = timeout_ms;
            Result<std::unique_ptr<Client>> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = Client::Open(std::move(o));
            }
            return Take(std::move(r));
          },
          "layout"_a, "socket"_a = "", "model_id"_a = "default", "model_revision"_a = "",
          "tenant"_a = "", "lora_id"_a = "", "token"_a = "", "timeout_ms"_a = 1000)
      .def_prop_ro("connected", &Client::connected)
      .def(
          "wait_connected",
          [](const Client& c, uint32_t timeout_ms) {
            Status s;
            {
              nb::gil_scoped_release release;
              s = c.WaitConnected(timeout_ms);
            }
            return s.ok();
          },
          "timeout_ms"_a)
      .def("client_stats",
           [](const Client& c) {
             ClientStats s = c.client_stats();
             nb::dict d;
             d["connected"] = s.connected;
             d["connects"] = s.connects;
             d["disconnects"] = s.disconnects;
             d["timeouts"] = s.timeouts;
             d["missed_lookups"] = s.missed_lookups;
             d["dropped_stores"] = s.dropped_stores;
             d["dropped_blocks"] = s.dropped_blocks;
             d["expired_loads"] = s.expired_loads;
             d["corrupt_blocks"] = s.corrupt_blocks;
             d["warmed_bytes"] = s.warmed_bytes;
             return d;
           })
      .def("daemon_stats",
           [](Client& c) {
             Result<DaemonStatus> d = Status::Internal("unset");
             {
               nb::gil_scoped_release release;
               d = c.GetDaemonStatus();
             }
             const DaemonStatus s = Take(std::move(d));
             return StatsDict(s.cache, &s);
           })
      .def(
          "drop_all",
          [](Client& c) {
            Result<uint64_t> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = c.DropAll();
            }
            return Take(std::move(r));
          },
          "Drops every unpinned block of the daemon's memory tiers (`kvtier flush`); returns "
          "how many.");
}

}  // namespace
}  // namespace kvtier

NB_MODULE(_kvtier, m) {
  using namespace kvtier;
  m.doc() = "kvtier: tiered KV-cache offload (host DRAM, SSD, Redis) for LLM inference engines";
  // Engine integrations keep one cache per process until exit (kvtier.backends); nanobind's
  // report of objects alive at interpreter exit would only be noise in engines' logs.
  nb::set_leak_warnings(false);
  RegisterStats(m);
  RegisterPlanner(m);
  RegisterEvents(m);
  RegisterErrors(m);
  RegisterLayout(m);
  RegisterKeys(m);
  RegisterPaged(m);
  RegisterOptions(m);
  RegisterResults(m);
  RegisterKvCache(m);
  RegisterCache(m);
  RegisterClient(m);
  RegisterAsyncStore(m);
}
