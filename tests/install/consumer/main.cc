// A minimal engine embedding the installed kvtier: store a prefix, look it up, load it back.
#include <kvtier/cache.h>

#include <cstdio>
#include <cstring>
#include <vector>

int main() {
  kvtier::CacheOptions o;
  o.layout = *kvtier::LayoutPreset("llama-3.1-8b", 16);
  kvtier::TierSpec host;
  host.kind = "host";
  host.capacity_bytes = 64ull << 20;
  o.tiers = {host};
  auto cache = kvtier::Cache::Open(o);
  if (!cache.ok()) {
    std::fprintf(stderr, "open: %s\n", cache.status().ToString().c_str());
    return 1;
  }
  std::vector<kvtier::TokenId> tokens(64);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<kvtier::TokenId>(i);
  const size_t bb = o.layout.bytes_per_block();
  std::vector<std::byte> a(4 * bb, std::byte{7}), b(4 * bb);
  std::vector<kvtier::ConstBlock> in;
  std::vector<kvtier::MutableBlock> out;
  for (int i = 0; i < 4; ++i) {
    in.emplace_back(a.data() + i * bb, bb);
    out.emplace_back(b.data() + i * bb, bb);
  }
  if (!(*cache)->Store(tokens, in).ok()) return 1;
  auto lk = (*cache)->Lookup(tokens);
  if (!lk.ok() || lk->hit_blocks != 4) return 1;
  auto ld = (*cache)->Load(*lk, out);
  if (!ld.ok() || ld->loaded_blocks != 4 || std::memcmp(a.data(), b.data(), a.size()) != 0)
    return 1;
  std::printf("consumer: stored and loaded %u blocks through the installed kvtier\n",
              ld->loaded_blocks);
  return 0;
}
