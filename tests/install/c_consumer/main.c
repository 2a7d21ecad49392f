/* A C11 engine embedding the installed libkvtier.so through the C API alone. Exits non-zero,
 * naming the check, on the first thing that is wrong. */
#include <kvtier/c_api.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                                  \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      fprintf(stderr, "c_consumer: line %d: %s (last error: %s)\n", __LINE__, #cond, \
              kvtier_last_error());                                                  \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

static const char* kConfig =
    "model_id: c-consumer\n"
    "layout: {num_layers: 2, num_kv_heads: 2, head_dim: 16, dtype: fp16, block_tokens: 16}\n"
    "tiers:\n"
    "  - {kind: host, capacity: 1MiB}\n";

/* Every name kvtier_cache_stat_names lists reads back with kvtier_cache_stat; the cache's and
 * its tiers' fields are there (and, through a daemon, the daemon's); a name it does not list is
 * NOT_FOUND. Returns 0 when all is well. */
static int CheckStatNames(kvtier_cache* cache, int daemon) {
  /* The planner's declined blocks, counted on the first tier. */
  const uint32_t declined[1] = {2};
  CHECK(kvtier_cache_note_declined(cache, declined, 1) == KVTIER_OK);
  CHECK(kvtier_cache_note_declined(NULL, declined, 1) == KVTIER_INVALID_ARGUMENT);
  const char* list = NULL;
  CHECK(kvtier_cache_stat_names(cache, &list) == KVTIER_OK);
  const char* d = strstr(list, ".declined_blocks");
  CHECK(d != NULL);
  while (d > list && d[-1] != '\n') --d; /* tier.<first tier>.declined_blocks */
  char first[128];
  size_t len = strcspn(d, "\n");
  CHECK(len < sizeof first);
  memcpy(first, d, len);
  first[len] = '\0';
  uint64_t n = 0;
  CHECK(kvtier_cache_stat(cache, first, &n) == KVTIER_OK && n == 2);
  CHECK(strstr(list, "write_through_dropped_blocks") != NULL);
  CHECK(strstr(list, ".resident_blocks") != NULL); /* tier.<name>.resident_blocks */
  CHECK((strstr(list, "protocol_errors") != NULL) == (daemon != 0));
  char* names = malloc(strlen(list) + 1);
  CHECK(names != NULL);
  strcpy(names, list);
  int count = 0;
  for (char* name = strtok(names, "\n"); name != NULL; name = strtok(NULL, "\n")) {
    uint64_t v = UINT64_MAX;
    CHECK(kvtier_cache_stat(cache, name, &v) == KVTIER_OK);
    CHECK(v != UINT64_MAX);
    ++count;
  }
  free(names);
  CHECK(count > 20);
  uint64_t v = 0;
  CHECK(kvtier_cache_stat(cache, "hit_blocks", &v) == KVTIER_OK && v > 0);
  CHECK(kvtier_cache_stat(cache, "no_such_stat", &v) == KVTIER_NOT_FOUND);
  CHECK(strstr(kvtier_last_error(), "no_such_stat") != NULL);
  if (daemon) CHECK(kvtier_cache_stat(cache, "clients", &v) == KVTIER_OK && v >= 1);
  return 0;
}

struct Done {
  int calls;
  kvtier_code code;
  kvtier_store_result result;
};

/* kvtier_load_visit: blocks 1.. handed over in order, each copied where the engine wants it. */
typedef struct {
  unsigned char* dst;
  size_t block_bytes;
  uint32_t next;
  int in_order;
} Visited;

static void CopyVisited(void* user, uint32_t index, const void* bytes, size_t size) {
  Visited* v = (Visited*)user;
  if (index != v->next++ || size != v->block_bytes) v->in_order = 0;
  memcpy(v->dst + (size_t)index * v->block_bytes, bytes, size);
}

static int LoadVisit(kvtier_cache* cache, const kvtier_lookup* lk, const unsigned char* src,
                     unsigned char* dst, int blocks) {
  const size_t bb = kvtier_cache_block_bytes(cache);
  void* scratch[1] = {malloc(bb)};
  Visited v = {dst, bb, 0, 1};
  uint32_t loaded = 0;
  memset(dst, 0, (size_t)blocks * bb);
  CHECK(kvtier_load_visit(cache, lk, 1, (size_t)blocks - 1, scratch, 1, CopyVisited, &v, &loaded) ==
        KVTIER_OK);
  CHECK(loaded == (uint32_t)blocks - 1 && v.in_order && v.next == loaded);
  CHECK(memcmp(src + bb, dst, (size_t)(blocks - 1) * bb) == 0);
  CHECK(kvtier_load_visit(cache, lk, 0, (size_t)blocks, scratch, 0, CopyVisited, &v, &loaded) ==
        KVTIER_INVALID_ARGUMENT); /* no scratch block */
  CHECK(kvtier_load_visit(cache, lk, 1, (size_t)blocks, scratch, 1, CopyVisited, &v, &loaded) ==
        KVTIER_INVALID_ARGUMENT); /* past the hit */
  free(scratch[0]);
  return 0;
}

static void OnStored(void* user, kvtier_code code, const kvtier_store_result* result) {
  struct Done* d = (struct Done*)user;
  d->calls++;
  d->code = code;
  d->result = *result;
}

/* Asynchronous stores: the queue's options checked, a store that lands after the call returns,
 * found by a lookup once kvtier_store_wait says it is done, and counted. */
static int AsyncStores(kvtier_cache* cache, const void* const* in, int blocks) {
  const uint32_t bt = kvtier_cache_block_tokens(cache);
  uint32_t tokens[8 * 64];
  CHECK((size_t)blocks * bt <= sizeof tokens / sizeof tokens[0]);
  for (uint32_t i = 0; i < (uint32_t)blocks * bt; ++i) tokens[i] = 90000 + i * 3;
  kvtier_store_queue_options qo = {8, 7, 0};
  CHECK(kvtier_store_queue_open(cache, &qo) == KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "unknown priority 7") != NULL);
  qo.priority = KVTIER_PRIORITY_NICE;
  qo.nice = 5;
  CHECK(kvtier_store_queue_open(cache, &qo) == KVTIER_OK);
  CHECK(kvtier_store_queue_open(cache, &qo) == KVTIER_INVALID_ARGUMENT);
  struct Done done = {0, KVTIER_INTERNAL, {0, 0, 0}};
  CHECK(kvtier_store_async(cache, tokens, 5, in, 1, 0, NULL, NULL, OnStored, &done) ==
        KVTIER_INVALID_ARGUMENT); /* 5 tokens make no full block */
  CHECK(kvtier_store_async(cache, tokens, (size_t)blocks * bt, in, (size_t)blocks, 0, NULL, NULL,
                           OnStored, &done) == KVTIER_OK);
  CHECK(kvtier_store_wait(cache, tokens, (size_t)blocks * bt, NULL, 30000) == KVTIER_OK);
  CHECK(done.calls == 1 && done.code == KVTIER_OK);
  CHECK(done.result.stored_blocks == (uint32_t)blocks);
  kvtier_lookup* lk = NULL;
  CHECK(kvtier_lookup_tokens(cache, tokens, (size_t)blocks * bt, NULL, &lk) == KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == (uint32_t)blocks);
  kvtier_lookup_free(lk);
  CHECK(kvtier_store_wait_idle(cache, 30000) == KVTIER_OK);
  uint64_t v = 0;
  CHECK(kvtier_cache_stat(cache, "async.submitted_batches", &v) == KVTIER_OK && v == 1);
  CHECK(kvtier_cache_stat(cache, "async.stored_batches", &v) == KVTIER_OK && v == 1);
  CHECK(kvtier_cache_stat(cache, "async.dropped_blocks", &v) == KVTIER_OK && v == 0);
  return 0;
}

/* The same round trip through a running `kvtier serve` on `socket`, and a client of a daemon that
 * is not there: misses within the deadline, never a hang. */
static int ThroughDaemon(const char* socket) {
  kvtier_client_options o;
  memset(&o, 0, sizeof o);
  o.socket_path = socket;
  o.num_layers = 2;
  o.num_kv_heads = 2;
  o.head_dim = 16;
  o.block_tokens = 16;
  o.dtype = "fp16";
  o.model_id = "c-consumer";
  o.model_revision = "weights-sha256:0123";
  o.timeout_ms = 2000;
  kvtier_cache* cache = NULL;
  CHECK(kvtier_client_open(&o, &cache) == KVTIER_OK);
  const uint64_t bb = kvtier_cache_block_bytes(cache);
  enum { kBlocks = 3 };
  uint32_t tokens[kBlocks * 16];
  for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; ++i) tokens[i] = (uint32_t)(i * 5 + 3);
  unsigned char* src = malloc(kBlocks * bb);
  unsigned char* dst = calloc(kBlocks, bb);
  CHECK(src != NULL && dst != NULL);
  const void* in[kBlocks];
  void* out[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    for (uint64_t i = 0; i < bb; ++i) src[b * bb + i] = (unsigned char)(b * 17 + i * 3);
    in[b] = src + b * bb;
    out[b] = dst + b * bb;
  }
  /* The daemon publishes KV events: the engine's own hashes (two per block, as vLLM's blocks
   * of 8 tokens inside kvtier's 16) travel with the store. */
  CHECK(kvtier_cache_wants_engine_hashes(cache) == 1);
  uint8_t hashes[kBlocks][2][32];
  kvtier_engine_hashes engine[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    memset(hashes[b], b + 1, sizeof hashes[b]);
    engine[b] = (kvtier_engine_hashes){&hashes[b][0][0], 32, 2,   b ? &hashes[b - 1][1][0] : NULL,
                                       tokens + b * 16,  16, NULL};
  }
  kvtier_store_result sr;
  CHECK(kvtier_store_with_hashes(cache, tokens, kBlocks * 16, in, kBlocks, 0, NULL, engine, &sr) ==
        KVTIER_OK);
  CHECK(kvtier_session_notify(cache, 5, KVTIER_SESSION_THINKING) == KVTIER_OK); /* to the daemon */
  CHECK(sr.stored_blocks == kBlocks);
  kvtier_lookup* lk = NULL;
  CHECK(kvtier_lookup_tokens(cache, tokens, kBlocks * 16, NULL, &lk) == KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == kBlocks);
  uint32_t loaded = 0;
  CHECK(kvtier_load(cache, lk, out, kBlocks, &loaded) == KVTIER_OK);
  CHECK(loaded == kBlocks);
  CHECK(memcmp(src, dst, kBlocks * bb) == 0);
  /* A range of the hit: blocks 1.. into the buffer's start. */
  memset(dst, 0, kBlocks * bb);
  CHECK(kvtier_load_range(cache, lk, 1, out, kBlocks - 1, &loaded) == KVTIER_OK);
  CHECK(loaded == kBlocks - 1 && memcmp(src + bb, dst, (kBlocks - 1) * bb) == 0);
  CHECK(kvtier_load_range(cache, lk, 1, out, kBlocks, &loaded) == KVTIER_INVALID_ARGUMENT);
  CHECK(LoadVisit(cache, lk, src, dst, kBlocks) == 0);
  kvtier_lookup_free(lk);
  CHECK(CheckStatNames(cache, 1) == 0);
  CHECK(AsyncStores(cache, in, kBlocks) == 0);
  kvtier_cache_close(cache);

  /* Another revision of the weights never sees these blocks. */
  o.model_revision = "weights-sha256:4567";
  CHECK(kvtier_client_open(&o, &cache) == KVTIER_OK);
  CHECK(kvtier_lookup_tokens(cache, tokens, kBlocks * 16, NULL, &lk) == KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == 0);
  kvtier_lookup_free(lk);
  kvtier_cache_close(cache);

  /* No daemon: a miss, within the deadline. */
  o.socket_path = "/nonexistent/kvtier.sock";
  o.timeout_ms = 200;
  CHECK(kvtier_client_open(&o, &cache) == KVTIER_OK);
  CHECK(kvtier_lookup_tokens(cache, tokens, kBlocks * 16, NULL, &lk) == KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == 0);
  kvtier_lookup_free(lk);
  kvtier_cache_close(cache);
  free(src);
  free(dst);
  printf("c_consumer: stored and loaded %d blocks through the daemon's shared arena\n", kBlocks);
  return 0;
}

/* doc/config.md's grouped layout, as layout_yaml takes it: `window` tokens of sliding window in
 * 4-token pages beside a full group, 16-token blocks. */
static void GroupedYaml(char* out, size_t size, int window) {
  snprintf(out, size,
           "block_tokens: 16\n"
           "groups:\n"
           "  - {kind: sliding_window, num_layers: 2, num_kv_heads: 2, head_dim: 16, dtype: fp16,"
           " window: %d, page_tokens: 4}\n"
           "  - {kind: full, num_layers: 2, num_kv_heads: 2, head_dim: 16, dtype: fp16}\n",
           window);
}

/* A client of a daemon serving the grouped layout (window 8): the same groups through
 * layout_yaml store and load a block; another window is refused naming both layouts. */
static int ThroughGroupedDaemon(const char* socket) {
  char yaml[512];
  GroupedYaml(yaml, sizeof yaml, 8);
  kvtier_client_options o;
  memset(&o, 0, sizeof o);
  o.socket_path = socket;
  o.layout_yaml = yaml;
  o.model_id = "c-consumer";
  o.model_revision = "weights-sha256:0123";
  o.timeout_ms = 2000;
  kvtier_cache* cache = NULL;
  CHECK(kvtier_client_open(&o, &cache) == KVTIER_OK);
  const uint64_t bb = kvtier_cache_block_bytes(cache);
  /* window 8 - 1 = 7 tokens: two 4-token pages of the sliding group, 16 tokens of the full. */
  CHECK(bb == 2u * 2 * 2 * 16 * 2 * (8 + 16));
  CHECK(kvtier_cache_block_tokens(cache) == 16);
  uint32_t tokens[16];
  for (int i = 0; i < 16; ++i) tokens[i] = (uint32_t)(i * 11 + 2);
  unsigned char* src = malloc(bb);
  unsigned char* dst = calloc(1, bb);
  CHECK(src != NULL && dst != NULL);
  for (uint64_t i = 0; i < bb; ++i) src[i] = (unsigned char)(i * 7 + 1);
  const void* in[1] = {src};
  void* out[1] = {dst};
  kvtier_store_result sr;
  CHECK(kvtier_store(cache, tokens, 16, in, 1, 0, NULL, &sr) == KVTIER_OK);
  CHECK(sr.stored_blocks == 1);
  kvtier_lookup* lk = NULL;
  CHECK(kvtier_lookup_tokens(cache, tokens, 16, NULL, &lk) == KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == 1);
  uint32_t loaded = 0;
  CHECK(kvtier_load(cache, lk, out, 1, &loaded) == KVTIER_OK && loaded == 1);
  CHECK(memcmp(src, dst, bb) == 0);
  kvtier_lookup_free(lk);
  kvtier_cache_close(cache);
  free(src);
  free(dst);

  GroupedYaml(yaml, sizeof yaml, 12);
  cache = (kvtier_cache*)1;
  CHECK(kvtier_client_open(&o, &cache) == KVTIER_INVALID_ARGUMENT);
  CHECK(cache == NULL);
  CHECK(strstr(kvtier_last_error(), "layout mismatch") != NULL);
  CHECK(strstr(kvtier_last_error(), "window 12") != NULL);
  CHECK(strstr(kvtier_last_error(), "window 8") != NULL);
  printf("c_consumer: a grouped layout_yaml stored and loaded through the daemon\n");
  return 0;
}

/* A state layout (a full group beside two state groups of 1000 B per layer): blocks and state
 * records stored apart; a lookup of the record resumes at a block only where it was stored. */
static int StateRecords(void) {
  kvtier_cache* cache = NULL;
  CHECK(kvtier_cache_open_yaml(
            "layout:\n  block_tokens: 16\n  groups:\n"
            "    - {kind: state, num_layers: 2, state_bytes: 1000, dtype: fp32}\n"
            "    - {kind: full, num_layers: 1, num_kv_heads: 2, head_dim: 16, dtype: fp16}\n"
            "    - {kind: state, num_layers: 1, state_bytes: 1000, dtype: fp32}\n"
            "tiers: [{kind: host, capacity: 1MiB}]\n",
            "c_consumer-state", &cache) == KVTIER_OK);
  const uint64_t bb = kvtier_cache_block_bytes(cache);
  CHECK(bb == 2u * 2 * 16 * 16 * 2);            /* K,V x heads x head_dim x tokens x fp16 */
  CHECK(kvtier_cache_state_blocks(cache) == 2); /* 3000 B of states in 2 KiB blocks */
  uint32_t tokens[48];
  for (int i = 0; i < 48; ++i) tokens[i] = (uint32_t)(i * 5 + 1);
  unsigned char* mem = malloc(5 * bb);
  unsigned char* got = calloc(4, bb);
  CHECK(mem != NULL && got != NULL);
  for (uint64_t i = 0; i < 5 * bb; ++i) mem[i] = (unsigned char)(i * 13 + 3);
  const void* blocks[3] = {mem, mem + bb, mem + 2 * bb};
  const void* record[2] = {mem + 3 * bb, mem + 4 * bb};
  kvtier_store_result sr;
  CHECK(kvtier_store(cache, tokens, 48, blocks, 3, 0, NULL, &sr) == KVTIER_OK);
  CHECK(sr.stored_blocks == 3);
  CHECK(kvtier_store_state(cache, tokens, 48, 1, record, NULL, &sr) == KVTIER_OK);
  CHECK(sr.stored_blocks == 2);
  /* Block 1 resumes: its chain and its record come back. */
  kvtier_lookup* lk = NULL;
  CHECK(kvtier_lookup_state(cache, tokens, 48, 1, NULL, &lk) == KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == 2 + 2);
  void* out[4] = {got, got + bb, got + 2 * bb, got + 3 * bb};
  uint32_t loaded = 0;
  CHECK(kvtier_load_range(cache, lk, 0, out, 2, &loaded) == KVTIER_OK && loaded == 2);
  CHECK(kvtier_load_range(cache, lk, 2, out + 2, 2, &loaded) == KVTIER_OK && loaded == 2);
  CHECK(memcmp(got, mem, 2 * bb) == 0 && memcmp(got + 2 * bb, mem + 3 * bb, 2 * bb) == 0);
  kvtier_lookup_free(lk);
  /* Block 2 has no record: the chain hits, the record does not. Another tenant sees neither. */
  CHECK(kvtier_lookup_state(cache, tokens, 48, 2, NULL, &lk) == KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == 3);
  kvtier_lookup_free(lk);
  kvtier_request other = {"tenant-b", NULL, 0};
  CHECK(kvtier_lookup_state(cache, tokens, 48, 1, &other, &lk) == KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == 0);
  kvtier_lookup_free(lk);
  CHECK(kvtier_lookup_state(cache, tokens, 40, 2, NULL, &lk) == KVTIER_INVALID_ARGUMENT);
  kvtier_cache_close(cache);

  /* A layout without state groups has no records. */
  CHECK(kvtier_cache_open_yaml(kConfig, "c_consumer", &cache) == KVTIER_OK);
  CHECK(kvtier_cache_state_blocks(cache) == 0);
  CHECK(kvtier_store_state(cache, tokens, 48, 0, record, NULL, &sr) == KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "no state group") != NULL);
  kvtier_cache_close(cache);
  free(mem);
  free(got);
  printf("c_consumer: a state record stored and loaded beside its blocks\n");
  return 0;
}

/* A malformed layout_yaml is refused before any connection, naming the YAML problem. */
static int BadLayoutYaml(void) {
  kvtier_client_options o;
  memset(&o, 0, sizeof o);
  o.socket_path = "/nonexistent/kvtier.sock";
  o.layout_yaml = "block_tokens: 16\ngroups:\n  - {kind: global, num_layers: 2}\n";
  kvtier_cache* cache = (kvtier_cache*)1;
  CHECK(kvtier_client_open(&o, &cache) == KVTIER_INVALID_ARGUMENT);
  CHECK(cache == NULL);
  CHECK(strstr(kvtier_last_error(), "layout_yaml:3") != NULL);
  CHECK(strstr(kvtier_last_error(), "layout.groups[0].kind: unknown kind 'global'") != NULL);
  o.layout_yaml = "groups: [unclosed\n";
  CHECK(kvtier_client_open(&o, &cache) == KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "not valid YAML") != NULL);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--daemon") == 0) return ThroughDaemon(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--grouped-daemon") == 0) return ThroughGroupedDaemon(argv[2]);

  CHECK(kvtier_api_version() == KVTIER_C_API_VERSION);
  CHECK(strlen(kvtier_version()) > 0);
  CHECK(BadLayoutYaml() == 0);
  CHECK(StateRecords() == 0);

  /* A bad configuration is a code and a message naming the key; no handle comes back. */
  kvtier_cache* bad = (kvtier_cache*)1;
  kvtier_code code = kvtier_cache_open_yaml(
      "layout: {preset: llama-3.1-8b}\ntiers: [{kind: host, capacity: 8XB}]\n", "bad.yaml", &bad);
  CHECK(code == KVTIER_INVALID_ARGUMENT);
  CHECK(bad == NULL);
  CHECK(strstr(kvtier_last_error(), "bad.yaml:2") != NULL);
  CHECK(strstr(kvtier_last_error(), "tiers[0].capacity") != NULL);
  CHECK(strcmp(kvtier_code_name(code), "InvalidArgument") == 0);

  kvtier_cache* cache = NULL;
  CHECK(kvtier_cache_open_yaml(kConfig, "c_consumer", &cache) == KVTIER_OK);
  const uint64_t bb = kvtier_cache_block_bytes(cache);
  const uint32_t bt = kvtier_cache_block_tokens(cache);
  CHECK(bb == 2u * 2 * 2 * 16 * 16 * 2); /* layers x K,V x heads x head_dim x tokens x fp16 */
  CHECK(bt == 16);

  enum { kBlocks = 4 };
  uint32_t tokens[kBlocks * 16 + 5]; /* a partial last block is never stored */
  for (size_t i = 0; i < sizeof tokens / sizeof tokens[0]; ++i) tokens[i] = (uint32_t)(i * 7 + 1);
  unsigned char* src = malloc(kBlocks * bb);
  unsigned char* dst = calloc(kBlocks, bb);
  CHECK(src != NULL && dst != NULL);
  const void* in[kBlocks];
  void* out[kBlocks];
  for (int b = 0; b < kBlocks; ++b) {
    for (uint64_t i = 0; i < bb; ++i) src[b * bb + i] = (unsigned char)(b * 31 + i);
    in[b] = src + b * bb;
    out[b] = dst + b * bb;
  }

  /* Cold: nothing hits. */
  kvtier_lookup* lk = NULL;
  CHECK(kvtier_lookup_tokens(cache, tokens, sizeof tokens / sizeof tokens[0], NULL, &lk) ==
        KVTIER_OK);
  CHECK(kvtier_lookup_num_blocks(lk) == kBlocks);
  CHECK(kvtier_lookup_hit_blocks(lk) == 0);
  kvtier_lookup_free(lk);

  /* Too many blocks for the tokens is refused. */
  kvtier_store_result sr;
  /* No publisher in process: engine hashes are taken and not kept; a bad hash size is refused. */
  CHECK(kvtier_cache_wants_engine_hashes(cache) == 0);
  {
    /* With serve.events_addr the in-process cache publishes, and wants them. */
    char yaml[512];
    snprintf(yaml, sizeof yaml, "%sserve: {events_addr: \"tcp://127.0.0.1:*\"}\n", kConfig);
    kvtier_cache* pub = NULL;
    CHECK(kvtier_cache_open_yaml(yaml, "c_consumer-events", &pub) == KVTIER_OK);
    CHECK(kvtier_cache_wants_engine_hashes(pub) == 1);
    kvtier_cache_close(pub);
  }
  uint8_t hash[32] = {0};
  kvtier_engine_hashes engine[2] = {{hash, 65, 1, NULL, NULL, 0, NULL},
                                    {hash, 32, 1, NULL, NULL, 0, NULL}};
  CHECK(kvtier_store_with_hashes(cache, tokens, 32, in, 2, 0, NULL, engine, &sr) ==
        KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "engine[0].hash_bytes 65") != NULL);
  CHECK(kvtier_store(cache, tokens, 16, in, 2, 0, NULL, &sr) == KVTIER_INVALID_ARGUMENT);

  CHECK(kvtier_store(cache, tokens, sizeof tokens / sizeof tokens[0], in, kBlocks, 0, NULL, &sr) ==
        KVTIER_OK);
  CHECK(sr.stored_blocks == kBlocks && sr.failed_blocks == 0);
  /* Session events: taken for a real session, refused for none or an unknown event. */
  CHECK(kvtier_session_notify(cache, 42, KVTIER_SESSION_FINISHED) == KVTIER_OK);
  CHECK(kvtier_session_notify(cache, 0, KVTIER_SESSION_FINISHED) == KVTIER_INVALID_ARGUMENT);
  CHECK(kvtier_session_notify(cache, 42, (kvtier_session_event)9) == KVTIER_INVALID_ARGUMENT);
  CHECK(strstr(kvtier_last_error(), "unknown event 9") != NULL);

  CHECK(kvtier_lookup_tokens(cache, tokens, sizeof tokens / sizeof tokens[0], NULL, &lk) ==
        KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == kBlocks);
  uint32_t loaded = 0;
  CHECK(kvtier_load(cache, lk, out, kBlocks + 1, &loaded) == KVTIER_INVALID_ARGUMENT);
  CHECK(kvtier_load(cache, lk, out, kBlocks, &loaded) == KVTIER_OK);
  CHECK(loaded == kBlocks);
  CHECK(memcmp(src, dst, kBlocks * bb) == 0);
  /* A range of the hit: blocks 1.. into the buffer's start. */
  memset(dst, 0, kBlocks * bb);
  CHECK(kvtier_load_range(cache, lk, 1, out, kBlocks - 1, &loaded) == KVTIER_OK);
  CHECK(loaded == kBlocks - 1 && memcmp(src + bb, dst, (kBlocks - 1) * bb) == 0);
  CHECK(kvtier_load_range(cache, lk, 1, out, kBlocks, &loaded) == KVTIER_INVALID_ARGUMENT);
  CHECK(LoadVisit(cache, lk, src, dst, kBlocks) == 0);
  kvtier_lookup_free(lk);

  /* Another tenant never sees these blocks. */
  kvtier_request other = {"tenant-b", NULL, 0};
  CHECK(kvtier_lookup_tokens(cache, tokens, sizeof tokens / sizeof tokens[0], &other, &lk) ==
        KVTIER_OK);
  CHECK(kvtier_lookup_hit_blocks(lk) == 0);
  kvtier_lookup_free(lk);

  kvtier_stats st;
  CHECK(kvtier_cache_stats(cache, &st) == KVTIER_OK);
  CHECK(st.lookups == 3 && st.stored_blocks == kBlocks && st.hit_blocks == kBlocks);
  CHECK(CheckStatNames(cache, 0) == 0);
  CHECK(AsyncStores(cache, in, kBlocks) == 0);

  kvtier_cache_close(cache);
  free(src);
  free(dst);
  printf("c_consumer: stored and loaded %d blocks through libkvtier.so's C API\n", kBlocks);
  return 0;
}
