// Model: the forward pass of the reference transformer over KV in a KvPool.
//
// The unit of work is a chunk: the tokens [pos, pos + n) of a sequence, all inside one KV
// block (pos / block_tokens == (pos + n - 1) / block_tokens). Prefill runs one chunk per block,
// aligned to absolute block boundaries; decode runs chunks of one token. ForwardChunk is a
// pure function of (the chunk's tokens, pos, n, the KV of earlier positions, the thread
// count): every sgemm it issues has shapes fixed by (pos, n) alone, and attention gathers the
// K and V of positions [0, pos + n) from the blocks in order 0, 1, 2, ... and runs one scores
// sgemm and one P*V sgemm over them per KV head. So a chunk computed after its prefix was loaded
// from a tier does exactly the arithmetic it does in a full prefill, and its logits match bit for
// bit.
//
// Thread-safety: none (scratch buffers are members); use one Model per thread. OpenBLAS's
// thread count is process-global: SetBlasThreads() before any forward pass.
#ifndef KVTIER_ENGINE_MODEL_H_
#define KVTIER_ENGINE_MODEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "engine/config.h"
#include "engine/kv_pool.h"
#include "engine/weights.h"
#include "kvtier/block_key.h"
#include "kvtier/status.h"

namespace kvtier::engine {

// openblas_set_num_threads(threads); results are deterministic for a given count.
void SetBlasThreads(int threads);
int BlasThreads();

class Model {
 public:
  // InvalidArgument when the config is bad or the weights do not fit it.
  // The weights are shared (read-only) between models, e.g. an engine and its reference.
  static Result<Model> Create(ModelConfig config, std::shared_ptr<const Weights> weights);

  const ModelConfig& config() const { return config_; }
  const Weights& weights() const { return *weights_; }
  std::shared_ptr<const Weights> shared_weights() const { return weights_; }

  // Runs tokens at positions [pos, pos + tokens.size()) through every layer, writing their K
  // and V into pool blocks table[pos / bt] and reading earlier positions' KV from
  // table[0 .. pos / bt]. When logits is not null it receives the vocab_size logits of the
  // last token. InvalidArgument when the chunk spans two blocks, a token is out of the
  // vocabulary, the table is too short or the position is past max_positions.
  Status ForwardChunk(std::span<const TokenId> tokens, uint32_t pos, std::span<const BlockId> table,
                      KvPool* pool, std::vector<float>* logits);

  // The chunks [pos, pos + n) of prompt, run layer by layer: layer l of every chunk (in the
  // order given) before layer l + 1 of any, calling before_layer(l) first (a layer-wise load
  // waits there for layer l of its blocks; a non-OK Status stops the pass and is returned).
  // Each chunk does exactly ForwardChunk's arithmetic on the same inputs, so the KV and logits
  // (of the last chunk's last token) match chunk-by-chunk prefill bit for bit. Errors as
  // ForwardChunk's, checked for every chunk before any runs.
  struct Chunk {
    uint32_t pos = 0;
    uint32_t n = 0;
  };
  using LayerGate = std::function<Status(uint32_t layer)>;
  Status ForwardLayerwise(std::span<const TokenId> prompt, std::span<const Chunk> chunks,
                          std::span<const BlockId> table, KvPool* pool, std::vector<float>* logits,
                          const LayerGate& before_layer);

 private:
  // A chunk between layers: its hidden state and RoPE tables.
  struct ChunkState {
    uint32_t pos = 0, n = 0;
    std::vector<float> x, cos, sin;
  };
  Model(ModelConfig config, std::shared_ptr<const Weights> weights);
  Status CheckChunk(std::span<const TokenId> tokens, uint32_t pos, std::span<const BlockId> table,
                    const KvPool& pool) const;
  void BeginChunk(std::span<const TokenId> tokens, uint32_t pos, ChunkState* s) const;
  void Rope(const ChunkState& s, float* rows, uint32_t heads, uint32_t stride) const;
  void Layer(uint32_t layer, ChunkState* s, std::span<const BlockId> table, KvPool* pool);
  void Logits(const ChunkState& s, std::vector<float>* logits);
  void Attention(uint32_t layer, uint32_t pos, uint32_t n, std::span<const BlockId> table,
                 KvPool* pool);

  ModelConfig config_;
  std::shared_ptr<const Weights> weights_;
  std::vector<float> inv_freq_;  // RoPE: theta^(-2i/head_dim)
  // Scratch, resized on demand.
  std::vector<float> h_, q_, attn_, tmp_, gate_, up_, qg_, scores_, outg_, kc_, vc_, inv_sum_;
  ChunkState chunk_;
  std::vector<ChunkState> layerwise_;
};

}  // namespace kvtier::engine

#endif  // KVTIER_ENGINE_MODEL_H_
