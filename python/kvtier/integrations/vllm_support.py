"""The vLLM connector's plumbing shared by its two halves (vllm.py, vllm_worker.py): the step
metadata, counters, hook timing, the stats writer, the loader thread. Imported by vllm.py after
its version check."""

from __future__ import annotations

import atexit
import hashlib
import os
import queue
import threading
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.logger import init_logger

from kvtier.integrations.background import lower_priority, pin_thread, wait_saves

if TYPE_CHECKING:
    from kvtier.integrations.vllm import KvtierConnector

# Under "vllm." so vLLM's log configuration shows our lines beside its own.
logger = init_logger("vllm.kvtier")
_lock = threading.Lock()


# --------------------------------------------------------------------------------------------
# Metadata: what the scheduler half tells the worker half for one step. Plain lists of ints, so
# it pickles when the worker lives in another process.


@dataclass
class _Transfer:
    req_id: str
    keys: list[tuple[int, int]]  # kvtier keys (hi, lo), chain positions first_block..
    first_block: int
    # Per KV-cache group, the vLLM pages the blocks keep, block after block (vllm_groups);
    # -1 in a load: a page not written (vLLM computed it, or the group does not need it).
    pages: list[list[int]]
    from_token: int = 0  # loads: vLLM's own hit, where the load starts writing
    restorable: int = 1 << 30  # loads: leading blocks every group can be restored from
    tenant: str = ""
    lora_id: str = ""
    session: int = 0
    is_async: bool = False  # a load run on the loader thread, reported by get_finished
    # Saves, when the cache publishes KV events: per kvtier block, vLLM's own (hashes, parent,
    # token_ids, lora_name), so kvtier announces the blocks as vLLM names them.
    engine: list | None = None
    # Saves of a model with state groups: (i, state keys) per block keys[i] that holds every
    # state at its end: its state record is stored under them (kvtier.state_keys).
    resume: list = field(default_factory=list)
    # Loads of such a model: the last `states` keys are the last block's state record.
    states: int = 0


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


class _Counters:
    """What the connector did, for logs and tests; dumped to stats_path when it changes."""

    def __init__(self):
        self.lock = threading.Lock()
        self.values = {"lookup_requests": 0, "lookup_hit_tokens": 0, "load_blocks": 0,
                       "load_failed_blocks": 0, "loaded_tokens": 0, "save_blocks": 0,
                       "save_failed_blocks": 0, "errors": 0, "async_loads": 0,
                       "promised_missed_blocks": 0, "save_unreachable_blocks": 0,
                       "unrestorable_blocks": 0, "save_state_records": 0, "resume_probes": 0,
                       "resume_missed": 0, "async_lookups": 0}
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
HOOK_MAX_SECONDS: dict[str, float] = {}  # one call's longest, per hook (a step it held up)


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
            if dt > HOOK_MAX_SECONDS.get(fn.__name__, 0.0):
                HOOK_MAX_SECONDS[fn.__name__] = dt

    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    return wrapper


class _StatsWriter:
    """Writes connectors' stats files on a background thread (one per process), never on vLLM's
    step: a hook only marks its connector dirty. Writes are coalesced (at most one per
    connector every MIN_INTERVAL_S); flush() writes what is pending at once (shutdown, exit).
    Thread-safety: all methods may be called from any thread."""

    MIN_INTERVAL_S = 0.25

    def __init__(self, nice: int | None, cpus: set[int] | None = None):
        self._cond = threading.Condition()
        self._dirty: dict[int, "KvtierConnector"] = {}
        self._thread = threading.Thread(target=self._run, args=(nice, cpus),
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

    def _run(self, nice, cpus) -> None:
        lower_priority(nice, logger)
        pin_thread(cpus, logger)
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


def _stats_writer_for(nice: int | None, cpus: set[int] | None = None) -> _StatsWriter:
    global _stats_writer
    with _lock:
        if _stats_writer is None:
            _stats_writer = _StatsWriter(nice, cpus)
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

    def __init__(self, run, nice, cpus=None):
        self._run = run
        self._nice = nice
        self._cpus = cpus
        self.ran_on: list[int] | None = None  # the CPUs the thread may run on, once it runs
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
        pin_thread(self._cpus, logger)
        self.ran_on = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        while True:
            t = self._queue.get()
            try:
                outcome = self._run(t)
            except Exception:  # noqa: BLE001 - a bug must cost this load, never the thread
                logger.exception("kvtier: an asynchronous load failed; vLLM recomputes it")
                outcome = _LoadOutcome(failed=True,
                                       failed_ids=[p for p in t.pages[0] if p >= 0])
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
    failed: bool = False  # blocks did not load (a grouped layout recomputes the request)
    tier: str = ""  # the slowest tier the load read from (its timing sample's tier)
    seconds: float = 0.0
    nbytes: int = 0
