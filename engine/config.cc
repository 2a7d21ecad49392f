#include "engine/config.h"

#include <cstdio>
#include <string>

namespace kvtier::engine {

uint64_t ModelConfig::num_params() const {
  const uint64_t d = d_model, kv = uint64_t{num_kv_heads} * head_dim();
  const uint64_t per_layer = 2 * d * d + 2 * d * kv + 3 * d * ffn_dim + 2 * d;
  return per_layer * num_layers + 2 * uint64_t{vocab_size} * d + d;
}

double ModelConfig::dense_flops_per_token() const {
  const double d = d_model, kv = double(num_kv_heads) * head_dim();
  return 2.0 * num_layers * (2 * d * d + 2 * d * kv + 3 * d * ffn_dim);
}

Status ModelConfig::Validate() const {
  auto bad = [](const char* field, const std::string& why) {
    return Status::InvalidArgument(std::string("model config: ") + field + ": " + why);
  };
  if (vocab_size == 0) return bad("vocab_size", "must be > 0");
  if (num_layers == 0) return bad("num_layers", "must be > 0");
  if (d_model == 0) return bad("d_model", "must be > 0");
  if (num_heads == 0 || d_model % num_heads != 0) {
    return bad("num_heads", "must be > 0 and divide d_model");
  }
  if (head_dim() % 2 != 0) return bad("num_heads", "head_dim must be even for RoPE");
  if (num_kv_heads == 0 || num_heads % num_kv_heads != 0) {
    return bad("num_kv_heads", "must be > 0 and divide num_heads");
  }
  if (ffn_dim == 0) return bad("ffn_dim", "must be > 0");
  if (!(rope_theta > 0)) return bad("rope_theta", "must be > 0");
  if (!(norm_eps > 0)) return bad("norm_eps", "must be > 0");
  if (max_positions == 0) return bad("max_positions", "must be > 0");
  return Status::Ok();
}

KvLayout ModelConfig::Layout(uint32_t block_tokens) const {
  KvLayout layout;
  layout.num_layers = num_layers;
  layout.num_kv_heads = num_kv_heads;
  layout.head_dim = head_dim();
  layout.dtype = DType::kFp32;
  layout.block_tokens = block_tokens;
  layout.attention = AttentionKind::kMha;
  return layout;
}

std::string ModelConfig::ToString() const {
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%s: %uL d=%u %uq/%ukv heads ffn=%u vocab=%u (%.1fM params)",
                name.c_str(), num_layers, d_model, num_heads, num_kv_heads, ffn_dim, vocab_size,
                num_params() / 1e6);
  return buf;
}

Result<ModelConfig> ModelPreset(std::string_view name) {
  ModelConfig c;
  if (name == "tiny") {
    c.name = "tiny";
    c.vocab_size = 512;
    c.num_layers = 4;
    c.d_model = 256;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.ffn_dim = 688;
    c.max_positions = 4096;
    return c;
  }
  if (name == "small") {
    c.name = "small";
    c.vocab_size = 4096;
    c.num_layers = 12;
    c.d_model = 768;
    c.num_heads = 12;
    c.num_kv_heads = 4;
    c.ffn_dim = 2048;
    c.max_positions = 32768;
    return c;
  }
  return Status::NotFound("unknown model preset '" + std::string(name) + "' (known: tiny, small)");
}

std::vector<std::string> ModelPresetNames() { return {"tiny", "small"}; }

}  // namespace kvtier::engine
