"""kvtier.Client against a real `kvtier serve`: the same calls as the in-process Cache."""

import time

import numpy as np
import pytest

import kvtier
from daemon import Daemon

LAYOUT = kvtier.KvLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="fp32",
                         block_tokens=16)
LAYOUT_YAML = "{num_layers: 2, num_kv_heads: 2, head_dim: 64, dtype: fp32, block_tokens: 16}"


@pytest.fixture
def daemon(tmp_path):
    d = Daemon(tmp_path, LAYOUT_YAML, disk_dir=str(tmp_path / "ssd")).start()
    yield d
    d.kill()


def blocks(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, LAYOUT.bytes_per_block), dtype=np.uint8)


def test_two_clients_share_blocks_through_the_daemon(daemon):
    writer = kvtier.Client.connect(LAYOUT, socket=daemon.socket, model_id="m",
                                   model_revision="r1")
    reader = kvtier.Client.connect(LAYOUT, socket=daemon.socket, model_id="m",
                                   model_revision="r1")
    assert writer.wait_connected(5000) and reader.wait_connected(5000)
    # The daemon claimed untouched arena slots for the tenant (serve.warm_ahead), which its
    # clients in this process fault in on a thread of their own.
    assert writer.daemon_stats()["warm_claimed_blocks"] > 0
    deadline = time.monotonic() + 30
    while writer.client_stats()["warmed_bytes"] + reader.client_stats()["warmed_bytes"] == 0:
        assert time.monotonic() < deadline, "no arena page was warmed"
        time.sleep(0.01)
    tokens = list(range(5 * 16 + 3))
    data = blocks(5, 1)
    stored = writer.store(tokens, data)
    assert stored.stored_blocks == 5
    out = np.zeros_like(data)
    with reader.lookup(tokens) as hit:
        assert hit.hit_blocks == 5
        got = reader.load(hit, out)
        assert got.loaded_blocks == 5
    assert np.array_equal(out, data)
    # Another revision of the weights never sees them.
    other = kvtier.Client.connect(LAYOUT, socket=daemon.socket, model_id="m",
                                  model_revision="r2")
    with other.lookup(tokens) as hit:
        assert hit.hit_blocks == 0
    assert reader.stats()["stored_blocks"] >= 5  # the daemon's own figures
    with pytest.raises(ValueError):
        reader.load(reader.lookup(tokens), np.zeros((5, 7), np.uint8))  # wrong block size


def test_a_killed_daemon_is_a_miss_within_the_deadline_and_a_restart_serves_ssd(daemon):
    c = kvtier.Client.connect(LAYOUT, socket=daemon.socket, model_id="m", timeout_ms=300)
    assert c.wait_connected(5000)
    tokens = list(range(3 * 16))
    data = blocks(3, 2)
    assert c.store(tokens, data).stored_blocks == 3
    # The SSD is written in the background after the store returns: kill the daemon once the
    # SSD has the blocks (a kill before that loses them there, as in the host tier).
    deadline = time.monotonic() + 30
    while c.stats()["tiers"][1]["puts"] < 3:
        assert time.monotonic() < deadline, "the SSD never got the blocks"
        time.sleep(0.01)
    daemon.kill()
    t0 = time.monotonic()
    with c.lookup(tokens) as hit:
        assert hit.hit_blocks == 0
    assert time.monotonic() - t0 < 3.0
    assert c.client_stats()["missed_lookups"] >= 1
    daemon.start()
    assert c.wait_connected(10000), "the client reconnects in the background"
    out = np.zeros_like(data)
    with c.lookup(tokens) as hit:
        assert hit.hit_blocks == 3  # from the SSD tier the restarted daemon reopened
        assert c.load(hit, out).loaded_blocks == 3
    assert np.array_equal(out, data)


def test_layout_mismatch_is_refused_naming_both(daemon):
    wrong = kvtier.KvLayout(num_layers=3, num_kv_heads=2, head_dim=64, dtype="fp32",
                            block_tokens=16)
    with pytest.raises(kvtier.InvalidArgument) as e:
        kvtier.Client.connect(wrong, socket=daemon.socket)
    assert "3" in str(e.value) and "2" in str(e.value)


def test_an_async_store_stores_through_a_connection_of_its_own(daemon):
    # Calls on one connection take turns: the store queue's thread (SCHED_IDLE by default) has
    # its own, so a lookup never waits behind a store that busy CPUs hold up.
    c = kvtier.Client.connect(LAYOUT, socket=daemon.socket, model_id="m")
    assert c.wait_connected(5000)
    assert c.daemon_stats()["clients"] == 1
    tokens = list(range(4 * 16))
    data = blocks(4, 3)
    keys = kvtier.hash_prefix(c.root(), 16, tokens)
    with kvtier.AsyncStore(c) as saves:
        assert c.daemon_stats()["clients"] == 2
        assert saves.submit([(keys, data, 0, "", "")], None)
        assert saves.wait_idle(30)
        out = np.zeros_like(data)
        with c.lookup(tokens) as hit:
            assert hit.hit_blocks == 4
            # A range of the hit (chunked loads): blocks 2 and 3, then 0 and 1.
            assert c.load(hit, out[2:], first=2).loaded_blocks == 2
            assert c.load(hit, out[:2]).loaded_blocks == 2
            with pytest.raises(ValueError, match="blocks 3..5 asked of a lookup of 4"):
                c.load(hit, out[:2], first=3)
        assert np.array_equal(out, data)
    deadline = time.monotonic() + 10
    while c.daemon_stats()["clients"] != 1:
        assert time.monotonic() < deadline, "the queue's connection outlived it"
        time.sleep(0.01)
