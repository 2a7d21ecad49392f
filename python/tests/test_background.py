"""An engine connector's background stores (kvtier.integrations.background), outside any engine:
the saver's order, waits, bounds and failures, and the staging pool's reuse."""

import os
import threading

import numpy as np
import pytest

import kvtier
from kvtier.integrations.background import Saver, StagingPool, check_nice, runs_idle


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


class GatedCache:
    """Stands in for a KvCache whose stores wait for a gate: the saver's queue and waits can be
    observed while a store is in flight."""

    def __init__(self, fail_first=False, gate_only_first=False):
        self.gate = threading.Event()
        self.entered = threading.Event()  # a store is in flight
        self.stored = []
        self.fail_first = fail_first
        self.gate_only_first = gate_only_first  # later stores pass at once

    def store_keys(self, keys, blocks, **kw):
        first = not self.entered.is_set()
        self.entered.set()
        if first or not self.gate_only_first:
            assert self.gate.wait(30), "the test never opened the gate"
        if self.fail_first and not self.stored:
            self.stored.append(None)
            raise kvtier.Unavailable("the daemon went away")
        self.stored.append([(k.hi, k.lo) for k in keys])
        return len(keys)


def test_saver_stores_batches_in_order_and_reports_each_entry(cache):
    saver = Saver(cache, nice=None)
    a, b = chain(cache, 0, 3), chain(cache, 1000, 2)
    got = []
    done = threading.Event()
    assert saver.put([(a, blocks(cache, 3, 1), 0, "", ""), (b, blocks(cache, 2, 2), 0, "", "")],
                     lambda results: (got.extend(results), done.set()))
    assert done.wait(30) and saver.wait_idle(30)
    assert [r.stored_blocks for r, _ in got] == [3, 2] and [e for _, e in got] == [None, None]
    with cache.lookup_keys([kvtier.BlockKey(hi, lo) for hi, lo in a]) as hit:
        assert hit.hit_blocks == 3
        out = np.zeros((3, cache.layout.bytes_per_block), dtype=np.uint8)
        assert cache.load(hit, out).loaded_blocks == 3
    np.testing.assert_array_equal(out, blocks(cache, 3, 1))


def test_wait_for_waits_only_for_keys_being_stored():
    fake = GatedCache()
    saver = Saver(fake, nice=None)
    mine, other = [(1, 1), (1, 2)], [(2, 1)]
    assert saver.put([(mine, None, 0, "", "")], lambda results: None)
    assert fake.entered.wait(30)  # in flight on the saver's thread
    assert saver.wait_for(other, timeout=0.0)  # not being stored: no wait at all
    assert not saver.wait_for(mine, timeout=0.05)  # still in flight: the timeout bounds it
    assert not saver.wait_idle(0.05)
    fake.gate.set()
    assert saver.wait_for(mine, timeout=30) and saver.wait_idle(30)
    assert fake.stored == [mine]


def test_a_waiter_stores_queued_keys_itself_and_waits_only_for_those_in_flight():
    # The saver's thread is held inside the first store (as a thread at SCHED_IDLE is when
    # other threads keep every CPU busy); a lookup needing the second batch stores it itself.
    fake = GatedCache(gate_only_first=True)
    saver = Saver(fake, nice=None)
    first, second, third = [(1, 1)], [(2, 1)], [(3, 1)]
    ran_on = {}
    assert saver.put([(first, None, 0, "", "")], lambda r: None)
    assert fake.entered.wait(30)
    for name, keys in (("second", second), ("third", third)):
        assert saver.put([(keys, None, 0, "", "")],
                         lambda r, name=name: ran_on.setdefault(name, threading.get_ident()))
    assert saver.wait_for(second, timeout=0.0)  # stored on this thread: no wait at all
    assert fake.stored == [second] and ran_on == {"second": threading.get_ident()}
    assert not saver.wait_for(first, timeout=0.05)  # in flight on the thread: waited for
    assert not saver.wait_idle(0.05)
    fake.gate.set()
    assert saver.wait_idle(30)
    assert fake.stored == [second, first, third] and ran_on["third"] == saver.thread.ident


def test_full_queue_refuses_a_batch_and_keeps_the_rest():
    fake = GatedCache()
    saver = Saver(fake, nice=None)
    calls = []
    # One batch is taken by the thread (blocked at the gate), MAX_PENDING wait in the queue.
    assert saver.put([([(0, 0)], None, 0, "", "")], calls.append)
    assert fake.entered.wait(30)
    accepted = [saver.put([([(i, 1)], None, 0, "", "")], calls.append)
                for i in range(1, Saver.MAX_PENDING + 2)]
    assert accepted == [True] * Saver.MAX_PENDING + [False] and saver.dropped == 1
    assert saver.wait_for([(Saver.MAX_PENDING + 1, 1)], 0)  # the refused keys are not pending
    fake.gate.set()
    assert saver.wait_idle(30)
    assert len(calls) == Saver.MAX_PENDING + 1  # a refused batch's callback never runs
    assert fake.stored == [[(i, 1 if i else 0)] for i in range(Saver.MAX_PENDING + 1)]


def test_a_failed_store_and_a_failing_callback_do_not_stop_the_saver():
    fake = GatedCache(fail_first=True)
    fake.gate.set()
    saver = Saver(fake, nice=None)
    results = []

    def bad_callback(r):
        results.append(r)
        raise RuntimeError("a bug in the engine's callback")

    assert saver.put([([(1, 1)], None, 0, "", "")], bad_callback)
    assert saver.put([([(2, 2)], None, 0, "", "")], results.append)
    assert saver.wait_idle(30)
    (first,), (second,) = results
    assert first[0] is None and isinstance(first[1], kvtier.Unavailable)
    assert second == (1, None)
    assert saver.wait_for([(1, 1), (2, 2)], 0)  # nothing left pending


def test_wrong_size_block_is_an_error_for_that_entry_only(cache):
    saver = Saver(cache, nice=None)
    got = []
    wrong = np.zeros((1, 10), dtype=np.uint8)
    assert saver.put([(chain(cache, 0, 1), wrong, 0, "", ""),
                      (chain(cache, 500, 1), blocks(cache, 1, 3), 0, "", "")], got.extend)
    assert saver.wait_idle(30)
    assert isinstance(got[0][1], ValueError) and got[1][0].stored_blocks == 1


@pytest.mark.skipif(not hasattr(os, "getpriority"), reason="thread nice levels are Linux only")
def test_saver_thread_runs_at_its_nice_level():
    fake = GatedCache()
    fake.gate.set()
    saver = Saver(fake, nice=12)
    assert saver.put([([(1, 1)], None, 0, "", "")], lambda r: None) and saver.wait_idle(30)
    own = os.getpriority(os.PRIO_PROCESS, 0)
    want = 12 if (12 > own or os.geteuid() == 0) else own
    assert os.getpriority(os.PRIO_PROCESS, saver.thread.native_id) == want


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux only")
def test_saver_thread_runs_at_sched_idle_by_default():
    fake = GatedCache()
    fake.gate.set()
    saver = Saver(fake)
    assert saver.put([([(1, 1)], None, 0, "", "")], lambda r: None) and saver.wait_idle(30)
    assert runs_idle(saver.thread.native_id) and not runs_idle(threading.get_native_id())


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
