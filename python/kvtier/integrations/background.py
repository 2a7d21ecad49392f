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
import contextlib
import logging
import os
import re
import threading
from typing import Any, Callable, Iterator

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


def parse_cpus(text: str) -> set[int]:
    """CPU ids of a list like "0,2-4" or "0 1 2" (ValueError naming what it cannot read)."""
    cpus: set[int] = set()
    for part in re.split(r"[,\s]+", text.strip()):
        if not part:
            continue
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if m is None:
            raise ValueError(f"CPU list {text!r}: cannot read {part!r} (want e.g. \"2,3\" or "
                             "\"2-5\")")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise ValueError(f"CPU list {text!r}: range {part!r} runs backwards")
        cpus.update(range(lo, hi + 1))
    return cpus


def openmp_cpus(env=None) -> set[int] | None:
    """The CPUs the process's OpenMP threads are bound to, read from the variables an OpenMP
    runtime binds by (vLLM's CPU workers set them: KMP_AFFINITY's proclist for Intel's runtime,
    GOMP_CPU_AFFINITY for GNU's, else OMP_PLACES with OMP_PROC_BIND); None when unbound."""
    env = os.environ if env is None else env
    m = re.search(r"proclist=\[([^\]]*)\]", env.get("KMP_AFFINITY", ""))
    if m:
        return parse_cpus(m.group(1)) or None
    if env.get("GOMP_CPU_AFFINITY", "").strip():
        return parse_cpus(env["GOMP_CPU_AFFINITY"]) or None
    places, bind = env.get("OMP_PLACES", ""), env.get("OMP_PROC_BIND", "").lower()
    if places.strip() and bind not in ("", "false"):
        # Explicit places only ("{0,1},{2:2}", interval "{a:n}" or "{a:n:s}"); abstract names
        # (cores, threads) bind to no list a process can read here.
        cpus: set[int] = set()
        for place in re.findall(r"\{([^}]*)\}", places):
            for item in place.split(","):
                f = [int(x) for x in item.split(":")] if item.strip() else []
                if len(f) == 1:
                    cpus.add(f[0])
                elif len(f) in (2, 3):
                    cpus.update(range(f[0], f[0] + f[1] * (f[2] if len(f) == 3 else 1),
                                      f[2] if len(f) == 3 else 1))
        return cpus or None
    return None


def _launch_cpus() -> set[int]:
    """The CPUs this process was started on: its parent's affinity (an OpenMP runtime has since
    bound this process's main thread, and every thread it starts inherits that), else every
    CPU online."""
    try:
        return set(os.sched_getaffinity(os.getppid()))
    except OSError:
        return set(range(os.cpu_count() or 1))


def background_cpus(spec, env=None, engine_cpus: set[int] = frozenset()) -> set[int] | None:
    """The CPUs an engine connector's background threads (its loader, its saver and the cache's
    own threads) run on; None: wherever the thread that starts them may run.
    "auto": where the engine binds its OpenMP threads (openmp_cpus), the CPUs the process was
    started on outside them (vLLM's CPU build reserves such CPUs for the scheduler and for
    connectors), None when there are none or nothing is bound; engine_cpus: more CPUs to keep
    off (other ranks' OpenMP threads, where the engine says). "inherit" or None: None. A list
    ("2,3", "4-7", or a list of ints): those CPUs. ValueError naming the value otherwise."""
    if spec is None or spec == "inherit":
        return None
    if not hasattr(os, "sched_setaffinity"):
        return None
    if spec == "auto":
        bound = openmp_cpus(env)
        if not bound:
            return None
        return (_launch_cpus() - bound - set(engine_cpus)) or None
    if isinstance(spec, (list, tuple)):
        if not all(isinstance(c, int) and c >= 0 for c in spec):
            raise ValueError(f"CPU list {spec!r}: want CPU numbers")
        cpus = set(spec)
    elif isinstance(spec, str):
        cpus = parse_cpus(spec)
    else:
        raise ValueError(f"{spec!r}: want \"auto\", \"inherit\" or a CPU list like \"2,3\"")
    if not cpus:
        raise ValueError(f"CPU list {spec!r} is empty")
    online = _launch_cpus() | set(range(os.cpu_count() or 1))
    if not cpus <= online:
        raise ValueError(f"CPU list {spec!r}: no CPU {sorted(cpus - online)[0]} here (CPUs "
                         f"0-{(os.cpu_count() or 1) - 1})")
    return cpus


def pin_thread(cpus: set[int] | None, log: logging.Logger = logger) -> None:
    """Moves the calling thread onto cpus (Linux: per thread); never fatal."""
    if cpus:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError as e:
            log.info("kvtier: cannot move a background thread to CPUs %s (%s)", sorted(cpus), e)


@contextlib.contextmanager
def starting_on(cpus: set[int] | None) -> Iterator[None]:
    """Threads started inside (the library's own, in C++ too) inherit cpus: the calling thread
    is moved there for the duration and back after."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    pin_thread(cpus)
    try:
        yield
    finally:
        try:
            os.sched_setaffinity(0, before)
        except OSError:
            pass


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
