"""An engine connector's background stores, engine-neutral (no vLLM or torch import).

    saver = saver_for(cache, nice="idle")  # one per KvCache in this process
    saver.put([(keys, blocks, first_block, tenant, lora_id)], done)
    saver.wait_for(keys, timeout)        # a lookup that needs blocks still being stored
    pool = StagingPool(make)             # reused staging buffers: make(n) -> n blocks

A step copies its new blocks into a staging buffer once and hands them to the saver, whose
thread stores them while the engine computes on; a bounded queue drops a step's batch when the
tiers fall behind (a later miss), never memory without bound. At nice "idle" the thread runs
only on CPU time no other thread wants, and a lookup that needs a batch still queued stores it
itself, at its own priority.
Thread-safety: every function and method may be called from any thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import Any, Callable

import kvtier

logger = logging.getLogger("kvtier")


Nice = int | str | None  # a nice level, "idle" (SCHED_IDLE), or None: the process's own


def engine_hashes(blocks) -> list:
    """kvtier.EngineBlockHashes for each (hashes, parent, token_ids, lora_name) of a save
    entry's blocks (an entry's optional 7th field); a block with no hashes is announced by
    kvtier's key. None or []: no hashes at all."""
    if not blocks:
        return []
    return [kvtier.EngineBlockHashes(list(h), parent_hash=p or b"", token_ids=list(t),
                                     lora_name=n or "") for h, p, t, n in blocks]


def check_nice(nice: Nice) -> Nice:
    """nice as lower_priority takes it; ValueError naming it otherwise."""
    if nice is None or nice == "idle":
        return nice
    try:
        level = int(nice)
    except (TypeError, ValueError):
        raise ValueError(f"nice level {nice!r}: want 'idle', a number from -20 to 19, or "
                         "null") from None
    if not -20 <= level <= 19:
        raise ValueError(f"nice level {level}: want 'idle', a number from -20 to 19, or null")
    return level


def lower_priority(nice: Nice, log: logging.Logger = logger) -> None:
    """Lowers the calling thread's priority (Linux: per thread), so background work yields the
    CPU to the engine's forward pass. "idle": SCHED_IDLE, the thread runs only on CPU time no
    other thread wants (an engine leaves some idle at every step); a number: that
    nice level. Never fatal: a level the process may not take (below its own, without
    privilege) is left as it is."""
    if nice is None:
        return
    try:
        tid = threading.get_native_id()
        if nice == "idle":
            if hasattr(os, "SCHED_IDLE"):
                os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        elif hasattr(os, "setpriority") and (
                nice > os.getpriority(os.PRIO_PROCESS, tid) or os.geteuid() == 0):
            os.setpriority(os.PRIO_PROCESS, tid, int(nice))
    except OSError as e:
        log.info("kvtier: cannot lower the background thread's priority to %s (%s)", nice, e)


def runs_idle(tid: int) -> bool:
    """Whether thread tid runs at SCHED_IDLE (Linux)."""
    return hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(tid) == os.SCHED_IDLE


# One batch entry: (keys as (hi, lo) pairs, blocks [n, ...], first_block, tenant, lora_id
# [, session_id [, engine hashes: one (hashes, parent, token_ids, lora_name) per block or None]]).
Entry = tuple


class Saver:
    """Stores batches into a KvCache on a thread of its own, in order.

    A lookup whose own keys are still being stored waits for them (wait_for, bounded), so a
    prompt never misses the blocks its previous turn just produced; other lookups never wait.
    Keys still queued are stored by the waiter itself (with the batches queued before them), so
    a waiter never waits on a thread the scheduler holds back. At most MAX_PENDING batches wait;
    put() refuses more. The thread runs at `nice` (lower_priority).
    """

    MAX_PENDING = 64  # batches (one per engine step)

    def __init__(self, cache: kvtier.KvCache, nice: Nice = "idle",
                 log: logging.Logger = logger):
        self._cache = cache
        self._nice = check_nice(nice)
        self._log = log
        self._cond = threading.Condition()
        self._queue: list = []
        self._pending: dict[tuple[int, int], int] = {}
        self._in_flight = 0  # batches being stored, by the thread or by waiters
        self.dropped = 0  # batches refused because the queue was full
        self.thread = threading.Thread(target=self._run, name="kvtier-saver", daemon=True)
        self.thread.start()
        atexit.register(self.wait_idle, 30.0)

    @staticmethod
    def _keys(batch):
        return [k for entry in batch for k in entry[0]]

    def put(self, batch: list[Entry], done: Callable[[list], Any]) -> bool:
        """Queues batch; once stored, done([(result, error)] one per entry) runs on the thread
        that stored it (error: what that entry's store raised, else None). False: the queue is
        full and nothing was queued (done never runs)."""
        with self._cond:
            if len(self._queue) >= self.MAX_PENDING:
                self.dropped += 1
                return False
            self._queue.append((batch, done))
            for k in self._keys(batch):
                self._pending[k] = self._pending.get(k, 0) + 1
            self._cond.notify_all()
            return True

    def wait_for(self, keys, timeout: float) -> bool:
        """Waits until no key of keys ((hi, lo) pairs) is still being stored; False when timeout
        ran out first. Queued batches up to the last that holds one of keys are stored on this
        thread; timeout bounds only the wait for batches already in flight."""
        with self._cond:
            if not self._pending or not any(k in self._pending for k in keys):
                return True
            deadline = time.monotonic() + timeout
            want = set(keys)
            while any(k in self._pending for k in keys):
                if any(k in want for batch, _ in self._queue for k in self._keys(batch)):
                    item = self._take()
                    self._cond.release()
                    try:
                        self._store(*item)
                    finally:
                        self._cond.acquire()
                    continue
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_idle(self, timeout: float) -> bool:
        """Waits until every queued batch is stored; False when timeout ran out first."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._queue or self._in_flight:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _run(self) -> None:
        lower_priority(self._nice, self._log)
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                item = self._take()
            self._store(*item)

    def _take(self):
        """The queue's head, counted in flight; the caller holds self._cond."""
        self._in_flight += 1
        return self._queue.pop(0)

    def _store(self, batch, done) -> None:
        """Stores one batch taken off the queue (self._in_flight counts it) and runs done."""
        results = []
        for keys, blocks, first_block, tenant, lora_id, *rest in batch:
            result, error = None, None
            session = rest[0] if rest else 0
            engine = rest[1] if len(rest) > 1 else None
            try:
                result = self._cache.store_keys(
                    [kvtier.BlockKey(hi, lo) for hi, lo in keys], blocks,
                    first_block=first_block, tenant=tenant, lora_id=lora_id,
                    session_id=session, engine_hashes=engine_hashes(engine))
            except Exception as e:  # noqa: BLE001 - one bad entry must not stop the saver
                error = e
            results.append((result, error))
        try:
            done(results)
        except Exception:  # noqa: BLE001 - a bug in a callback must not stop the saver
            self._log.exception("kvtier: save completion failed")
        finally:
            with self._cond:
                for k in self._keys(batch):
                    n = self._pending.pop(k) - 1
                    if n:
                        self._pending[k] = n
                self._in_flight -= 1
                self._cond.notify_all()


class StagingPool:
    """Staging buffers reused across steps: a step takes one big enough for its blocks, the
    saver gives it back once stored. Steps overlap with the stores of earlier ones, so a few are
    in use at once; at most KEEP idle ones are kept. make(n) allocates a buffer of n blocks (any
    array with .shape[0] == n); buffers are told apart by identity, never compared by value."""

    KEEP = 4
    MIN_BLOCKS = 8

    def __init__(self, make: Callable[[int], Any]):
        self._make = make
        self._lock = threading.Lock()
        self._free: list = []

    def take(self, n: int):
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if b.shape[0] >= n]
            if fits:
                best = min(fits, key=lambda i: self._free[i].shape[0])
                return self._free.pop(best)
        return self._make(max(n, self.MIN_BLOCKS))

    def give(self, buf) -> None:
        with self._lock:
            self._free.append(buf)
            if len(self._free) > self.KEEP:
                smallest = min(range(len(self._free)), key=lambda i: self._free[i].shape[0])
                self._free.pop(smallest)

    def idle(self) -> int:
        """Idle buffers kept (tests, diagnostics)."""
        with self._lock:
            return len(self._free)


_lock = threading.Lock()
_savers: dict[int, Saver] = {}


def saver_for(cache: kvtier.KvCache, nice: Nice = "idle",
              log: logging.Logger = logger) -> Saver:
    """The process's one Saver of cache (made on first use, at nice)."""
    with _lock:
        saver = _savers.get(id(cache))
        if saver is None:
            saver = Saver(cache, nice, log)
            _savers[id(cache)] = saver
        return saver


def savers() -> list[Saver]:
    with _lock:
        return list(_savers.values())


def wait_saves(timeout: float = 30.0) -> bool:
    """Waits until every saver of this process is idle; False when timeout ran out."""
    return all(s.wait_idle(timeout) for s in savers())
