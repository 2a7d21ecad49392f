// GGUF: reading Llama-architecture model files (GGUF v2/v3, F32 and F16 tensors) into the
// reference engine, and writing such files (for tests and for exporting a seeded model).
//
// File layout (little-endian): "GGUF", u32 version, u64 tensor_count, u64 kv_count, then
// kv_count metadata entries (string key, u32 type, value), then tensor_count tensor infos
// (string name, u32 n_dims, u64 dims[n_dims] fastest first, u32 ggml type, u64 offset), then
// padding to general.alignment (default 32), then the tensor data at those offsets.
// Strings are u64 length + bytes. A linear weight W[out][in] has dims {in, out}.
//
// Tensor names (llama.cpp's): token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v,
// attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down}, output_norm, output (optional: tied to
// token_embd when absent), each with the ".weight" suffix.
//
// Thread-safety: free functions; a GgufWriter is not thread-safe.
#ifndef KVTIER_ENGINE_GGUF_H_
#define KVTIER_ENGINE_GGUF_H_

#include <cstdint>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/weights.h"
#include "kvtier/status.h"

namespace kvtier::engine {

struct GgufModel {
  ModelConfig config;
  Weights weights;
  uint32_t version = 0;
  uint64_t tensor_count = 0;
  // The weights fingerprint for the namespace root: "gguf-xxh128:" and 32 hex digits of an
  // XXH3-128 over the whole file, hashed at every load (the load has just read every tensor
  // byte, so this is one pass over bytes in memory; a sidecar cache could go stale).
  std::string revision;
};

// Loads a Llama GGUF file and fingerprints it. Errors name the file and the key or tensor at fault:
// NotFound when the file cannot be opened, InvalidArgument for an unsupported architecture or
// tensor type, Corruption for a malformed or truncated file.
Result<GgufModel> LoadGguf(const std::string& path);

// Builds a GGUF file in memory and writes it.
class GgufWriter {
 public:
  void AddString(const std::string& key, const std::string& value);
  void AddU32(const std::string& key, uint32_t value);
  void AddF32(const std::string& key, float value);
  // dims fastest first, as in the file; data.size() must be their product.
  void AddTensor(const std::string& name, const std::vector<uint64_t>& dims,
                 const std::vector<float>& data, bool as_f16);
  Status Write(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> bytes;
  };
  std::vector<uint8_t> kv_;
  uint64_t kv_count_ = 0;
  std::vector<Tensor> tensors_;
};

// Writes config + weights as a Llama GGUF file (F32, or F16 for the 2-D weights).
Status WriteGguf(const ModelConfig& config, const Weights& weights, const std::string& path,
                 bool f16);

// IEEE half <-> float (round to nearest even).
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_GGUF_H_
