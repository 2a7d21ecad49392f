// kvtier.AsyncStore: the library's AsyncStore (include/kvtier/async_store.h) for Python, the
// engine connectors' one background store queue. The batch's arrays and its done callback are
// Python objects: they are referenced while the batch waits and released under the GIL, on the
// thread that stored it; every wait releases the GIL, so a done that needs it can run.
#include "saves.h"

#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "kvtier/async_store.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace kvtier {
namespace {

// The Python objects a queued batch holds: released on the storing thread, under the GIL.
struct PyRefs {
  nb::object done;
  std::vector<nb::object> arrays;
};

// A list of kvtier.BlockKey or of (hi, lo) pairs.
std::vector<BlockKey> KeysFrom(nb::handle keys, size_t job) {
  std::vector<BlockKey> out;
  for (nb::handle k : keys) {
    BlockKey key;
    if (nb::try_cast(k, key, false)) {
      out.push_back(key);
      continue;
    }
    std::pair<uint64_t, uint64_t> hl;
    if (!nb::try_cast(k, hl))
      RaiseInvalidArgument("AsyncStore.submit: batch[" + std::to_string(job) +
                           "] keys: expected kvtier.BlockKey or (hi, lo) pairs");
    out.push_back(BlockKey{hl.first, hl.second});
  }
  return out;
}

AsyncStoreOptions OptionsFrom(size_t max_batches, nb::handle nice) {
  AsyncStoreOptions o;
  o.max_batches = max_batches;
  if (nice.is_none()) {
    o.priority = AsyncStoreOptions::Priority::kInherit;
  } else if (nb::isinstance<nb::str>(nice) && nb::cast<std::string>(nice) == "idle") {
    o.priority = AsyncStoreOptions::Priority::kIdle;
  } else {
    int level = 0;
    if (nb::isinstance<nb::bool_>(nice) || !nb::try_cast(nice, level) || level < -20 || level > 19)
      RaiseInvalidArgument("AsyncStore: nice " + nb::cast<std::string>(nb::repr(nice)) +
                           ": want 'idle', a number from -20 to 19, or None");
    o.priority = AsyncStoreOptions::Priority::kNice;
    o.nice = level;
  }
  return o;
}

std::chrono::milliseconds Millis(double seconds) {
  if (!(seconds > 0)) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(std::min(seconds, 1e9) * 1e3)));
}

// Owns the AsyncStore; joins its thread with the GIL released (a done may be waiting for it).
class PyAsyncStore {
 public:
  PyAsyncStore(KvCache& cache, AsyncStoreOptions o)
      : block_bytes_(cache.layout().bytes_per_block()),
        saves_(std::make_unique<AsyncStore>(cache, o)) {}
  ~PyAsyncStore() { Close(); }

  void Close() {
    if (!saves_) return;
    nb::gil_scoped_release release;
    saves_->Close();
    saves_.reset();
  }

  AsyncStore& saves() {
    if (!saves_) RaiseStatus(Status::Unavailable("AsyncStore: closed"));
    return *saves_;
  }
  bool open() const { return saves_ != nullptr; }

  // batch: (keys, blocks, first_block, tenant, lora_id[, session_id[, engine_hashes]]) tuples.
  bool Submit(nb::handle batch, nb::handle done) {
    AsyncStore& s = saves();
    auto refs = std::make_shared<PyRefs>();
    refs->done = nb::borrow(done);
    std::vector<StoreJob> jobs;
    size_t i = 0;
    for (nb::handle entry : batch) {
      nb::tuple t = nb::cast<nb::tuple>(entry);
      if (t.size() < 5 || t.size() > 7)
        RaiseInvalidArgument("AsyncStore.submit: batch[" + std::to_string(i) +
                             "]: want (keys, blocks, first_block, tenant, lora_id[, session_id[, "
                             "engine_hashes]])");
      StoreJob j;
      j.keys = KeysFrom(t[0], i);
      const std::string what = "batch[" + std::to_string(i) + "] blocks";
      j.blocks = Blocks<AnyConstArray, ConstBlock>(t[1], block_bytes_, what.c_str());
      refs->arrays.push_back(nb::borrow(t[1]));
      j.first_block = nb::cast<uint32_t>(t[2]);
      j.tenant = nb::cast<std::string>(t[3]);
      j.lora_id = nb::cast<std::string>(t[4]);
      if (t.size() > 5) j.session_id = nb::cast<uint64_t>(t[5]);
      if (t.size() > 6 && !t[6].is_none())
        j.engine_hashes = nb::cast<std::vector<EngineBlockHashes>>(t[6]);
      jobs.push_back(std::move(j));
      ++i;
    }
    return s.Submit(std::move(jobs), [refs](std::vector<Result<StoreResult>>& results) {
      nb::gil_scoped_acquire gil;
      if (refs->done.is_valid() && !refs->done.is_none()) {
        nb::list out;
        for (auto& r : results) {
          if (r.ok())
            out.append(nb::make_tuple(nb::cast(*r), nb::none()));
          else
            out.append(nb::make_tuple(nb::none(), nb::str(r.status().ToString().c_str())));
        }
        try {
          refs->done(out);
        } catch (nb::python_error& e) {
          e.discard_as_unraisable("kvtier.AsyncStore: a done callback");
        }
      }
      refs->done = nb::object();
      refs->arrays.clear();
    });
  }

 private:
  uint64_t block_bytes_;
  std::unique_ptr<AsyncStore> saves_;
};

}  // namespace

void RegisterAsyncStore(nb::module_& m) {
  nb::class_<PyAsyncStore>(m, "AsyncStore",
                           "Stores in the background: one bounded queue and one thread per "
                           "KvCache (doc/python.md). close() it, or use it in a with block.")
      .def(
          "__init__",
          [](PyAsyncStore* self, KvCache& cache, size_t max_batches, nb::handle nice) {
            new (self) PyAsyncStore(cache, OptionsFrom(max_batches, nice));
          },
          "cache"_a, "max_batches"_a = 64, "nice"_a.none() = "idle", nb::keep_alive<1, 2>())
      .def("submit", &PyAsyncStore::Submit, "batch"_a, "done"_a.none() = nb::none(),
           "Queues batch, a list of (keys, blocks, first_block, tenant, lora_id[, session_id[, "
           "engine_hashes]]); done(results) runs once it is stored, with one (StoreResult, None) "
           "or (None, error message) per entry. The blocks must stay unchanged until then. "
           "False: the queue is full, nothing was queued, done never runs (counted).")
      .def(
          "wait_for",
          [](PyAsyncStore& s, nb::handle keys, double timeout) {
            std::vector<BlockKey> k = KeysFrom(keys, 0);
            AsyncStore& saves = s.saves();
            nb::gil_scoped_release release;
            return saves.WaitFor(k, Millis(timeout));
          },
          "keys"_a, "timeout"_a,
          "Waits until none of keys (BlockKey or (hi, lo)) is queued or being stored; queued "
          "batches that hold one are stored by the caller. False: timeout (seconds) ran out.")
      .def(
          "wait_idle",
          [](PyAsyncStore& s, double timeout) {
            if (!s.open()) return true;
            AsyncStore& saves = s.saves();
            nb::gil_scoped_release release;
            return saves.WaitIdle(Millis(timeout));
          },
          "timeout"_a)
      .def("close", &PyAsyncStore::Close,
           "Stores what is queued, stops the thread; later submits raise. Idempotent.")
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PyAsyncStore& s, nb::args) { s.Close(); })
      .def_prop_ro("closed", [](const PyAsyncStore& s) { return !s.open(); })
      .def_prop_ro("dropped",
                   [](PyAsyncStore& s) { return s.open() ? s.saves().stats().dropped_batches : 0; })
      .def_prop_ro(
          "thread_id", [](PyAsyncStore& s) { return s.open() ? s.saves().thread_id() : 0; },
          "The store thread's Linux thread id.")
      .def("thread_cpu_seconds",
           [](PyAsyncStore& s) { return s.open() ? s.saves().thread_cpu_seconds() : 0.0; })
      .def(
          "stats",
          [](PyAsyncStore& s) {
            nb::dict d;
            if (!s.open()) return d;
            for (const auto& [name, v] : AsyncStoreFields(s.saves().stats()))
              d[name.substr(name.find('.') + 1).c_str()] = v;
            return d;
          },
          "submitted_batches, stored_batches, stored_by_waiters, dropped_batches, "
          "dropped_blocks, pending_batches.");
}

}  // namespace kvtier
