"""kvtier's KV events decoded with vLLM's own msgspec classes (vllm.distributed.kv_events), as a
router built on vLLM's format decodes them: a real `kvtier serve` publishing, stores through
kvtier.Client, the live stream and the replay socket, and a restart that announces the SSD.
Needs a kvtier package of this tree (PYTHONPATH, or pip install .) and KVTIER_BIN; skips when the
installed package speaks another protocol than the daemon."""

import re
import time

import numpy as np
import pytest

kv_events = pytest.importorskip("vllm.distributed.kv_events",
                                reason="vLLM is not installed: its msgspec classes are the check")
msgspec = pytest.importorskip("msgspec")
zmq = pytest.importorskip("zmq")

import kvtier  # noqa: E402
from daemon import Daemon  # noqa: E402
from kv_replay import decode, replay  # noqa: E402

LAYOUT = kvtier.KvLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="fp32",
                         block_tokens=16)
LAYOUT_YAML = "{num_layers: 2, num_kv_heads: 2, head_dim: 64, dtype: fp32, block_tokens: 16}"
EVENTS_YAML = ("serve:\n"
               "  events_addr: tcp://127.0.0.1:*\n"
               "  events_replay_addr: tcp://127.0.0.1:*\n"
               "  events_topic: 'kv@{host}:{port}@{model}'\n"
               "  events_topic_host: 10.0.0.7\n"
               "  events_topic_port: '8000'\n")


def start(d: Daemon) -> tuple[str, str]:
    """Starts d; its PUB and replay endpoints, from the log."""
    d.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        log = d.log()
        pub = re.findall(r"KV events on (\S+)", log)
        rep = re.findall(r"KV event replay on (\S+)", log)
        if pub and rep:
            return pub[-1], rep[-1]
        time.sleep(0.05)
    raise AssertionError(f"no events endpoint in the log:\n{d.log()}")


def client(d: Daemon):
    """A client of d; skips when the installed kvtier package speaks another protocol than this
    tree's daemon (the daemon refuses its store: the package is older or newer than the tree)."""
    c = kvtier.Client.connect(LAYOUT, socket=d.socket, model_id="default")
    probe = np.zeros((1, LAYOUT.bytes_per_block), np.uint8)
    if not c.wait_connected(5000) or c.store(list(range(2 * 10**6, 2 * 10**6 + 16)),
                                             probe).stored_blocks != 1:
        pytest.skip(f"the kvtier package at {kvtier.__file__} cannot store through this tree's "
                    f"daemon (another protocol version); install this tree's package")
    return c


def stored(batches, medium: str) -> set[bytes]:
    out = set()
    for _, _, b in batches:
        for e in b.events:
            if isinstance(e, kv_events.BlockStored) and e.medium == medium:
                out.update(e.block_hashes)
    return out


def test_vllm_classes_decode_the_live_stream_replay_and_restart(tmp_path):
    d = Daemon(tmp_path, LAYOUT_YAML, disk_dir=str(tmp_path / "ssd"))
    with open(d.config, "a") as f:
        f.write(EVENTS_YAML)
    pub, rep = start(d)
    try:
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVTIMEO, 100)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(pub)
        c = client(d)
        data = np.zeros((5, LAYOUT.bytes_per_block), np.uint8)
        live = []
        for probe in range(100):  # a subscription lands a little after connect
            c.store(list(range(10**6 + 1000 * probe, 10**6 + 1000 * probe + 16)), data[:1])
            try:
                live.append(sub.recv_multipart())
                break
            except zmq.Again:
                pass
        assert live, "nothing reached the subscriber"
        assert c.store(list(range(5 * 16)), data).stored_blocks == 5
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                live.append(sub.recv_multipart())
            except zmq.Again:
                if len(stored([(0, 0, decode(p)) for _, _, p in live], "STORAGE")) >= 6:
                    break
        seqs: dict[str, list[int]] = {}
        for topic, seq, payload in live:
            assert topic.decode().startswith("kv@10.0.0.7:8000@default")
            seqs.setdefault(topic.decode(), []).append(int.from_bytes(seq, "big"))
            batch = decode(payload)  # vLLM's own class: a wrong field fails here
            assert batch.data_parallel_rank == 0
            for e in batch.events:
                assert isinstance(e, (kv_events.BlockStored, kv_events.BlockRemoved,
                                      kv_events.AllBlocksCleared))
                if isinstance(e, kv_events.BlockStored):
                    assert e.block_size == 16 and e.parent_block_hash is None
                    assert all(isinstance(h, bytes) and len(h) == 16 for h in e.block_hashes)
        for topic, s in seqs.items():
            assert s == list(range(s[0], s[0] + len(s))), f"a gap on {topic}: {s}"
        all_batches = replay(rep)
        assert all_batches[0][1] == 0
        keys_topic = "kv@10.0.0.7:8000@default@kvtier-keys"
        first = [b for t, _, b in all_batches if t == keys_topic][0]
        assert isinstance(first.events[0], kv_events.AllBlocksCleared)
        cpu, ssd = stored(all_batches, "CPU"), stored(all_batches, "STORAGE")
        assert len(cpu) >= 6 and len(ssd) >= 6
        assert d.stop() == 0

        # A restart: AllBlocksCleared, then every block the SSD recovered.
        pub, rep = start(d)
        deadline = time.monotonic() + 5
        while True:
            again = replay(rep)
            if stored(again, "STORAGE") >= ssd or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        keys = [b for t, _, b in again if t == keys_topic]
        assert isinstance(keys[0].events[0], kv_events.AllBlocksCleared)
        assert stored(again, "STORAGE") >= ssd
    finally:
        d.kill()


def engine_hashes(tokens: list[int], blocks: int, tag: bytes) -> list:
    """Two engine blocks of 8 tokens per kvtier block of 16, 32-byte hashes as vLLM's."""
    out, parent = [], b""
    for b in range(blocks):
        hs = [tag * 24 + (2 * b + j + 1).to_bytes(8, "big") for j in range(2)]
        out.append(kvtier.EngineBlockHashes(hs, parent_hash=parent,
                                            token_ids=tokens[16 * b:16 * (b + 1)]))
        parent = hs[-1]
    return out


def engine_stored(batches, topic: str) -> list:
    return [e for t, _, b in batches if t == topic for e in b.events
            if isinstance(e, kv_events.BlockStored)]


def check_engine_events(events, hashes, medium: str) -> None:
    """The stores name each block by vLLM's own int form of the engine's hashes."""
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
    want = {maybe_convert_block_hash(h) for e in hashes for h in e.hashes}
    got = {h for e in events if e.medium == medium for h in e.block_hashes}
    assert got == want
    for e in events:
        assert e.block_size == 8 and len(e.token_ids) == 16
        assert all(isinstance(h, int) for h in e.block_hashes)
    parents = {e.parent_block_hash for e in events if e.medium == medium}
    assert parents == {None} | {maybe_convert_block_hash(h.hashes[-1]) for h in hashes[:-1]}


def test_in_process_cache_announces_the_engines_hashes(tmp_path):
    events = kvtier.EventsOptions()
    events.endpoint = "tcp://127.0.0.1:*"
    events.replay_endpoint = "tcp://127.0.0.1:*"
    cache = kvtier.open_cache(LAYOUT, [kvtier.host_tier("1MiB")], events=events)
    assert cache.wants_engine_hashes
    tokens = list(range(100, 100 + 4 * 16))
    hashes = engine_hashes(tokens, 4, b"\x07")
    data = np.ones((4, LAYOUT.bytes_per_block), np.uint8)
    with pytest.raises(kvtier.InvalidArgument):
        cache.store(tokens, data, engine_hashes=hashes[:3])
    assert cache.store(tokens, data, engine_hashes=hashes).stored_blocks == 4
    info = cache.events_info()
    assert info["engine_hash_blocks"] == 4
    deadline = time.monotonic() + 5
    while True:
        got = engine_stored(replay(info["replay_endpoint"]), info["topic"])
        if len(got) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    check_engine_events(got, hashes, "CPU")


def test_daemon_announces_the_engines_hashes_a_client_stores(tmp_path):
    d = Daemon(tmp_path, LAYOUT_YAML)
    with open(d.config, "a") as f:
        f.write(EVENTS_YAML)
    _, rep = start(d)
    try:
        c = client(d)
        assert c.wants_engine_hashes
        tokens = list(range(300, 300 + 3 * 16))
        hashes = engine_hashes(tokens, 3, b"\x09")
        data = np.ones((3, LAYOUT.bytes_per_block), np.uint8)
        assert c.store(tokens, data, engine_hashes=hashes).stored_blocks == 3
        deadline = time.monotonic() + 5
        while True:
            got = engine_stored(replay(rep), "kv@10.0.0.7:8000@default")
            if len(got) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        check_engine_events(got, hashes, "CPU")
    finally:
        d.kill()
