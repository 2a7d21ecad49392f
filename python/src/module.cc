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

#include "events.h"
#include "kvtier/block_key.h"
#include "kvtier/cache.h"
#include "kvtier/client.h"
#include "kvtier/config.h"
#include "kvtier/kv_cache.h"
#include "kvtier/layout.h"
#include "kvtier/status.h"
#include "planner.h"
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

DType DTypeFrom(const std::string& name) {
  auto d = ParseDType(name);
  if (!d) RaiseInvalid("dtype '" + name + "': not bf16, fp16, fp8 or fp32");
  return *d;
}

AttentionKind AttentionFrom(const std::string& name) {
  auto a = ParseAttentionKind(name);
  if (!a) RaiseInvalid("attention '" + name + "': not mha, gqa or mla");
  return *a;
}

// Any CPU ndarray, any dtype; contiguity and size are checked here so a wrong buffer is a
// ValueError naming it, never a write past its end.
using AnyArray = nb::ndarray<nb::device::cpu>;
using AnyConstArray = nb::ndarray<nb::ro, nb::device::cpu>;

template <typename Array>
std::span<std::byte> BytesOf(const Array& a, const char* what) {
  int64_t expect = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect)
      RaiseInvalid(std::string(what) + ": the buffer is not C-contiguous");
    expect *= static_cast<int64_t>(a.shape(d));
  }
  auto* p = static_cast<std::byte*>(const_cast<void*>(static_cast<const void*>(a.data())));
  return {p, a.nbytes()};
}

// Splits one buffer (n whole blocks) or a list of buffers (one block each) into block spans.
template <typename Array, typename Span>
std::vector<Span> Blocks(nb::handle buffers, uint64_t block_bytes, const char* what) {
  std::vector<Span> out;
  Array one;
  if (nb::try_cast(buffers, one, false)) {
    auto bytes = BytesOf(one, what);
    if (bytes.size() % block_bytes != 0)
      RaiseInvalid(std::string(what) + ": a buffer of " + std::to_string(bytes.size()) +
                   " bytes is not a whole number of " + std::to_string(block_bytes) +
                   "-byte blocks");
    for (size_t off = 0; off < bytes.size(); off += block_bytes)
      out.push_back(Span(bytes.data() + off, block_bytes));
    return out;
  }
  if (!nb::isinstance<nb::sequence>(buffers) || nb::isinstance<nb::str>(buffers))
    RaiseInvalid(std::string(what) + ": expected an array or a list of arrays");
  size_t i = 0;
  for (nb::handle item : buffers) {
    Array a;
    if (!nb::try_cast(item, a, false))
      RaiseInvalid(std::string(what) + "[" + std::to_string(i) +
                   "]: not a writable CPU array (numpy, or torch through DLPack)");
    auto bytes = BytesOf(a, what);
    if (bytes.size() != block_bytes)
      RaiseInvalid(std::string(what) + "[" + std::to_string(i) +
                   "]: " + std::to_string(bytes.size()) + " bytes, a block is " +
                   std::to_string(block_bytes));
    out.push_back(Span(bytes.data(), bytes.size()));
    ++i;
  }
  return out;
}

RequestOptions Request(const std::string& tenant, const std::string& lora_id, uint64_t session_id) {
  return RequestOptions{tenant, lora_id, session_id};
}

// ---- Paged KV: an engine's per-layer paged tensors <-> kvtier blocks (kvtier.gather_pages).
//
// A layer tensor holds N pages of page_tokens tokens. Known page layouts (H = kv heads,
// P = page tokens, D = head_dim):
//   "fused": [N, H, P, 2*D]  each head's [P, 2D] read as [2P, D]: P rows of K, then P of V
//   "split": [2, N, H, P, D] K's pages, then V's
// A kvtier block of block_tokens tokens spans ratio = block_tokens / P pages of every layer and
// is stored in kvtier's byte order (kvtier/layout.h). One row of D elements is the copy unit.
struct PagedLayer {
  std::byte* base = nullptr;
  int64_t pages = 0;
};

struct PagedGeometry {
  std::vector<PagedLayer> layers;
  uint64_t row = 0;  // bytes of one (token, head) row: head_dim elements
  uint64_t s_page = 0, s_head = 0, s_kv = 0, s_tok = 0;  // source strides in bytes (s_kv per layer
                                                         // for "split": it depends on N)
  bool split = false;
  uint32_t heads = 0, page_tokens = 0, ratio = 0;
  uint64_t block_bytes = 0, layer_bytes = 0;
};

template <typename Array>
PagedGeometry Geometry(nb::handle layers, const KvLayout& layout, uint32_t page_tokens,
                       const std::string& kind, const char* what) {
  const std::string w(what);
  if (layout.attention != AttentionKind::kMha)
    RaiseInvalid(w + ": paged KV copies support MHA/GQA layouts only");
  if (page_tokens == 0 || layout.block_tokens % page_tokens != 0)
    RaiseInvalid(w + ": a kvtier block of " + std::to_string(layout.block_tokens) +
                 " tokens is not a whole number of " + std::to_string(page_tokens) +
                 "-token pages");
  if (kind != "fused" && kind != "split")
    RaiseInvalid(w + ": page layout '" + kind + "': not fused or split");
  if (!nb::isinstance<nb::sequence>(layers) || nb::isinstance<nb::str>(layers))
    RaiseInvalid(w + ": layers must be a list of arrays, one per layer");
  PagedGeometry g;
  g.split = kind == "split";
  g.heads = layout.num_kv_heads;
  g.page_tokens = page_tokens;
  g.ratio = layout.block_tokens / page_tokens;
  g.block_bytes = layout.bytes_per_block();
  g.layer_bytes = layout.layer_bytes();
  const uint64_t es = DTypeBytes(layout.dtype);
  const uint64_t H = layout.num_kv_heads, P = page_tokens, D = layout.head_dim;
  g.row = D * es;
  g.s_tok = D * es;
  g.s_head = (g.split ? P * D : P * 2 * D) * es;
  g.s_page = H * g.s_head;
  g.s_kv = g.split ? 0 : P * D * es;
  size_t i = 0;
  for (nb::handle item : layers) {
    const std::string name = w + ": layer " + std::to_string(i);
    Array a;
    if (!nb::try_cast(item, a, false))
      RaiseInvalid(name + ": not a" + (std::is_same_v<Array, AnyArray> ? " writable" : "") +
                   " CPU array (numpy, or torch through DLPack)");
    if (a.itemsize() != es)
      RaiseInvalid(name + ": " + std::to_string(a.itemsize()) + "-byte elements, the layout's " +
                   std::string(DTypeName(layout.dtype)) + " has " + std::to_string(es));
    std::vector<int64_t> shape(a.ndim());
    for (size_t d = 0; d < a.ndim(); ++d) shape[d] = static_cast<int64_t>(a.shape(d));
    const bool ok =
        g.split ? (shape.size() == 5 && shape[0] == 2 && shape[2] == static_cast<int64_t>(H) &&
                   shape[3] == static_cast<int64_t>(P) && shape[4] == static_cast<int64_t>(D))
                : (shape.size() == 4 && shape[1] == static_cast<int64_t>(H) &&
                   shape[2] == static_cast<int64_t>(P) && shape[3] == static_cast<int64_t>(2 * D));
    if (!ok) {
      std::string got = "[";
      for (size_t d = 0; d < shape.size(); ++d) got += (d ? ", " : "") + std::to_string(shape[d]);
      got += "]";
      RaiseInvalid(name + ": shape " + got + " is not the '" + kind + "' layout " +
                   (g.split ? "[2, N, " + std::to_string(H) + ", " + std::to_string(P) + ", " +
                                  std::to_string(D) + "]"
                            : "[N, " + std::to_string(H) + ", " + std::to_string(P) + ", " +
                                  std::to_string(2 * D) + "]"));
    }
    auto bytes = BytesOf(a, name.c_str());
    g.layers.push_back({bytes.data(), g.split ? shape[1] : shape[0]});
    ++i;
  }
  if (g.layers.size() != layout.num_layers)
    RaiseInvalid(w + ": " + std::to_string(g.layers.size()) + " layer arrays for a layout of " +
                 std::to_string(layout.num_layers) + " layers");
  return g;
}

// Page ids: a 1-D integer array (numpy or torch, any stride) or a sequence of ints.
std::vector<int64_t> PageIds(nb::handle ids, const char* what) {
  std::vector<int64_t> out;
  nb::ndarray<nb::ro, nb::device::cpu, nb::ndim<1>> a;
  if (nb::try_cast(ids, a, false)) {
    const auto dt = a.dtype();
    if (dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::Int) &&
        dt.code != static_cast<uint8_t>(nb::dlpack::dtype_code::UInt))
      RaiseInvalid(std::string(what) + ": page ids must be integers");
    const auto* p = static_cast<const std::byte*>(a.data());
    const size_t es = a.itemsize();
    out.reserve(a.shape(0));
    for (size_t i = 0; i < a.shape(0); ++i) {
      const std::byte* e = p + static_cast<int64_t>(i) * a.stride(0) * static_cast<int64_t>(es);
      int64_t v = 0;
      const bool sgn = dt.code == static_cast<uint8_t>(nb::dlpack::dtype_code::Int);
      switch (es) {
        case 1:
          v = sgn ? *reinterpret_cast<const int8_t*>(e) : *reinterpret_cast<const uint8_t*>(e);
          break;
        case 2:
          v = sgn ? *reinterpret_cast<const int16_t*>(e) : *reinterpret_cast<const uint16_t*>(e);
          break;
        case 4:
          v = sgn ? *reinterpret_cast<const int32_t*>(e) : *reinterpret_cast<const uint32_t*>(e);
          break;
        case 8:
          v = *reinterpret_cast<const int64_t*>(e);
          break;
        default:
          RaiseInvalid(std::string(what) + ": page ids of an unknown integer width");
      }
      out.push_back(v);
    }
    return out;
  }
  if (!nb::try_cast(ids, out, true))
    RaiseInvalid(std::string(what) + ": page ids must be a 1-D integer array or a list of ints");
  return out;
}

void CheckPageIds(const PagedGeometry& g, const std::vector<int64_t>& ids, const char* what) {
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t l = 0; l < g.layers.size(); ++l)
      if (ids[i] < 0 || ids[i] >= g.layers[l].pages)
        RaiseInvalid(std::string(what) + ": page id " + std::to_string(ids[i]) + " (at " +
                     std::to_string(i) + ") is outside layer " + std::to_string(l) + "'s " +
                     std::to_string(g.layers[l].pages) + " pages");
}

// How many whole blocks `bytes` holds; ValueError naming `what` when it is not a whole number.
uint64_t WholeBlocks(const PagedGeometry& g, size_t bytes, const std::string& what) {
  if (bytes % g.block_bytes != 0)
    RaiseInvalid(what + " has " + std::to_string(bytes) + " bytes, not a whole number of " +
                 std::to_string(g.block_bytes) + "-byte blocks");
  return bytes / g.block_bytes;
}

// Copies page j of the blocks' page sequence (block j / ratio, its (j % ratio)-th page) between
// the block buffer and the engine page `page`, every layer. to_blocks: engine -> blocks.
void CopyPage(const PagedGeometry& g, std::byte* blocks, uint64_t j, int64_t page, bool to_blocks) {
  const uint64_t block = j / g.ratio, sub = j % g.ratio;
  for (size_t l = 0; l < g.layers.size(); ++l) {
    const PagedLayer& layer = g.layers[l];
    const uint64_t s_kv = g.split ? static_cast<uint64_t>(layer.pages) * g.s_page : g.s_kv;
    std::byte* layer_blocks = blocks + block * g.block_bytes + l * g.layer_bytes;
    for (uint64_t kv = 0; kv < 2; ++kv) {
      std::byte* kv_blocks = layer_blocks + kv * (g.layer_bytes / 2);
      for (uint64_t h = 0; h < g.heads; ++h) {
        std::byte* src =
            layer.base + static_cast<uint64_t>(page) * g.s_page + h * g.s_head + kv * s_kv;
        for (uint64_t p = 0; p < g.page_tokens; ++p) {
          std::byte* dst = kv_blocks + ((sub * g.page_tokens + p) * g.heads + h) * g.row;
          std::byte* eng = src + p * g.s_tok;
          if (to_blocks)
            std::memcpy(dst, eng, g.row);
          else
            std::memcpy(eng, dst, g.row);
        }
      }
    }
  }
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

NB_MODULE(_kvtier, m) {
  using namespace kvtier;
  m.doc() = "kvtier: tiered KV-cache offload (host DRAM, SSD, Redis) for LLM inference engines";
  // Engine integrations keep one cache per process until exit (kvtier.backends); nanobind's
  // report of objects alive at interpreter exit would only be noise in engines' logs.
  nb::set_leak_warnings(false);
  RegisterStats(m);
  RegisterPlanner(m);
  RegisterEvents(m);

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

  nb::class_<KvLayout>(m, "KvLayout", "The shape of one KV block (all layers, K and V).")
      .def(
          "__init__",
          [](KvLayout* self, uint32_t num_layers, uint32_t num_kv_heads, uint32_t head_dim,
             const std::string& dtype, uint32_t block_tokens, const std::string& attention) {
            new (self) KvLayout{num_layers,       num_kv_heads, head_dim,
                                DTypeFrom(dtype), block_tokens, AttentionFrom(attention)};
            Check(self->Validate());
          },
          "num_layers"_a, "num_kv_heads"_a, "head_dim"_a, "dtype"_a = "bf16", "block_tokens"_a = 64,
          "attention"_a = "mha")
      .def_ro("num_layers", &KvLayout::num_layers)
      .def_ro("num_kv_heads", &KvLayout::num_kv_heads)
      .def_ro("head_dim", &KvLayout::head_dim)
      .def_ro("block_tokens", &KvLayout::block_tokens)
      .def_prop_ro("dtype", [](const KvLayout& l) { return std::string(DTypeName(l.dtype)); })
      .def_prop_ro("attention",
                   [](const KvLayout& l) { return std::string(AttentionKindName(l.attention)); })
      .def_prop_ro("bytes_per_token", &KvLayout::bytes_per_token)
      .def_prop_ro("bytes_per_block", &KvLayout::bytes_per_block)
      .def_prop_ro("layer_bytes", &KvLayout::layer_bytes)
      .def_prop_ro("fingerprint", &KvLayout::fingerprint)
      .def("__eq__", [](const KvLayout& a, const KvLayout& b) { return a == b; })
      .def("__repr__", &KvLayout::ToString);
  m.def(
      "layout_preset",
      [](const std::string& name, uint32_t block_tokens) {
        return Take(LayoutPreset(name, block_tokens));
      },
      "name"_a, "block_tokens"_a = 64);
  m.def("layout_preset_names", &LayoutPresetNames);

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
  m.def(
      "checksum64",
      [](AnyConstArray a) {
        auto b = BytesOf(a, "checksum64");
        return Checksum64(b);
      },
      "buffer"_a);

  m.def(
      "gather_pages",
      [](nb::handle layers, nb::handle page_ids, AnyArray out, const KvLayout& layout,
         uint32_t page_tokens, const std::string& kind) {
        PagedGeometry g =
            Geometry<AnyConstArray>(layers, layout, page_tokens, kind, "gather_pages");
        auto dst = BytesOf(out, "gather_pages: out");
        const uint64_t n = WholeBlocks(g, dst.size(), "gather_pages: out");
        std::vector<int64_t> ids = PageIds(page_ids, "gather_pages");
        if (ids.size() != n * g.ratio)
          RaiseInvalid("gather_pages: " + std::to_string(ids.size()) + " page ids for " +
                       std::to_string(n) + " blocks of " + std::to_string(g.ratio) + " pages");
        CheckPageIds(g, ids, "gather_pages");
        nb::gil_scoped_release release;
        for (uint64_t j = 0; j < ids.size(); ++j) CopyPage(g, dst.data(), j, ids[j], true);
      },
      "layers"_a, "page_ids"_a, "out"_a, "layout"_a, "page_tokens"_a, "kind"_a = "fused",
      "Copies an engine's paged KV into kvtier blocks: out (C-contiguous, n whole blocks of "
      "layout) block i <- pages page_ids[i*ratio:(i+1)*ratio] of every layer, ratio = "
      "layout.block_tokens / page_tokens. layers: one C-contiguous array per layer, shaped "
      "[N, H, P, 2*D] (kind 'fused') or [2, N, H, P, D] ('split'). A wrong size, shape or page "
      "id is a ValueError; nothing is copied then. Releases the GIL while copying.");
  m.def(
      "scatter_pages",
      [](AnyConstArray src, nb::handle layers, nb::handle page_ids, const KvLayout& layout,
         uint32_t page_tokens, const std::string& kind, uint32_t skip) {
        PagedGeometry g = Geometry<AnyArray>(layers, layout, page_tokens, kind, "scatter_pages");
        auto from = BytesOf(src, "scatter_pages: src");
        const uint64_t pages = WholeBlocks(g, from.size(), "scatter_pages: src") * g.ratio;
        if (skip > pages)
          RaiseInvalid("scatter_pages: skip " + std::to_string(skip) + " > the " +
                       std::to_string(pages) + " pages of src");
        std::vector<int64_t> ids = PageIds(page_ids, "scatter_pages");
        if (ids.size() != pages - skip)
          RaiseInvalid("scatter_pages: " + std::to_string(ids.size()) + " page ids for the " +
                       std::to_string(pages - skip) + " pages of src after skip " +
                       std::to_string(skip));
        CheckPageIds(g, ids, "scatter_pages");
        nb::gil_scoped_release release;
        for (uint64_t j = 0; j < ids.size(); ++j)
          CopyPage(g, const_cast<std::byte*>(from.data()), j + skip, ids[j], false);
      },
      "src"_a, "layers"_a, "page_ids"_a, "layout"_a, "page_tokens"_a, "kind"_a = "fused",
      "skip"_a = 0,
      "The reverse of gather_pages: the pages of src's blocks from the skip-th on (block i's "
      "pages are i*ratio .. i*ratio+ratio-1) are written to engine pages page_ids, every layer. "
      "Sizes and page ids are validated first (ValueError). Releases the GIL while copying.");

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

  // The interface: what the vLLM connector and any engine call. A daemon Client binds as a
  // subclass of this with only its constructor.
  nb::class_<KvCache>(m, "KvCache")
      .def_prop_ro("layout", &KvCache::layout)
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
          [](KvCache& c, const LookupResult& lookup, nb::handle dst) {
            auto blocks = Blocks<AnyArray, MutableBlock>(dst, c.layout().bytes_per_block(), "dst");
            Result<LoadResult> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = c.Load(lookup, blocks);
            }
            return Take(std::move(r));
          },
          "lookup"_a, "dst"_a,
          "Copies the lookup's first hit blocks into dst: one C-contiguous array of whole "
          "blocks, or a list of one-block arrays. Returns how many leading blocks loaded.")
      .def(
          "store",
          [](KvCache& c, const std::vector<TokenId>& tokens, nb::handle blocks,
             uint32_t first_block, const std::string& tenant, const std::string& lora_id,
             uint64_t session_id, const std::vector<EngineBlockHashes>& engine_hashes) {
            auto spans =
                Blocks<AnyConstArray, ConstBlock>(blocks, c.layout().bytes_per_block(), "blocks");
            RequestOptions rq = Request(tenant, lora_id, session_id);
            rq.engine_hashes = engine_hashes;
            Result<StoreResult> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = c.Store(tokens, spans, first_block, rq);
            }
            return Take(std::move(r));
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
            auto spans =
                Blocks<AnyConstArray, ConstBlock>(blocks, c.layout().bytes_per_block(), "blocks");
            RequestOptions rq = Request(tenant, lora_id, session_id);
            rq.engine_hashes = engine_hashes;
            Result<StoreResult> r = Status::Internal("unset");
            {
              nb::gil_scoped_release release;
              r = c.StoreKeys(keys, spans, first_block, rq);
            }
            return Take(std::move(r));
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
      .def("stats", [](const KvCache& c) { return StatsDict(c.stats()); });

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
          "flush",
          [](Cache& c) {
            nb::gil_scoped_release release;
            c.Flush();
          },
          "Waits for the background writes to lower tiers.")
      .def("prometheus_text", &Cache::PrometheusText)
      .def(
          "events_info", [](const Cache& c) { return EventsInfoDict(c.events_info()); },
          "The KV-event publisher: its endpoints, topics and counters (empty endpoint: off).");

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
      .def("flush", [](Client& c) {
        Result<uint64_t> r = Status::Internal("unset");
        {
          nb::gil_scoped_release release;
          r = c.Flush();
        }
        return Take(std::move(r));
      });
}
