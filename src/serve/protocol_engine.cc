// The engine's block hashes a reserve carries (protocol 4): doc/protocol.md.
#include "serve/protocol.h"

namespace kvtier::serve {
namespace {

// The engine's hashes of one block; bounded so a frame cannot make the daemon hold more than
// the frame's own bytes (a hash or parent at most 64 bytes, a LoRA name at most 256).
constexpr size_t kMaxEngineHash = 64;
constexpr size_t kMaxLoraName = 256;

}  // namespace

void EncodeEngineHashes(std::span<const EngineBlockHashes> v, Writer* w) {
  w->U32(static_cast<uint32_t>(v.size()));
  for (const EngineBlockHashes& e : v) {
    w->U32(static_cast<uint32_t>(e.hashes.size()));
    for (const std::string& h : e.hashes) w->Str(h);
    w->Str(e.parent_hash);
    w->U32(static_cast<uint32_t>(e.token_ids.size()));
    w->Raw(e.token_ids.data(), e.token_ids.size() * sizeof(uint32_t));
    w->Str(e.lora_name);
  }
}

bool DecodeEngineHashes(Reader* r, std::vector<EngineBlockHashes>* v) {
  uint32_t n = 0;
  if (!r->Count(&n, 16)) return false;  // an entry is at least 16 bytes of counts
  v->resize(n);
  for (EngineBlockHashes& e : *v) {
    uint32_t hashes = 0, tokens = 0;
    if (!r->Count(&hashes, 4)) return false;
    e.hashes.resize(hashes);
    for (std::string& h : e.hashes)
      if (!r->Str(&h, kMaxEngineHash)) return false;
    if (!r->Str(&e.parent_hash, kMaxEngineHash) || !r->Count(&tokens, 4)) return false;
    e.token_ids.resize(tokens);
    if (!r->Raw(e.token_ids.data(), uint64_t{tokens} * 4) || !r->Str(&e.lora_name, kMaxLoraName))
      return false;
  }
  return true;
}

}  // namespace kvtier::serve
