#include "kvtier/block_key.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>

#include "hash/xxh.h"
#include "testing/test_util.h"

namespace kvtier {
namespace {

using testing::Tokens;

BlockKey Root() { return Namespace{"m", "", 7, "", ""}.Root(); }

TEST(BlockKeyTest, ChainIsXxh3OfParentAndTokens) {
  // The documented encoding (doc/layout.md): parent hi, parent lo (LE64), tokens (LE32).
  std::vector<TokenId> t = Tokens(4, 100);
  BlockKey parent{0x0102030405060708ull, 0x1112131415161718ull};
  unsigned char buf[16 + 16];
  for (int i = 0; i < 8; ++i) {
    buf[i] = static_cast<unsigned char>(parent.hi >> (8 * i));
    buf[8 + i] = static_cast<unsigned char>(parent.lo >> (8 * i));
  }
  for (int i = 0; i < 4; ++i)
    for (int b = 0; b < 4; ++b) buf[16 + 4 * i + b] = static_cast<unsigned char>(t[i] >> (8 * b));
  XXH128_hash_t h = XXH3_128bits(buf, sizeof(buf));
  EXPECT_EQ(ChainKey(parent, t), (BlockKey{h.high64, h.low64}));
}

TEST(BlockKeyTest, StateKeysAreOneTokenChainsApartFromTheChain) {
  // doc/layout.md, "State records": key p = the key of token 0xFFFFFFFF - p chained on the block.
  const BlockKey block{0x0102030405060708ull, 0x1112131415161718ull};
  const std::vector<BlockKey> keys = StateKeys(block, 3);
  ASSERT_EQ(keys.size(), 3u);
  for (uint32_t p = 0; p < 3; ++p) {
    const TokenId t[1] = {0xFFFFFFFFu - p};
    EXPECT_EQ(keys[p], ChainKey(block, t)) << p;
  }
  std::vector<BlockKey> chain;
  HashPrefix(Root(), 4, Tokens(12, 1), &chain);
  std::set<std::pair<uint64_t, uint64_t>> all;
  for (const BlockKey& k : chain) {
    all.insert({k.hi, k.lo});
    for (const BlockKey& s : StateKeys(k, 2)) all.insert({s.hi, s.lo});
  }
  EXPECT_EQ(all.size(), 9u);
  EXPECT_TRUE(StateKeys(block, 0).empty());
}

TEST(BlockKeyTest, GoldenValuesAreStable) {
  // Keys are shared across processes and machines: these must never change (they did once, for
  // the v2 root that carries the model revision).
  BlockKey root = Namespace{"llama-3.1-8b", "", 0x1234, "tenant-a", ""}.Root();
  std::vector<BlockKey> chain;
  HashPrefix(root, 4, Tokens(8), &chain);
  ASSERT_EQ(chain.size(), 2u);
  EXPECT_EQ(root.ToHex(), "0604a8f11f16cf1b00b59c3b6be0e79b") << root.ToHex();
  EXPECT_EQ(chain[1].ToHex(), "a9af1f4b1d6952d587b3edbcec44db63") << chain[1].ToHex();
}

TEST(BlockKeyTest, PartialBlockHasNoKey) {
  std::vector<BlockKey> chain;
  HashPrefix(Root(), 4, Tokens(11), &chain);
  EXPECT_EQ(chain.size(), 2u);
  HashPrefix(Root(), 4, Tokens(3), &chain);
  EXPECT_TRUE(chain.empty());
}

TEST(BlockKeyTest, IncrementalEqualsWhole) {
  std::vector<TokenId> t = Tokens(103, 5);
  std::vector<BlockKey> whole;
  HashPrefix(Root(), 8, t, &whole);
  PrefixHasher h(Root(), 8);
  // Turns of uneven length, as an agent's context grows.
  size_t cuts[] = {0, 3, 17, 17, 40, 64, 103};
  for (size_t i = 1; i < std::size(cuts); ++i)
    h.Extend(std::span<const TokenId>(t).subspan(cuts[i - 1], cuts[i] - cuts[i - 1]));
  EXPECT_EQ(h.keys(), whole);
  EXPECT_EQ(h.pending_tokens(), 103u % 8);
}

TEST(BlockKeyTest, EqualPrefixesMeetDifferentOnesDoNot) {
  std::vector<TokenId> a = Tokens(32), b = Tokens(32);
  b[20] = 999;  // differs in block 2 (of 4-token blocks: block 5)
  std::vector<BlockKey> ka, kb;
  HashPrefix(Root(), 4, a, &ka);
  HashPrefix(Root(), 4, b, &kb);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(ka[i], kb[i]);
  for (int i = 5; i < 8; ++i) EXPECT_NE(ka[i], kb[i]) << i;  // the chain carries the change on
}

TEST(BlockKeyTest, NamespacesNeverShareRoots) {
  std::set<BlockKey> roots;
  for (const char* model : {"m1", "m2"})
    for (const char* revision : {"", "r1", "r2"})
      for (uint64_t fp : {1ull, 2ull})
        for (const char* tenant : {"", "a", "b"})
          for (const char* lora : {"", "l1"})
            roots.insert(Namespace{model, revision, fp, tenant, lora}.Root());
  EXPECT_EQ(roots.size(), 2u * 3 * 2 * 3 * 2);
  // Length-prefixed fields: moving a character between fields changes the root.
  EXPECT_NE((Namespace{"ab", "", 0, "c", ""}.Root()), (Namespace{"a", "", 0, "bc", ""}.Root()));
}

TEST(BlockKeyTest, IdKeysDifferFromTokenKeys) {
  BlockKey r = Root();
  EXPECT_NE(ChainKeyFromId(r, 1), ChainKeyFromId(r, 2));
  EXPECT_EQ(ChainKeyFromId(r, 1), ChainKeyFromId(r, 1));
  EXPECT_NE(ChainKeyFromId(ChainKeyFromId(r, 1), 2), ChainKeyFromId(ChainKeyFromId(r, 3), 2));
}

TEST(BlockKeyTest, HexRoundTrip) {
  BlockKey k{0xdeadbeef00112233ull, 0x0123456789abcdefull};
  EXPECT_EQ(k.ToHex(), "deadbeef001122330123456789abcdef");
  EXPECT_EQ(*BlockKey::FromHex(k.ToHex()), k);
  EXPECT_FALSE(BlockKey::FromHex("xyz").ok());
  EXPECT_FALSE(BlockKey::FromHex(std::string(32, 'g')).ok());
}

TEST(BlockKeyTest, ChecksumSeesEveryByte) {
  std::vector<std::byte> b = testing::MakeBlock(4096, 1);
  uint64_t c = Checksum64(b);
  b[4095] ^= std::byte{1};
  EXPECT_NE(Checksum64(b), c);
}

}  // namespace
}  // namespace kvtier
