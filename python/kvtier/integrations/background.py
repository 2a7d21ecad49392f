"""An engine connector's background stores, engine-neutral (no vLLM or torch import).

    saver = saver_for(cache, nice="idle")  # the library's kvtier.AsyncStore, one per KvCache
    saver.submit([(keys, blocks, first_block, tenant, lora_id)], done)
    saver.wait_for(keys, timeout)        # a lookup that needs blocks still being stored
    pool = StagingPool(make)             # reused staging buffers: make(n) -> n blocks

A step copies its new blocks into a staging buffer once and hands them to the saver, whose
thread (the library's, in C++: the queue every binding uses) stores them while the engine
computes on; its bounded queue drops a step's batch when the tiers fall behind (a later miss),
never memory without bound. At nice "idle" the thread runs only on CPU time no other thread
wants, and a lookup that needs a batch still queued stores it itself, at its own priority.
Thread-safety: every function and method may be called from any thread.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from typing import Any, Callable

import kvtier

logger = logging.getLogger("kvtier")


Nice = int | str | None  # a nice level, "idle" (SCHED_IDLE), or None: the process's own

MAX_PENDING = 64  # batches (one per engine step) a saver holds at most


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
_savers: dict[int, kvtier.AsyncStore] = {}


def saver_for(cache: kvtier.KvCache, nice: Nice = "idle") -> kvtier.AsyncStore:
    """The process's one kvtier.AsyncStore of cache (made on first use, its thread at nice;
    closed at exit, which stores what is still queued)."""
    with _lock:
        saver = _savers.get(id(cache))
        if saver is None or saver.closed:
            saver = kvtier.AsyncStore(cache, max_batches=MAX_PENDING, nice=check_nice(nice))
            _savers[id(cache)] = saver
            atexit.register(saver.close)
        return saver


def savers() -> list[kvtier.AsyncStore]:
    with _lock:
        return list(_savers.values())


def wait_saves(timeout: float = 30.0) -> bool:
    """Waits until every saver of this process is idle; False when timeout ran out."""
    return all(s.wait_idle(timeout) for s in savers())
