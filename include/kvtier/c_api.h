/* kvtier's C API: the seam for engines written in C, Rust, Go or anything with a C FFI.
 *
 * libkvtier.so exports only the kvtier_* symbols below; no C++ type crosses this boundary.
 * Handles are opaque. Every function that can fail returns a kvtier_code; on failure the
 * calling thread's last error (kvtier_last_error()) holds kvtier's message, which names the
 * file, key or peer at fault.
 *
 * Ownership: each handle is created by one function and freed by exactly one other, named in
 * its comment. Pointers passed in are borrowed for the duration of the call only. A lookup
 * must be freed before the cache that made it.
 *
 * Thread-safety: a kvtier_cache may be used from many threads at once; a kvtier_lookup by one
 * thread at a time. kvtier_last_error() is per thread.
 *
 * Codes say what the caller does next, as in kvtier's C++ Status (status.h): NOT_FOUND is a
 * miss, UNAVAILABLE is retryable, CORRUPTION means the block was dropped: recompute it. */
#ifndef KVTIER_C_API_H_
#define KVTIER_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define KVTIER_C_EXPORT __attribute__((visibility("default")))
#else
#define KVTIER_C_EXPORT
#endif

/* The C API's own version: it grows with each addition (3: state records, 4: kvtier_load_visit);
 * the SONAME changes only with an incompatible change. */
#define KVTIER_C_API_VERSION 4

typedef enum kvtier_code {
  KVTIER_OK = 0,
  KVTIER_NOT_FOUND = 1,
  KVTIER_INVALID_ARGUMENT = 2,
  KVTIER_UNAVAILABLE = 3,
  KVTIER_RESOURCE_EXHAUSTED = 4,
  KVTIER_CORRUPTION = 5,
  KVTIER_INTERNAL = 6,
} kvtier_code;

typedef struct kvtier_cache kvtier_cache;   /* a cache: in-process or a daemon's client */
typedef struct kvtier_lookup kvtier_lookup; /* a lookup's result; pins its hit blocks */

/* Per request; NULL or zeroed fields mean the cache's defaults. */
typedef struct kvtier_request {
  const char* tenant;  /* NULL = the cache's default tenant */
  const char* lora_id; /* NULL = the cache's default LoRA */
  uint64_t session_id; /* 0 = none */
} kvtier_request;

typedef struct kvtier_store_result {
  uint32_t stored_blocks;  /* newly written to at least one tier */
  uint32_t present_blocks; /* already resident */
  uint32_t failed_blocks;
} kvtier_store_result;

typedef struct kvtier_stats {
  uint64_t lookups;
  uint64_t lookup_blocks;
  uint64_t hit_blocks;
  uint64_t loads;
  uint64_t load_failed_blocks; /* became recompute */
  uint64_t stores;
  uint64_t stored_blocks;
} kvtier_stats;

/* "0.1.0": the library's version. Static storage; never freed. */
KVTIER_C_EXPORT const char* kvtier_version(void);
/* KVTIER_C_API_VERSION of the library actually loaded. */
KVTIER_C_EXPORT int kvtier_api_version(void);
/* "InvalidArgument", ... Static storage. */
KVTIER_C_EXPORT const char* kvtier_code_name(kvtier_code code);

/* The message of the calling thread's last failed call ("" when none). Valid until that
 * thread's next kvtier_* call; owned by the library. */
KVTIER_C_EXPORT const char* kvtier_last_error(void);

/* Opens an in-process cache from YAML configuration text (doc/config.md); `source` names the
 * text in errors (e.g. a file name; NULL = "<config>"). On success *out is a new cache, freed
 * with kvtier_cache_close(); on failure *out is NULL. */
KVTIER_C_EXPORT kvtier_code kvtier_cache_open_yaml(const char* yaml_text, const char* source,
                                                   kvtier_cache** out);
/* Same, reading the YAML from a file. */
KVTIER_C_EXPORT kvtier_code kvtier_cache_open_file(const char* path, kvtier_cache** out);

/* How to reach the node's `kvtier serve` daemon (doc/serve.md). Zero / NULL fields take the
 * defaults named beside them. */
typedef struct kvtier_client_options {
  const char* socket_path; /* NULL = $XDG_RUNTIME_DIR/kvtier/kvtier.sock or /run/kvtier/... */
  uint32_t num_layers;     /* the engine's block layout; must equal the daemon's */
  uint32_t num_kv_heads;
  uint32_t head_dim;
  uint32_t block_tokens;      /* 0 = 64 */
  const char* dtype;          /* "bf16" (NULL), "fp16", "fp8", "fp32" */
  const char* attention;      /* "mha" (NULL; covers GQA), "mla" */
  const char* model_id;       /* NULL = "default" */
  const char* model_revision; /* a hash of the weights or a revision string: keeps checkpoints
                                 served under one model_id apart */
  const char* tenant;         /* NULL = the default tenant */
  const char* lora_id;
  const char* token;       /* proves a token-bound tenant */
  uint32_t timeout_ms;     /* every call's deadline; 0 = 1000 */
  const char* layout_yaml; /* NULL = the fields above; else a YAML layout mapping as in
                              doc/config.md's layout: (grouped layouts) that replaces them */
} kvtier_client_options;

/* Connects to the daemon. A daemon that is not running is no error: the cache starts
 * disconnected, answers misses within the deadline and reconnects in the background.
 * INVALID_ARGUMENT for bad options or when the daemon refuses this client (protocol version,
 * layout, credentials; the message names both sides). On success *out is freed with
 * kvtier_cache_close(). */
KVTIER_C_EXPORT kvtier_code kvtier_client_open(const kvtier_client_options* options,
                                               kvtier_cache** out);

/* Frees a cache and its tiers (after every lookup it made was freed). NULL is a no-op. */
KVTIER_C_EXPORT void kvtier_cache_close(kvtier_cache* cache);

/* Bytes of one block (every buffer passed to load and store has exactly this size) and
 * tokens per block. */
KVTIER_C_EXPORT uint64_t kvtier_cache_block_bytes(const kvtier_cache* cache);
KVTIER_C_EXPORT uint32_t kvtier_cache_block_tokens(const kvtier_cache* cache);

/* Finds the longest cached prefix of tokens[0..num_tokens) and pins it. request may be NULL.
 * On success *out is a new lookup, freed with kvtier_lookup_free() (which unpins). */
KVTIER_C_EXPORT kvtier_code kvtier_lookup_tokens(kvtier_cache* cache, const uint32_t* tokens,
                                                 size_t num_tokens, const kvtier_request* request,
                                                 kvtier_lookup** out);
/* Unpins and frees. NULL is a no-op. */
KVTIER_C_EXPORT void kvtier_lookup_free(kvtier_lookup* lookup);
/* Full blocks of the request, and how many leading ones can be loaded. */
KVTIER_C_EXPORT uint32_t kvtier_lookup_num_blocks(const kvtier_lookup* lookup);
KVTIER_C_EXPORT uint32_t kvtier_lookup_hit_blocks(const kvtier_lookup* lookup);

/* Copies the lookup's first num_blocks hit blocks into dst[0..num_blocks), each a buffer of
 * kvtier_cache_block_bytes() bytes. *loaded_blocks is how many leading blocks were delivered:
 * recompute from there on (a failed block is a recompute, not an error). INVALID_ARGUMENT when
 * num_blocks > hit blocks or a pointer is NULL. */
KVTIER_C_EXPORT kvtier_code kvtier_load(kvtier_cache* cache, const kvtier_lookup* lookup,
                                        void* const* dst, size_t num_blocks,
                                        uint32_t* loaded_blocks);
/* The same for hit blocks [first, first + num_blocks): a long hit loaded chunk by chunk through
 * one small buffer, or the tail after a recomputed head; *loaded_blocks counts from first.
 * INVALID_ARGUMENT when the range passes the hit blocks. */
KVTIER_C_EXPORT kvtier_code kvtier_load_range(kvtier_cache* cache, const kvtier_lookup* lookup,
                                              uint32_t first, void* const* dst, size_t num_blocks,
                                              uint32_t* loaded_blocks);
/* Hit blocks [first, first + num_blocks) handed to visit(user, i, bytes, block_bytes) in order
 * (i counts from first; bytes valid during the call only), for the engine to copy each block
 * once into its own layout: an in-process cache lends the blocks its host tier holds, with no
 * copy; other blocks (and a daemon's) are loaded into scratch[0..num_scratch) (block-sized
 * buffers, at least one) first. *loaded_blocks as kvtier_load_range's. Since version 4. */
typedef void (*kvtier_block_visitor)(void* user, uint32_t index, const void* bytes, size_t size);
KVTIER_C_EXPORT kvtier_code kvtier_load_visit(kvtier_cache* cache, const kvtier_lookup* lookup,
                                              uint32_t first, size_t num_blocks,
                                              void* const* scratch, size_t num_scratch,
                                              kvtier_block_visitor visit, void* user,
                                              uint32_t* loaded_blocks);

/* State records (a layout with state groups: Mamba / linear attention; doc/layout.md "State
 * records"): the states at the end of a block, every state group's, stored where the engine
 * kept them, in kvtier_cache_state_blocks() blocks (0: the layout has no state group). */
KVTIER_C_EXPORT uint32_t kvtier_cache_state_blocks(const kvtier_cache* cache);
/* Looks up full blocks 0..block of tokens followed by block `block`'s state record, and pins
 * them. Resumable at the block's end when the hit is all of it (hit blocks == block + 1 +
 * state_blocks): load the chain with kvtier_load_range(first 0, block + 1 blocks) and the
 * record with kvtier_load_range(first block + 1, state_blocks). INVALID_ARGUMENT when tokens
 * hold no full block `block` or the layout has no state group. */
KVTIER_C_EXPORT kvtier_code kvtier_lookup_state(kvtier_cache* cache, const uint32_t* tokens,
                                                size_t num_tokens, uint32_t block,
                                                const kvtier_request* request, kvtier_lookup** out);
/* Stores block `block`'s state record: record[0..state_blocks), kvtier_cache_block_bytes()
 * bytes each (the states one after the other from byte 0, then zeros). Store the block itself
 * with kvtier_store; a record without its chain is never a hit. */
KVTIER_C_EXPORT kvtier_code kvtier_store_state(kvtier_cache* cache, const uint32_t* tokens,
                                               size_t num_tokens, uint32_t block,
                                               const void* const* record,
                                               const kvtier_request* request,
                                               kvtier_store_result* result);

/* Stores blocks[i] (kvtier_cache_block_bytes() bytes each) as full block first_block + i of
 * tokens[0..num_tokens). request and result may be NULL. INVALID_ARGUMENT when there are more
 * blocks than full blocks in tokens. */
KVTIER_C_EXPORT kvtier_code kvtier_store(kvtier_cache* cache, const uint32_t* tokens,
                                         size_t num_tokens, const void* const* blocks,
                                         size_t num_blocks, uint32_t first_block,
                                         const kvtier_request* request,
                                         kvtier_store_result* result);

/* The engine's own hashes of one stored block (for vLLM: the block hashes of the vLLM blocks
 * inside the kvtier block, oldest first), announced in the cache's KV events instead of kvtier's
 * key, so a router matches them to the hashes it computes (doc/events.md). */
typedef struct kvtier_engine_hashes {
  const uint8_t* hashes;     /* num_hashes hashes of hash_bytes bytes each, back to back */
  size_t hash_bytes;         /* 1..64 */
  size_t num_hashes;         /* 0: none for this block (it is announced by kvtier's key) */
  const uint8_t* parent;     /* hash_bytes bytes: the engine block before hashes[0]; NULL: none */
  const uint32_t* token_ids; /* every token of the block; may be NULL with num_tokens 0 */
  size_t num_tokens;
  const char* lora_name; /* NULL: none */
} kvtier_engine_hashes;

/* kvtier_store, with engine[i] the engine's hashes of blocks[i] (engine may be NULL: none).
 * Kept while the block is resident, when the cache publishes KV events
 * (kvtier_cache_wants_engine_hashes). INVALID_ARGUMENT for a hash size outside 1..64 or a
 * NULL pointer with a non-zero count. */
KVTIER_C_EXPORT kvtier_code kvtier_store_with_hashes(kvtier_cache* cache, const uint32_t* tokens,
                                                     size_t num_tokens, const void* const* blocks,
                                                     size_t num_blocks, uint32_t first_block,
                                                     const kvtier_request* request,
                                                     const kvtier_engine_hashes* engine,
                                                     kvtier_store_result* result);

/* Asynchronous stores (doc/c_api.md): one bounded queue and one background thread per cache,
 * in this process. kvtier_store_async hashes the request's keys, queues the store and returns;
 * the blocks are borrowed until done runs: the caller keeps them alive and unchanged until then
 * (a step copies its blocks into a buffer it owns first). done(user, code, result) runs once
 * per queued store, on the thread that stored it (never under a kvtier lock; it may queue
 * again); done may be NULL. RESOURCE_EXHAUSTED: the queue is full (the tiers fall behind), the
 * blocks were not stored, done never runs; counted as "async.dropped_blocks". */
typedef void (*kvtier_store_done)(void* user, kvtier_code code, const kvtier_store_result* result);
KVTIER_C_EXPORT kvtier_code kvtier_store_async(kvtier_cache* cache, const uint32_t* tokens,
                                               size_t num_tokens, const void* const* blocks,
                                               size_t num_blocks, uint32_t first_block,
                                               const kvtier_request* request,
                                               const kvtier_engine_hashes* engine,
                                               kvtier_store_done done, void* user);
/* Before a lookup of tokens: waits until no store of their full blocks is queued or running.
 * Queued ones are stored by the caller itself; timeout_ms bounds the wait for stores another
 * thread runs. UNAVAILABLE: it ran out (look up anyway: those blocks miss). */
KVTIER_C_EXPORT kvtier_code kvtier_store_wait(kvtier_cache* cache, const uint32_t* tokens,
                                              size_t num_tokens, const kvtier_request* request,
                                              uint32_t timeout_ms);
/* Waits until nothing is queued or running; UNAVAILABLE when timeout_ms ran out first. */
KVTIER_C_EXPORT kvtier_code kvtier_store_wait_idle(kvtier_cache* cache, uint32_t timeout_ms);

typedef enum kvtier_priority {
  KVTIER_PRIORITY_IDLE = 0,    /* SCHED_IDLE: CPU time no other thread wants (the default) */
  KVTIER_PRIORITY_NICE = 1,    /* the nice level in `nice` */
  KVTIER_PRIORITY_INHERIT = 2, /* the opening thread's */
} kvtier_priority;
typedef struct kvtier_store_queue_options {
  uint32_t max_batches; /* stores queued or running at most; 0 = 64 */
  int32_t priority;     /* a kvtier_priority */
  int32_t nice;         /* -20..19, for KVTIER_PRIORITY_NICE */
} kvtier_store_queue_options;
/* Opens the queue with these options, before the first kvtier_store_async (which otherwise
 * opens it with the defaults). INVALID_ARGUMENT when it is open already. */
KVTIER_C_EXPORT kvtier_code kvtier_store_queue_open(kvtier_cache* cache,
                                                    const kvtier_store_queue_options* options);

/* 1 when the cache publishes KV events, so a store's engine hashes are used (through a client:
 * the daemon said so when it connected); 0 otherwise or for NULL. */
KVTIER_C_EXPORT int kvtier_cache_wants_engine_hashes(const kvtier_cache* cache);

/* What is known of a session's lifecycle, for the session-aware eviction policy ("session"):
 * a session waiting on a tool call comes back; a finished one does not. */
typedef enum kvtier_session_event {
  KVTIER_SESSION_THINKING = 0, /* waiting on the user or a tool call: will come back */
  KVTIER_SESSION_ACTIVE = 1,   /* a request of the session is running */
  KVTIER_SESSION_FINISHED = 2, /* ended: its private blocks will not return */
  KVTIER_SESSION_RESET = 3     /* its context was reset: its old blocks will not return */
} kvtier_session_event;

/* Tells the cache (or the daemon, through a client) that session_id (non-zero, as given in
 * kvtier_request.session_id) did `event`. INVALID_ARGUMENT for session 0 or an unknown event. */
KVTIER_C_EXPORT kvtier_code kvtier_session_notify(kvtier_cache* cache, uint64_t session_id,
                                                  kvtier_session_event event);

/* The engine's planner chose to recompute blocks_by_tier[t] hit blocks of tier t (the cache's
 * tier order) rather than load them: counted as "tier.<name>.declined_blocks". Tiers past the
 * cache's are ignored; through a client, one-way (dropped while the daemon is unreachable).
 * INVALID_ARGUMENT for NULL arguments with n > 0. */
KVTIER_C_EXPORT kvtier_code kvtier_cache_note_declined(kvtier_cache* cache,
                                                       const uint32_t* blocks_by_tier, size_t n);

/* The cache's main counters (kvtier_cache_stat reaches every one). */
KVTIER_C_EXPORT kvtier_code kvtier_cache_stats(const kvtier_cache* cache, kvtier_stats* out);

/* One stat by name (doc/c_api.md): a cache field ("hit_blocks"), a tier's
 * ("tier.<tier name>.<field>", the tier's own counters too, e.g. "tier.ssd.degraded") and, for a
 * daemon's client, the daemon's own ("clients"). NOT_FOUND for a name this cache does not report;
 * UNAVAILABLE when a client cannot reach its daemon. Each call takes a fresh snapshot (through a
 * client, one round trip). */
KVTIER_C_EXPORT kvtier_code kvtier_cache_stat(const kvtier_cache* cache, const char* name,
                                              uint64_t* value);
/* Every name kvtier_cache_stat takes for this cache, separated by '\n'. *names is owned by the
 * library and valid until the calling thread's next kvtier_cache_stat_names call. */
KVTIER_C_EXPORT kvtier_code kvtier_cache_stat_names(const kvtier_cache* cache, const char** names);

#ifdef __cplusplus
}
#endif

#endif /* KVTIER_C_API_H_ */
