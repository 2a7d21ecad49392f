"""An engine connector's background stores (kvtier.AsyncStore, the library's queue, through
kvtier.integrations.background), outside any engine: order, waits, bounds and failures, and the
staging pool's reuse."""

import os
import sys
import threading

import numpy as np
import pytest

import kvtier
from kvtier.integrations.background import (StagingPool, background_cpus, check_nice,
                                            openmp_cpus, parse_cpus, runs_idle, saver_for,
                                            starting_on)


def small_layout():
    return kvtier.KvLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="fp32",
                           block_tokens=16)


@pytest.fixture
def cache():
    return kvtier.open_cache(small_layout(), [kvtier.host_tier("4MiB")], model_id="m")


def chain(cache, first_token, n):
    tokens = list(range(first_token, first_token + 16 * n))
    return [(k.hi, k.lo) for k in kvtier.hash_prefix(cache.root(), 16, tokens)]


def blocks(cache, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, size=(n, cache.layout.bytes_per_block), dtype=np.uint8)


class Gate:
    """A done callback that holds the thread that runs it until the test opens the gate: the
    queue and the waits can be observed while a batch is in flight."""

    def __init__(self):
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.threads = []

    def __call__(self, results):
        self.threads.append(threading.get_ident())
        self.entered.set()
        assert self.gate.wait(30), "the test never opened the gate"


def keys_of(pairs):
    return [kvtier.BlockKey(hi, lo) for hi, lo in pairs]


def test_saver_stores_batches_in_order_and_reports_each_entry(cache):
    with kvtier.AsyncStore(cache, nice=None) as saver:
        a, b = chain(cache, 0, 3), chain(cache, 1000, 2)
        got = []
        done = threading.Event()
        assert saver.submit([(a, blocks(cache, 3, 1), 0, "", ""),
                             (keys_of(b), blocks(cache, 2, 2), 0, "", "")],
                            lambda results: (got.extend(results), done.set()))
        assert done.wait(30) and saver.wait_idle(30)
        assert [r.stored_blocks for r, _ in got] == [3, 2] and [e for _, e in got] == [None, None]
        with cache.lookup_keys(keys_of(a)) as hit:
            assert hit.hit_blocks == 3
            out = np.zeros((3, cache.layout.bytes_per_block), dtype=np.uint8)
            assert cache.load(hit, out).loaded_blocks == 3
        np.testing.assert_array_equal(out, blocks(cache, 3, 1))
        assert saver.stats()["stored_batches"] == 1


def test_a_waiter_stores_queued_keys_itself_and_waits_only_for_those_in_flight(cache):
    # The saver's thread is held in the first batch's callback (as a thread at SCHED_IDLE is
    # when other threads keep every CPU busy); a lookup needing the second batch stores it itself.
    gate = Gate()
    with kvtier.AsyncStore(cache, nice=None) as saver:
        first, second, third = chain(cache, 0, 1), chain(cache, 100, 1), chain(cache, 200, 2)
        ran_on = {}
        assert saver.submit([(first, blocks(cache, 1, 1), 0, "", "")], gate)
        assert gate.entered.wait(30)
        for name, keys in (("second", second), ("third", third)):
            assert saver.submit([(keys, blocks(cache, len(keys), 2), 0, "", "")],
                                lambda r, name=name: ran_on.setdefault(name, threading.get_ident()))
        assert saver.wait_for(chain(cache, 900, 1), timeout=0.0)  # nobody stores it: no wait
        assert saver.wait_for(second, timeout=0.0)  # stored on this thread: no wait at all
        assert ran_on == {"second": threading.get_ident()}
        with cache.lookup_keys(keys_of(second)) as hit:
            assert hit.hit_blocks == 1
        assert not saver.wait_for(first, timeout=0.05)  # in flight on the thread: waited for
        assert not saver.wait_idle(0.05)
        gate.gate.set()
        assert saver.wait_idle(30)
        assert ran_on["third"] == gate.threads[0] != threading.get_ident()
        assert saver.stats()["stored_by_waiters"] == 1


def test_full_queue_refuses_a_batch_and_keeps_the_rest(cache):
    gate = Gate()
    calls = []
    with kvtier.AsyncStore(cache, max_batches=4, nice=None) as saver:
        # One batch is held by the thread in its callback, three wait in the queue.
        assert saver.submit([(chain(cache, 0, 1), blocks(cache, 1, 0), 0, "", "")], gate)
        assert gate.entered.wait(30)
        refused = chain(cache, 4000, 2)
        accepted = [saver.submit([(chain(cache, 1000 * i, 1), blocks(cache, 1, i), 0, "", "")],
                                 calls.append) for i in range(1, 4)]
        accepted.append(saver.submit([(refused, blocks(cache, 2, 9), 0, "", "")], calls.append))
        assert accepted == [True, True, True, False] and saver.dropped == 1
        assert saver.stats()["dropped_blocks"] == 2
        assert saver.wait_for(refused, 0)  # the refused keys are not pending
        gate.gate.set()
        assert saver.wait_idle(30)
    assert len(calls) == 3  # a refused batch's callback never runs
    with cache.lookup_keys(keys_of(refused)) as hit:
        assert hit.hit_blocks == 0


def test_a_failing_callback_does_not_stop_the_saver(cache, monkeypatch):
    results, reported = [], []
    # The callback's exception is reported as unraisable (the thread has no caller to raise to).
    monkeypatch.setattr(sys, "unraisablehook", lambda u: reported.append(u.exc_value))

    def bad_callback(r):
        results.append(r)
        raise RuntimeError("a bug in the engine's callback")

    with kvtier.AsyncStore(cache, nice=None) as saver:
        assert saver.submit([(chain(cache, 0, 1), blocks(cache, 1, 1), 0, "", "")], bad_callback)
        assert saver.submit([(chain(cache, 50, 1), blocks(cache, 1, 2), 0, "", "")],
                            results.append)
        assert saver.wait_idle(30)
    (first,), (second,) = results
    assert first[0].stored_blocks == 1 and second[0].stored_blocks == 1
    assert [str(e) for e in reported] == ["a bug in the engine's callback"]


def test_a_failed_store_is_that_entrys_error():
    # A daemon that is not running: the store fails with Unavailable, reported per entry.
    layout = small_layout()
    client = kvtier.Client.connect(layout, socket="/nonexistent/kvtier.sock", model_id="m",
                                   timeout_ms=50)
    got = []
    with kvtier.AsyncStore(client, nice=None) as saver:
        keys = kvtier.hash_prefix(client.root(), 16, list(range(16)))
        assert saver.submit([(keys, np.zeros((1, layout.bytes_per_block), np.uint8), 0, "", "")],
                            got.extend)
        assert saver.wait_idle(30)
    (result, error), = got
    assert result is None or result.failed_blocks == 1
    assert result is not None or "Unavailable" in error


def test_wrong_size_block_is_refused_at_submit_and_nothing_is_queued(cache):
    with kvtier.AsyncStore(cache, nice=None) as saver:
        wrong = np.zeros((1, 10), dtype=np.uint8)
        with pytest.raises(ValueError, match=r"batch\[1\] blocks"):
            saver.submit([(chain(cache, 500, 1), blocks(cache, 1, 3), 0, "", ""),
                          (chain(cache, 0, 1), wrong, 0, "", "")], None)
        assert saver.stats()["submitted_batches"] == 0
        with pytest.raises(ValueError, match="nice"):
            kvtier.AsyncStore(cache, nice="low")
    with pytest.raises(kvtier.Unavailable, match="closed"):
        saver.submit([], None)


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="thread nice levels are Linux only")
def test_saver_thread_runs_at_its_nice_level(cache):
    with kvtier.AsyncStore(cache, nice=12) as saver:
        assert saver.submit([(chain(cache, 0, 1), blocks(cache, 1, 1), 0, "", "")])
        assert saver.wait_idle(30)
        own = os.getpriority(os.PRIO_PROCESS, 0)
        want = 12 if (12 > own or os.geteuid() == 0) else own
        assert os.getpriority(os.PRIO_PROCESS, saver.thread_id) == want


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux only")
def test_saver_thread_runs_at_sched_idle_by_default(cache):
    saver = saver_for(cache)
    assert saver is saver_for(cache)  # one per cache in a process
    assert saver.submit([(chain(cache, 0, 1), blocks(cache, 1, 1), 0, "", "")])
    assert saver.wait_idle(30)
    assert runs_idle(saver.thread_id) and not runs_idle(threading.get_native_id())
    saver.close()


def test_nice_levels_are_checked():
    assert check_nice("idle") == "idle" and check_nice(None) is None and check_nice("7") == 7
    for bad in ("low", 20, -21, 1.5j):
        with pytest.raises(ValueError, match="nice level"):
            check_nice(bad)


def test_staging_pool_reuses_buffers_by_identity_across_sizes():
    made = []

    def make(n):
        made.append(np.zeros((n, 4), dtype=np.float32))
        return made[-1]

    pool = StagingPool(make)
    small, big = pool.take(3), pool.take(20)
    assert small.shape[0] == StagingPool.MIN_BLOCKS and big.shape[0] == 20
    pool.give(small)
    pool.give(big)
    # The smallest buffer that fits, told apart by identity (arrays of other shapes in the list
    # must never be compared by value).
    assert pool.take(10) is big
    assert pool.take(5) is small
    assert len(made) == 2
    pool.give(big)
    pool.give(small)
    for n in (30, 40, 50, 60):
        pool.give(make(n))
    assert pool.idle() == StagingPool.KEEP
    assert pool.take(1).shape[0] == 30  # the smallest kept: the two smallest were let go


def test_openmp_binding_is_read_from_each_runtimes_variables():
    # The forms vLLM's CPU process manager writes for Intel's, GNU's and the standard runtime.
    assert openmp_cpus({"KMP_AFFINITY": "granularity=fine,explicit,proclist=[0,1,5]"}) == {0, 1, 5}
    assert openmp_cpus({"GOMP_CPU_AFFINITY": "0 1 2"}) == {0, 1, 2}
    assert openmp_cpus({"OMP_PLACES": "{0,1,2}", "OMP_PROC_BIND": "true"}) == {0, 1, 2}
    assert openmp_cpus({"OMP_PLACES": "{0:4:2}", "OMP_PROC_BIND": "close"}) == {0, 2, 4, 6}
    # Places without binding, abstract places and nothing at all: not bound to a list.
    assert openmp_cpus({"OMP_PLACES": "{0}", "OMP_PROC_BIND": "false"}) is None
    assert openmp_cpus({"OMP_PLACES": "cores", "OMP_PROC_BIND": "true"}) is None
    assert openmp_cpus({}) is None


def test_background_cpus_are_the_launch_cpus_outside_openmps():
    launch = os.sched_getaffinity(os.getppid())
    if len(launch) < 2:
        pytest.skip("one CPU: nothing is left outside OpenMP's")
    first = min(launch)
    assert background_cpus("auto", {"OMP_PLACES": f"{{{first}}}",
                                    "OMP_PROC_BIND": "true"}) == launch - {first}
    assert background_cpus("auto", {}) is None  # unbound: threads stay where they start
    assert background_cpus("auto", {"GOMP_CPU_AFFINITY": " ".join(map(str, launch))}) is None
    assert background_cpus("inherit") is None and background_cpus(None) is None
    assert background_cpus(f"{first}") == {first} == background_cpus([first])


def test_background_cpus_refuse_what_they_cannot_use():
    with pytest.raises(ValueError, match="cannot read 'x'"):
        background_cpus("1,x")
    with pytest.raises(ValueError, match="runs backwards"):
        parse_cpus("3-1")
    with pytest.raises(ValueError, match="no CPU 4096"):
        background_cpus("4096")
    with pytest.raises(ValueError, match="want"):
        background_cpus(1.5)


def test_threads_started_inside_starting_on_inherit_its_cpus(cache):
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        pytest.skip("one CPU: no other set to move to")
    target = {max(cpus)}
    seen = []
    with starting_on(target):
        t = threading.Thread(target=lambda: seen.append(os.sched_getaffinity(0)))
        t.start()
        saver = kvtier.AsyncStore(cache, nice=None)  # the library's C++ thread
    t.join()
    assert seen == [target]
    assert os.sched_getaffinity(0) == cpus  # the caller is back where it was
    try:
        saver.submit([(chain(cache, 0, 1), blocks(cache, 1, 0), 0, "", "")])
        assert saver.wait_idle(10)  # the thread has run: its id is known
        assert saver.thread_id > 0
        assert os.sched_getaffinity(saver.thread_id) == target
    finally:
        saver.close()
