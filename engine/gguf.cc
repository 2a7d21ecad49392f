#include "engine/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <utility>

#include "hash/xxh.h"

namespace kvtier::engine {
namespace {

enum GgufType : uint32_t {
  kU8 = 0,
  kI8,
  kU16,
  kI16,
  kU32,
  kI32,
  kF32,
  kBool,
  kString,
  kArray,
  kU64,
  kI64,
  kF64,
};
constexpr uint32_t kGgmlF32 = 0;
constexpr uint32_t kGgmlF16 = 1;
constexpr uint32_t kMagic = 0x46554747;                // "GGUF" read as a little-endian u32
constexpr uint64_t kMaxCount = uint64_t{1} << 20;      // tensors or metadata entries
constexpr uint64_t kMaxAlignment = uint64_t{1} << 31;  // llama.cpp reads it as a u32

// A scalar metadata value; arrays keep only their length (the vocabulary is not needed).
struct Value {
  uint32_t type = 0;
  double number = 0;
  std::string text;  // the number as the file wrote it, exactly (a u64 can exceed a double)
  std::string str;
  uint64_t array_len = 0;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size, std::string file)
      : data_(data), size_(size), file_(std::move(file)) {}
  size_t pos() const { return pos_; }
  template <typename T>
  bool Read(T* out) {
    if (size_ - pos_ < sizeof(T)) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // A u64 length then the bytes; Corruption naming `what` and the length when it does not fit.
  Status ReadString(std::string* out, const std::string& what) {
    uint64_t len;
    if (!Read(&len)) return Truncated(what);
    if (len > size_ - pos_) {
      return Malformed(what + ": string length " + std::to_string(len) + " exceeds the " +
                       std::to_string(size_ - pos_) + " bytes left");
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }
  size_t left() const { return size_ - pos_; }
  bool Skip(uint64_t n) {
    if (n > size_ - pos_) return false;
    pos_ += n;
    return true;
  }
  Status Truncated(const std::string& what) const {
    return Status::Corruption(file_ + ": truncated or malformed at byte " + std::to_string(pos_) +
                              " (" + what + ")");
  }
  Status Malformed(const std::string& what) const {
    return Status::Corruption(file_ + ": " + what + " (at byte " + std::to_string(pos_) + ")");
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string file_;
};

size_t ScalarSize(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
      return 8;
    default:
      return 0;
  }
}

std::string NumberText(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}

bool ReadScalar(Reader* r, uint32_t type, Value* out) {
  switch (type) {
#define KVTIER_GGUF_CASE(tag, ctype, to_text) \
  case tag: {                                 \
    ctype v;                                  \
    if (!r->Read(&v)) return false;           \
    out->number = static_cast<double>(v);     \
    out->text = to_text(v);                   \
    return true;                              \
  }
    KVTIER_GGUF_CASE(kU8, uint8_t, std::to_string)
    KVTIER_GGUF_CASE(kI8, int8_t, std::to_string)
    KVTIER_GGUF_CASE(kBool, uint8_t, std::to_string)
    KVTIER_GGUF_CASE(kU16, uint16_t, std::to_string)
    KVTIER_GGUF_CASE(kI16, int16_t, std::to_string)
    KVTIER_GGUF_CASE(kU32, uint32_t, std::to_string)
    KVTIER_GGUF_CASE(kI32, int32_t, std::to_string)
    KVTIER_GGUF_CASE(kF32, float, NumberText)
    KVTIER_GGUF_CASE(kU64, uint64_t, std::to_string)
    KVTIER_GGUF_CASE(kI64, int64_t, std::to_string)
    KVTIER_GGUF_CASE(kF64, double, NumberText)
#undef KVTIER_GGUF_CASE
    default:
      return false;
  }
}

// v as an integer in [lo, hi] (hi < 2^53, exact in a double). Checked before the cast: a
// fraction, NaN, negative or oversized value would convert with undefined behaviour.
bool IntegerIn(const Value& v, uint64_t lo, uint64_t hi, uint64_t* out) {
  const double x = v.number;
  if (!std::isfinite(x) || std::floor(x) != x || x < static_cast<double>(lo) ||
      x > static_cast<double>(hi)) {
    return false;
  }
  *out = static_cast<uint64_t>(x);
  return true;
}

class MappedFile {
 public:
  ~MappedFile() {
    if (data_ != nullptr) munmap(data_, size_);
  }
  Status Open(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Status::NotFound(path + ": cannot open: " + std::strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
      ::close(fd);
      return Status::Unavailable(path + ": fstat: " + std::strerror(errno));
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ == 0) {
      ::close(fd);
      return Status::Corruption(path + ": empty file");
    }
    void* p = mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return Status::Unavailable(path + ": mmap: " + std::strerror(errno));
    data_ = p;
    return Status::Ok();
  }
  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

struct TensorInfo {
  std::vector<uint64_t> dims;
  uint32_t type = 0;
  uint64_t offset = 0;
};

void PutBytes(std::vector<uint8_t>* out, const void* p, size_t n) {
  const uint8_t* b = static_cast<const uint8_t*>(p);
  out->insert(out->end(), b, b + n);
}
template <typename T>
void Put(std::vector<uint8_t>* out, T v) {
  PutBytes(out, &v, sizeof(T));
}
void PutString(std::vector<uint8_t>* out, const std::string& s) {
  Put<uint64_t>(out, s.size());
  PutBytes(out, s.data(), s.size());
}

}  // namespace

float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ffu, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

uint16_t FloatToHalf(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) return sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0);  // inf/nan
  if (abs >= 0x477ff000u) return sign | 0x7c00u;                                     // overflow
  if (abs < 0x38800000u) {  // subnormal or zero in half
    if (abs < 0x33000000u) return sign;
    const uint32_t mant = (abs & 0x7fffffu) | 0x800000u;
    const int shift = 126 - static_cast<int>(abs >> 23);  // 14..24: value / 2^-24
    const uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1), mid = 1u << (shift - 1);
    return sign | static_cast<uint16_t>(half + (rem > mid || (rem == mid && (half & 1))));
  }
  const uint32_t rounded = abs + 0xfffu + ((abs >> 13) & 1);  // round to nearest even
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

Result<GgufModel> LoadGguf(const std::string& path) {
  MappedFile file;
  KVTIER_RETURN_IF_ERROR(file.Open(path));
  Reader r(file.data(), file.size(), path);
  uint32_t magic = 0, version = 0;
  uint64_t tensor_count = 0, kv_count = 0;
  if (!r.Read(&magic) || magic != kMagic) {
    return Status::InvalidArgument(path + ": not a GGUF file (bad magic)");
  }
  if (!r.Read(&version)) return r.Truncated("version");
  if (version != 2 && version != 3) {
    return Status::InvalidArgument(path + ": GGUF version " + std::to_string(version) +
                                   " not supported (2 and 3 are)");
  }
  if (!r.Read(&tensor_count) || !r.Read(&kv_count)) return r.Truncated("header counts");
  for (auto [field, count] :
       {std::pair{"tensor_count", tensor_count}, std::pair{"kv_count", kv_count}}) {
    if (count > kMaxCount) {
      return Status::Corruption(path + ": header " + field + " " + std::to_string(count) +
                                " is implausible (at most " + std::to_string(kMaxCount) + ")");
    }
  }

  std::map<std::string, Value> meta;
  for (uint64_t i = 0; i < kv_count; ++i) {
    std::string key;
    Value v;
    KVTIER_RETURN_IF_ERROR(r.ReadString(&key, "metadata key " + std::to_string(i)));
    if (!r.Read(&v.type)) return r.Truncated("type of " + key);
    if (v.type == kString) {
      KVTIER_RETURN_IF_ERROR(r.ReadString(&v.str, "metadata " + key));
    } else if (v.type == kArray) {
      uint32_t elem;
      if (!r.Read(&elem) || !r.Read(&v.array_len)) return r.Truncated("array header of " + key);
      // Every element takes at least this many bytes (a string its u64 length): a longer
      // array cannot fit, and looping over it would spin on a hostile length.
      const size_t min_elem = elem == kString ? sizeof(uint64_t) : ScalarSize(elem);
      if (min_elem != 0 && v.array_len > r.left() / min_elem) {
        return r.Malformed("metadata " + key + ": array length " + std::to_string(v.array_len) +
                           " of " + std::to_string(min_elem) + "+ byte elements exceeds the " +
                           std::to_string(r.left()) + " bytes left");
      }
      if (elem == kString) {
        for (uint64_t k = 0; k < v.array_len; ++k) {
          std::string s;
          KVTIER_RETURN_IF_ERROR(
              r.ReadString(&s, "metadata " + key + " element " + std::to_string(k)));
        }
      } else if (min_elem != 0) {
        if (!r.Skip(v.array_len * min_elem)) return r.Truncated("array " + key);
      } else {
        return Status::InvalidArgument(path + ": metadata " + key +
                                       ": nested or unknown array element type " +
                                       std::to_string(elem));
      }
    } else if (ScalarSize(v.type) != 0) {
      if (!ReadScalar(&r, v.type, &v)) return r.Truncated("value of " + key);
    } else {
      return Status::Corruption(path + ": metadata " + key + ": unknown type " +
                                std::to_string(v.type));
    }
    meta[key] = std::move(v);
  }

  std::map<std::string, TensorInfo> tensors;
  for (uint64_t i = 0; i < tensor_count; ++i) {
    std::string name;
    uint32_t n_dims;
    TensorInfo t;
    KVTIER_RETURN_IF_ERROR(r.ReadString(&name, "name of tensor " + std::to_string(i)));
    if (!r.Read(&n_dims)) return r.Truncated("tensor info " + name);
    if (n_dims == 0 || n_dims > 4) {
      return Status::Corruption(path + ": tensor " + name + ": " + std::to_string(n_dims) +
                                " dimensions");
    }
    t.dims.resize(n_dims);
    for (uint64_t& dim : t.dims) {
      if (!r.Read(&dim)) return r.Truncated("dims of " + name);
    }
    if (!r.Read(&t.type) || !r.Read(&t.offset)) return r.Truncated("tensor info " + name);
    tensors[name] = std::move(t);
  }

  uint64_t alignment = 32;
  if (auto it = meta.find("general.alignment"); it != meta.end()) {
    const Value& v = it->second;
    if (ScalarSize(v.type) == 0 || !IntegerIn(v, 1, kMaxAlignment, &alignment) ||
        (alignment & (alignment - 1)) != 0) {
      return Status::Corruption(path + ": general.alignment " +
                                (ScalarSize(v.type) == 0 ? "(not a number)" : v.text) +
                                " is not a power of two in [1, 2^31]");
    }
  }
  const uint64_t data_start = (r.pos() + alignment - 1) / alignment * alignment;

  auto str_meta = [&](const std::string& key) -> std::optional<std::string> {
    auto it = meta.find(key);
    if (it == meta.end() || it->second.type != kString) return std::nullopt;
    return it->second.str;
  };
  auto num_meta = [&](const std::string& key) -> const Value* {
    auto it = meta.find(key);
    if (it == meta.end() || ScalarSize(it->second.type) == 0) return nullptr;
    return &it->second;
  };
  const std::string arch = str_meta("general.architecture").value_or("");
  if (arch != "llama") {
    return Status::InvalidArgument(path + ": general.architecture is '" + arch +
                                   "'; only 'llama' is supported");
  }
  GgufModel model;
  model.version = version;
  model.tensor_count = tensor_count;
  ModelConfig& c = model.config;
  c.name = str_meta("general.name").value_or("gguf");
  // A count or size: an integer in [1, 1e9], so it fits the config's u32.
  auto need = [&](const char* key, uint32_t* out) -> Status {
    const Value* v = num_meta(key);
    if (v == nullptr) {
      return Status::InvalidArgument(path + ": metadata " + key +
                                     (meta.count(key) ? ": not a number" : ": missing"));
    }
    uint64_t n;
    if (!IntegerIn(*v, 1, 1000000000, &n)) {
      return Status::InvalidArgument(path + ": metadata " + key + ": " + v->text +
                                     " is not an integer in [1, 1e9]");
    }
    *out = static_cast<uint32_t>(n);
    return Status::Ok();
  };
  // A float field: finite and within float range (converting one outside it is undefined).
  auto need_float = [&](const char* key, float* out) -> Status {
    const Value* v = num_meta(key);
    if (v == nullptr) {
      return Status::InvalidArgument(path + ": metadata " + key + ": not a number");
    }
    if (!std::isfinite(v->number) || std::fabs(v->number) > FLT_MAX) {
      return Status::InvalidArgument(path + ": metadata " + key + ": " + v->text +
                                     " is not a finite 32-bit float");
    }
    *out = static_cast<float>(v->number);
    return Status::Ok();
  };
  KVTIER_RETURN_IF_ERROR(need("llama.block_count", &c.num_layers));
  KVTIER_RETURN_IF_ERROR(need("llama.embedding_length", &c.d_model));
  KVTIER_RETURN_IF_ERROR(need("llama.feed_forward_length", &c.ffn_dim));
  KVTIER_RETURN_IF_ERROR(need("llama.attention.head_count", &c.num_heads));
  c.num_kv_heads = c.num_heads;
  if (meta.count("llama.attention.head_count_kv")) {
    KVTIER_RETURN_IF_ERROR(need("llama.attention.head_count_kv", &c.num_kv_heads));
  }
  if (meta.count("llama.context_length")) {
    KVTIER_RETURN_IF_ERROR(need("llama.context_length", &c.max_positions));
  }
  if (meta.count("llama.rope.freq_base")) {
    KVTIER_RETURN_IF_ERROR(need_float("llama.rope.freq_base", &c.rope_theta));
  }
  if (meta.count("llama.attention.layer_norm_rms_epsilon")) {
    KVTIER_RETURN_IF_ERROR(need_float("llama.attention.layer_norm_rms_epsilon", &c.norm_eps));
  }
  auto embd = tensors.find("token_embd.weight");
  if (embd == tensors.end() || embd->second.dims.size() != 2) {
    return Status::InvalidArgument(path + ": tensor token_embd.weight: missing or not 2-D");
  }
  // The vocabulary is a u32 in the config and an int in the BLAS calls.
  if (const uint64_t vocab = embd->second.dims[1]; vocab == 0 || vocab > INT32_MAX) {
    return Status::InvalidArgument(path + ": tensor token_embd.weight: dimension 1 (vocabulary) " +
                                   std::to_string(vocab) + " is not in [1, 2^31)");
  }
  c.vocab_size = static_cast<uint32_t>(embd->second.dims[1]);
  if (const Value* v = num_meta("llama.rope.dimension_count"); v && v->number != c.head_dim()) {
    return Status::InvalidArgument(path + ": llama.rope.dimension_count " + v->text +
                                   " != head_dim: partial rotary embeddings are not supported");
  }
  if (Status st = c.Validate(); !st.ok()) return st.WithContext(path);

  uint64_t loaded_bytes = 0;
  auto load = [&](const std::string& name, std::vector<float>* out, bool optional) -> Status {
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      if (optional) return Status::Ok();
      // A hostile llama.block_count ends here, at the first layer the file lacks.
      return Status::InvalidArgument(
          path + ": tensor " + name + ": missing" +
          (name.starts_with("blk.") ? " (llama.block_count is " + std::to_string(c.num_layers) + ")"
                                    : ""));
    }
    const TensorInfo& t = it->second;
    uint64_t count = 1;
    for (size_t k = 0; k < t.dims.size(); ++k) {
      if (t.dims[k] == 0 || t.dims[k] > (uint64_t{1} << 40) / count) {
        return Status::Corruption(path + ": tensor " + name + ": bad dimensions: dimension " +
                                  std::to_string(k) + " is " + std::to_string(t.dims[k]) +
                                  " (elements must number 1 to 2^40)");
      }
      count *= t.dims[k];
    }
    size_t elem;
    if (t.type == kGgmlF32) {
      elem = 4;
    } else if (t.type == kGgmlF16) {
      elem = 2;
    } else {
      return Status::InvalidArgument(path + ": tensor " + name + ": ggml type " +
                                     std::to_string(t.type) +
                                     " not supported (F32 and F16 only; dequantize first)");
    }
    const uint64_t bytes = count * elem;  // <= 2^42: no overflow
    const uint64_t data_bytes = data_start <= file.size() ? file.size() - data_start : 0;
    if (t.offset > data_bytes || bytes > data_bytes - t.offset) {
      return Status::Corruption(path + ": tensor " + name + ": offset " + std::to_string(t.offset) +
                                " + " + std::to_string(bytes) + " bytes is past the end of the " +
                                std::to_string(data_bytes) + "-byte data section");
    }
    // Tensors may not overlap (llama.cpp requires them packed), so what they load together
    // fits the file: overlapping ones could make a small file allocate without bound.
    loaded_bytes += bytes;
    if (loaded_bytes > data_bytes) {
      return Status::Corruption(path + ": tensor " + name + ": tensors total " +
                                std::to_string(loaded_bytes) + " bytes, more than the " +
                                std::to_string(data_bytes) + "-byte data section (they overlap)");
    }
    out->resize(count);
    const uint8_t* src = file.data() + data_start + t.offset;
    if (elem == 4) {
      std::memcpy(out->data(), src, count * 4);
    } else {
      for (uint64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, src + 2 * i, 2);
        (*out)[i] = HalfToFloat(h);
      }
    }
    return Status::Ok();
  };
  Weights& w = model.weights;
  KVTIER_RETURN_IF_ERROR(load("token_embd.weight", &w.embedding, false));
  // Grown per layer: llama.block_count may be up to 1e9, and a file lacking that many layers
  // fails at its first missing tensor instead of allocating them all.
  for (uint32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers.emplace_back();
    KVTIER_RETURN_IF_ERROR(load(p + "attn_norm.weight", &l.attn_norm, false));
    KVTIER_RETURN_IF_ERROR(load(p + "attn_q.weight", &l.wq, false));
    KVTIER_RETURN_IF_ERROR(load(p + "attn_k.weight", &l.wk, false));
    KVTIER_RETURN_IF_ERROR(load(p + "attn_v.weight", &l.wv, false));
    KVTIER_RETURN_IF_ERROR(load(p + "attn_output.weight", &l.wo, false));
    KVTIER_RETURN_IF_ERROR(load(p + "ffn_norm.weight", &l.ffn_norm, false));
    KVTIER_RETURN_IF_ERROR(load(p + "ffn_gate.weight", &l.w_gate, false));
    KVTIER_RETURN_IF_ERROR(load(p + "ffn_up.weight", &l.w_up, false));
    KVTIER_RETURN_IF_ERROR(load(p + "ffn_down.weight", &l.w_down, false));
  }
  KVTIER_RETURN_IF_ERROR(load("output_norm.weight", &w.final_norm, false));
  KVTIER_RETURN_IF_ERROR(load("output.weight", &w.output, true));
  if (Status st = w.CheckShapes(c); !st.ok()) return st.WithContext(path);
  const XXH128_hash_t h = XXH3_128bits(file.data(), file.size());
  char hex[33];
  std::snprintf(hex, sizeof(hex), "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  model.revision = std::string("gguf-xxh128:") + hex;
  return model;
}

void GgufWriter::AddString(const std::string& key, const std::string& value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, kString);
  PutString(&kv_, value);
  ++kv_count_;
}

void GgufWriter::AddU32(const std::string& key, uint32_t value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, kU32);
  Put<uint32_t>(&kv_, value);
  ++kv_count_;
}

void GgufWriter::AddF32(const std::string& key, float value) {
  PutString(&kv_, key);
  Put<uint32_t>(&kv_, kF32);
  Put<float>(&kv_, value);
  ++kv_count_;
}

void GgufWriter::AddTensor(const std::string& name, const std::vector<uint64_t>& dims,
                           const std::vector<float>& data, bool as_f16) {
  Tensor t{name, dims, as_f16 ? kGgmlF16 : kGgmlF32, {}};
  if (as_f16) {
    t.bytes.resize(data.size() * 2);
    for (size_t i = 0; i < data.size(); ++i) {
      const uint16_t h = FloatToHalf(data[i]);
      std::memcpy(&t.bytes[2 * i], &h, 2);
    }
  } else {
    PutBytes(&t.bytes, data.data(), data.size() * 4);
  }
  tensors_.push_back(std::move(t));
}

Status GgufWriter::Write(const std::string& path) const {
  constexpr uint64_t kAlign = 32;
  std::vector<uint8_t> out;
  Put<uint32_t>(&out, kMagic);
  Put<uint32_t>(&out, 3);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, kv_count_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.dims.size()));
    for (uint64_t dim : t.dims) Put<uint64_t>(&out, dim);
    Put<uint32_t>(&out, t.type);
    Put<uint64_t>(&out, offset);
    offset += (t.bytes.size() + kAlign - 1) / kAlign * kAlign;
  }
  out.resize((out.size() + kAlign - 1) / kAlign * kAlign, 0);
  for (const Tensor& t : tensors_) {
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    out.resize((out.size() + kAlign - 1) / kAlign * kAlign, 0);
  }
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) return Status::Unavailable(path + ": cannot create");
  f.write(reinterpret_cast<const char*>(out.data()), static_cast<std::streamsize>(out.size()));
  f.close();
  if (!f) return Status::Unavailable(path + ": write failed");
  return Status::Ok();
}

Status WriteGguf(const ModelConfig& c, const Weights& w, const std::string& path, bool f16) {
  KVTIER_RETURN_IF_ERROR(c.Validate());
  KVTIER_RETURN_IF_ERROR(w.CheckShapes(c));
  GgufWriter g;
  g.AddString("general.architecture", "llama");
  g.AddString("general.name", c.name);
  g.AddU32("llama.block_count", c.num_layers);
  g.AddU32("llama.embedding_length", c.d_model);
  g.AddU32("llama.feed_forward_length", c.ffn_dim);
  g.AddU32("llama.attention.head_count", c.num_heads);
  g.AddU32("llama.attention.head_count_kv", c.num_kv_heads);
  g.AddU32("llama.context_length", c.max_positions);
  g.AddU32("llama.rope.dimension_count", c.head_dim());
  g.AddF32("llama.rope.freq_base", c.rope_theta);
  g.AddF32("llama.attention.layer_norm_rms_epsilon", c.norm_eps);
  const uint64_t d = c.d_model, q = uint64_t{c.num_heads} * c.head_dim(),
                 kv = uint64_t{c.num_kv_heads} * c.head_dim(), f = c.ffn_dim;
  g.AddTensor("token_embd.weight", {d, c.vocab_size}, w.embedding, f16);
  for (uint32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const LayerWeights& l = w.layers[i];
    g.AddTensor(p + "attn_norm.weight", {d}, l.attn_norm, false);  // norms stay F32
    g.AddTensor(p + "attn_q.weight", {d, q}, l.wq, f16);
    g.AddTensor(p + "attn_k.weight", {d, kv}, l.wk, f16);
    g.AddTensor(p + "attn_v.weight", {d, kv}, l.wv, f16);
    g.AddTensor(p + "attn_output.weight", {q, d}, l.wo, f16);
    g.AddTensor(p + "ffn_norm.weight", {d}, l.ffn_norm, false);
    g.AddTensor(p + "ffn_gate.weight", {d, f}, l.w_gate, f16);
    g.AddTensor(p + "ffn_up.weight", {d, f}, l.w_up, f16);
    g.AddTensor(p + "ffn_down.weight", {f, d}, l.w_down, f16);
  }
  g.AddTensor("output_norm.weight", {d}, w.final_norm, false);
  if (!w.output.empty()) g.AddTensor("output.weight", {d, c.vocab_size}, w.output, f16);
  return g.Write(path);
}

}  // namespace kvtier::engine
