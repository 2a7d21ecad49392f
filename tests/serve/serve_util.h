// Helpers shared by the serve tests: configs, clients, chains of blocks whose bytes are a
// function of their keys, and a raw protocol connection for what a good client never sends.
#ifndef KVTIER_TESTS_SERVE_SERVE_UTIL_H_
#define KVTIER_TESTS_SERVE_SERVE_UTIL_H_

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "daemon_harness.h"
#include "kvtier/client.h"
#include "serve/protocol.h"
#include "serve/server.h"
#include "serve/socket_io.h"
#include "testing/test_util.h"

namespace kvtier::testing {

using serve::MsgType;

inline std::string LayoutYaml(const KvLayout& l) {
  return "{num_layers: " + std::to_string(l.num_layers) +
         ", num_kv_heads: " + std::to_string(l.num_kv_heads) +
         ", head_dim: " + std::to_string(l.head_dim) +
         ", dtype: " + std::string(DTypeName(l.dtype)) +
         ", block_tokens: " + std::to_string(l.block_tokens) + "}";
}

// A config with a host tier of `host_blocks` blocks, an optional disk tier, and extra serve
// keys.
inline std::string Config(uint64_t host_blocks, const std::string& disk_dir = "",
                          const std::string& serve_extra = "", uint32_t lease_ms = 30000,
                          const KvLayout& l = SmallLayout()) {
  std::string y = "model_id: test\nlayout: " + LayoutYaml(l) + "\ntiers:\n";
  y += "  - {kind: host, capacity: " + std::to_string(host_blocks * l.bytes_per_block()) +
       ", params: {prefault: false}}\n";
  if (!disk_dir.empty())
    y += "  - {kind: disk, capacity: 4MiB, params: {path: " + disk_dir +
         ", io: sync, direct_io: false, buffer_bytes: 1MiB, sync: none}}\n";
  y += "serve:\n  lease_ms: " + std::to_string(lease_ms) + "\n" + serve_extra;
  return y;
}

inline ClientOptions Opts(const Daemon& d, const std::string& tenant = "",
                          const std::string& token = "", const KvLayout& layout = SmallLayout()) {
  ClientOptions o;
  o.socket_path = d.socket();
  o.layout = layout;
  o.model_id = "test";
  o.tenant = tenant;
  o.token = token;
  o.timeout_ms = 500;
  o.reconnect_ms = 20;
  return o;
}

// The daemon's name for a tenant not listed in serve.tenants, declared by this process's uid.
inline std::string UidTenant(const std::string& declared) {
  return declared + "@uid" + std::to_string(getuid());
}

// The daemon's internal key for client key k of an unlisted tenant of this uid (model "test",
// the small layout): what its KV events name.
inline BlockKey DaemonKey(const BlockKey& k, const std::string& declared) {
  const std::string tenant = UidTenant(declared);
  Namespace ns{"test", "", SmallLayout().fingerprint(), tenant, ""};
  return serve::InternalKey(k, ns.Root(), serve::TenantTag(tenant));
}

// What follows `prefix` in a daemon's log, up to the first of `end`; "" when absent.
inline std::string LogValue(const std::string& log, const std::string& prefix, const char* end) {
  const auto at = log.find(prefix);
  if (at == std::string::npos) return "";
  const auto from = at + prefix.size();
  return log.substr(from, log.find_first_of(end, from) - from);
}

inline uint64_t Seed(const BlockKey& k) { return k.hi ^ (k.lo * 31); }

// Stores blocks [from, n) of the prefix `base`, each filled from its key.
inline StoreResult StoreChain(KvCache& c, uint32_t base, uint32_t n, uint32_t from = 0,
                              const RequestOptions& rq = {}) {
  const KvLayout& l = c.layout();
  std::vector<BlockKey> keys;
  HashPrefix(c.Root(rq), l.block_tokens, Tokens(uint64_t{n} * l.block_tokens, base), &keys);
  std::vector<std::vector<std::byte>> data;
  std::vector<ConstBlock> blocks;
  for (uint32_t i = from; i < n; ++i) data.push_back(MakeBlock(l.bytes_per_block(), Seed(keys[i])));
  for (auto& d : data) blocks.emplace_back(d);
  auto r = c.StoreKeys(std::span<const BlockKey>(keys).subspan(from), blocks, from, rq);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : StoreResult{};
}

// Looks up the prefix, loads every hit and checks it; returns the blocks loaded (-1 on a
// mismatch). visit: through LoadVisit (each visited block copied out, in order), not Load;
// *lent counts the blocks it handed over from elsewhere than its scratch.
inline int LoadChain(KvCache& c, uint32_t base, uint32_t n, const RequestOptions& rq = {},
                     bool visit = false, int* lent = nullptr) {
  const KvLayout& l = c.layout();
  auto lr = c.Lookup(Tokens(uint64_t{n} * l.block_tokens, base), rq);
  if (!lr.ok()) return -2;
  std::vector<std::vector<std::byte>> buf(lr->hit_blocks,
                                          std::vector<std::byte>(l.bytes_per_block()));
  std::vector<MutableBlock> dst(buf.begin(), buf.end());
  Result<LoadResult> ld = LoadResult{};
  if (visit) {
    std::vector<std::byte> scratch(l.bytes_per_block());
    const MutableBlock one[] = {MutableBlock(scratch)};
    uint32_t next = 0;
    ld = c.LoadVisit(*lr, 0, lr->hit_blocks, one, [&](uint32_t i, ConstBlock b) {
      if (i != next++ || b.size() != buf[i].size()) return;  // out of order: a mismatch below
      std::memcpy(buf[i].data(), b.data(), b.size());
      if (lent != nullptr && b.data() != scratch.data()) ++*lent;
    });
    if (ld.ok() && next < ld->loaded_blocks) return -1;
  } else {
    ld = c.Load(*lr, dst);
  }
  if (!ld.ok()) return -3;
  for (uint32_t i = 0; i < ld->loaded_blocks; ++i)
    if (buf[i] != MakeBlock(l.bytes_per_block(), Seed(lr->keys[i]))) return -1;
  return static_cast<int>(ld->loaded_blocks);
}

inline Result<DaemonStatus> StatusOf(const Daemon& d) {
  ClientOptions o;
  o.socket_path = d.socket();
  o.timeout_ms = 2000;
  KVTIER_ASSIGN_OR_RETURN(auto c, Client::Open(o));
  return c->GetDaemonStatus();
}

// A daemon counter, or UINT64_MAX when the daemon cannot be asked.
template <typename Fn>
uint64_t Counter(const Daemon& d, Fn&& field) {
  auto s = StatusOf(d);
  return s.ok() ? field(*s) : UINT64_MAX;
}

// A raw protocol connection, for what a well-behaved client never sends.
struct Raw {
  int fd = -1;
  explicit Raw(const std::string& path) {
    auto r = serve::ConnectUnix(path);
    if (r.ok()) fd = *r;
  }
  ~Raw() {
    if (fd >= 0) close(fd);
  }
  bool Send(std::span<const std::byte> bytes) {
    return serve::SendAll(fd, bytes, MonotonicNsForTest() + 2'000'000'000ull).ok();
  }
  static uint64_t MonotonicNsForTest() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
  // The reply's status (Unavailable when the daemon closed instead).
  Status Reply(std::vector<std::byte>* payload, int* arena_fd = nullptr) {
    serve::FrameHeader h;
    int passed = -1;
    Status s =
        serve::RecvFrame(fd, MonotonicNsForTest() + 2'000'000'000ull, -1, &h, payload, &passed);
    if (arena_fd)
      *arena_fd = passed;
    else if (passed >= 0)
      close(passed);
    if (!s.ok()) return s;
    serve::Reader r(*payload);
    Status st;
    if (!r.StatusField(&st)) return Status::Internal("bad reply");
    payload->erase(payload->begin(), payload->end() - static_cast<long>(r.left()));
    return st;
  }
  // True when the daemon closed the connection (within 2 s).
  bool Closed() {
    std::vector<std::byte> p;
    Status s = Reply(&p);
    return s.code() == StatusCode::kUnavailable &&
           s.message().find("timed out") == std::string::npos;
  }
  Status Hello(uint32_t version = serve::kProtocolVersion, int* arena_fd = nullptr,
               const std::string& tenant = "", const std::string& token = "",
               const KvLayout& layout = SmallLayout()) {
    serve::Writer w;
    w.Begin(static_cast<uint16_t>(MsgType::kHello), 0, 1);
    serve::Hello h;
    h.version = version;
    h.layout = layout;
    h.model_id = "test";
    h.tenant = tenant;
    h.token = token;
    serve::EncodeHello(h, &w);
    if (!Send(w.Finish())) return Status::Unavailable("send");
    std::vector<std::byte> p;
    return Reply(&p, arena_fd);
  }
};

}  // namespace kvtier::testing

#endif  // KVTIER_TESTS_SERVE_SERVE_UTIL_H_
