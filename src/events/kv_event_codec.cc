#include "events/kv_event_codec.h"

#define MSGPACK_NO_BOOST 1
#include <msgpack.hpp>

namespace kvtier::events {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void Str(Packer& pk, std::string_view s) {
  pk.pack_str(static_cast<uint32_t>(s.size()));
  pk.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void Bin(Packer& pk, std::string_view b) {
  pk.pack_bin(static_cast<uint32_t>(b.size()));
  pk.pack_bin_body(b.data(), static_cast<uint32_t>(b.size()));
}

void StrOrNil(Packer& pk, std::string_view s) {
  if (s.empty()) {
    pk.pack_nil();
  } else {
    Str(pk, s);
  }
}

}  // namespace

std::string KeyBytes(const BlockKey& key) {
  std::string b(16, '\0');
  for (int i = 0; i < 8; ++i) {
    b[i] = static_cast<char>(key.hi >> (56 - 8 * i));
    b[8 + i] = static_cast<char>(key.lo >> (56 - 8 * i));
  }
  return b;
}

uint64_t EngineHashInt(std::string_view hash) {
  uint64_t v = 0;
  const size_t from = hash.size() > 8 ? hash.size() - 8 : 0;
  for (size_t i = from; i < hash.size(); ++i) v = v << 8 | static_cast<uint8_t>(hash[i]);
  return v;
}

BatchEncoder::BatchEncoder(uint32_t block_size, uint32_t data_parallel_rank, bool int_hashes)
    : block_size_(block_size), dp_rank_(data_parallel_rank), int_hashes_(int_hashes) {}

void BatchEncoder::Cleared() { groups_.push_back(Group{Kind::kCleared, {}, {}, nullptr}); }

void BatchEncoder::Add(Kind kind, const BlockKey& key, std::string_view medium) {
  if (groups_.empty() || groups_.back().kind != kind || groups_.back().engine != nullptr ||
      groups_.back().medium != medium)
    groups_.push_back(Group{kind, medium, {}, nullptr});
  groups_.back().keys.push_back(key);
}

void BatchEncoder::Stored(const BlockKey& key, std::string_view medium) {
  Add(Kind::kStored, key, medium);
}

void BatchEncoder::Removed(const BlockKey& key, std::string_view medium) {
  Add(Kind::kRemoved, key, medium);
}

void BatchEncoder::EngineStored(const EngineBlockHashes* engine, std::string_view medium) {
  groups_.push_back(Group{Kind::kStored, medium, {}, engine});
}

void BatchEncoder::EngineRemoved(const EngineBlockHashes* engine, std::string_view medium) {
  groups_.push_back(Group{Kind::kRemoved, medium, {}, engine});
}

std::string BatchEncoder::Finish(double ts) const {
  msgpack::sbuffer buf;
  Packer pk(&buf);
  pk.pack_array(3);
  pk.pack_double(ts);  // msgspec writes a float as float64
  pk.pack_array(static_cast<uint32_t>(groups_.size()));
  for (const Group& g : groups_) {
    const EngineBlockHashes* e = g.engine;
    const uint32_t n = e ? static_cast<uint32_t>(e->hashes.size()) : uint32_t(g.keys.size());
    auto engine_hash = [&](std::string_view h) {
      if (int_hashes_) {
        pk.pack_uint64(EngineHashInt(h));
      } else {
        Bin(pk, h);
      }
    };
    auto hashes = [&] {
      Str(pk, "block_hashes");
      pk.pack_array(n);
      for (uint32_t i = 0; i < n; ++i) {
        if (e) {
          engine_hash(e->hashes[i]);
        } else {
          Bin(pk, KeyBytes(g.keys[i]));
        }
      }
    };
    switch (g.kind) {
      case Kind::kCleared:
        pk.pack_map(1);
        Str(pk, "type");
        Str(pk, "AllBlocksCleared");
        break;
      case Kind::kRemoved:
        pk.pack_map(3);
        Str(pk, "type");
        Str(pk, "BlockRemoved");
        hashes();
        Str(pk, "medium");
        StrOrNil(pk, g.medium);
        break;
      case Kind::kStored: {
        pk.pack_map(8);
        Str(pk, "type");
        Str(pk, "BlockStored");
        hashes();
        Str(pk, "parent_block_hash");
        if (e && !e->parent_hash.empty()) {
          engine_hash(e->parent_hash);
        } else {
          pk.pack_nil();  // kvtier keys: the parent is not at hand where the index changes
        }
        Str(pk, "token_ids");
        const size_t tokens = e ? e->token_ids.size() : 0;
        pk.pack_array(static_cast<uint32_t>(tokens));
        for (size_t i = 0; i < tokens; ++i) pk.pack_uint32(e->token_ids[i]);
        Str(pk, "block_size");
        // An engine block is a slice of a kvtier block: block_tokens / engine blocks inside it.
        pk.pack_uint32(e && n > 0 ? block_size_ / n : block_size_);
        Str(pk, "lora_id");
        pk.pack_nil();  // deprecated in vLLM; lora_name carries it
        Str(pk, "medium");
        StrOrNil(pk, g.medium);
        Str(pk, "lora_name");
        StrOrNil(pk, e ? std::string_view(e->lora_name) : std::string_view());
        break;
      }
    }
  }
  pk.pack_uint32(dp_rank_);
  return std::string(buf.data(), buf.size());
}

}  // namespace kvtier::events
