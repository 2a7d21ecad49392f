"""The Python binding: round trips, zero copy, errors as exceptions, the GIL released."""

import threading
import time

import numpy as np
import pytest

import kvtier

try:
    import torch
except ImportError:  # the package's own tests need only numpy
    torch = None


def small_layout(block_tokens=16):
    return kvtier.KvLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="fp32",
                           block_tokens=block_tokens)


@pytest.fixture
def cache(tmp_path):
    layout = small_layout()
    return kvtier.open_cache(layout, [kvtier.host_tier("4MiB"),
                                      kvtier.disk_tier(tmp_path / "disk", "16MiB")],
                             model_id="test-model", model_revision="rev-1")


def blocks_for(layout, n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 255, size=(n, layout.bytes_per_block), dtype=np.uint8)


def test_layout_fields_and_presets():
    layout = small_layout()
    assert layout.bytes_per_block == 2 * 2 * 2 * 64 * 4 * 16
    assert layout.dtype == "fp32" and layout.attention == "mha"
    assert "llama-3.1-8b" in kvtier.layout_preset_names()
    preset = kvtier.layout_preset("llama-3.1-8b", block_tokens=64)
    assert preset.num_layers == 32 and preset.block_tokens == 64
    with pytest.raises(kvtier.NotFound, match="no-such-model"):
        kvtier.layout_preset("no-such-model")


def test_store_lookup_load_round_trip_numpy(cache):
    layout = cache.layout
    tokens = list(range(3 * 16 + 5))  # three full blocks and a partial one
    blocks = blocks_for(layout, 3, seed=1)
    r = cache.store(tokens, blocks)
    assert (r.stored_blocks, r.failed_blocks) == (3, 0)
    with cache.lookup(tokens) as hit:
        assert hit.hit_blocks == 3 and hit.hit_tokens == 48 and hit.pinned
        out = np.zeros_like(blocks)
        lr = cache.load(hit, out)
        assert lr.loaded_blocks == 3 and lr.block_errors == [None, None, None]
    assert not hit.pinned
    np.testing.assert_array_equal(out, blocks)
    s = cache.stats()
    assert s["stored_blocks"] == 3 and s["hit_blocks"] == 3
    assert [t["kind"] for t in s["tiers"]] == ["host", "disk"]


def test_load_a_range_of_the_hit_in_chunks(cache):
    # load(hit, dst, first=i): blocks i.. of one lookup, so a long hit can go through one small
    # buffer; the range is checked against the hit.
    layout = cache.layout
    tokens = list(range(5 * 16))
    blocks = blocks_for(layout, 5, seed=4)
    cache.store(tokens, blocks)
    got = []
    buf = np.zeros((2, layout.bytes_per_block), np.uint8)
    with cache.lookup(tokens) as hit:
        for first in range(0, 5, 2):
            k = min(2, 5 - first)
            assert cache.load(hit, buf[:k], first=first).loaded_blocks == k
            got.append(buf[:k].copy())
        with pytest.raises(ValueError, match="blocks 4..6 asked of a lookup of 5"):
            cache.load(hit, buf, first=4)
    np.testing.assert_array_equal(np.concatenate(got), blocks)


@pytest.mark.skipif(torch is None, reason="torch is not installed (scripts/python-env --vllm)")
def test_load_writes_into_the_callers_torch_tensor(cache):
    layout = cache.layout
    tokens = list(range(32))
    src = torch.arange(2 * layout.bytes_per_block // 4, dtype=torch.float32).reshape(2, -1)
    cache.store(tokens, src)
    dst = torch.zeros_like(src)
    ptr = dst.data_ptr()
    with cache.lookup(tokens) as hit:
        assert cache.load(hit, dst).loaded_blocks == 2
    assert dst.data_ptr() == ptr  # the same memory: written in place, no copy came back
    assert torch.equal(dst, src)
    # A list of per-block views of one tensor works too (vLLM-style scattered blocks).
    dst2 = torch.zeros(4, src.shape[1])
    with cache.lookup(tokens) as hit:
        cache.load(hit, [dst2[3], dst2[1]])
    assert torch.equal(dst2[3], src[0]) and torch.equal(dst2[1], src[1])


def test_keys_are_chained_and_namespaced(cache):
    tokens = list(range(40))
    root = cache.root()
    keys = kvtier.hash_prefix(root, 16, tokens)
    assert len(keys) == 2  # the partial third block has no key
    assert keys == kvtier.hash_prefix(root, 16, tokens[:32])
    assert cache.root(tenant="other") != root and cache.root(lora_id="adapter") != root
    other_rev = kvtier.Namespace("test-model", "rev-2", cache.layout.fingerprint).root()
    same_rev = kvtier.Namespace("test-model", "rev-1", cache.layout.fingerprint).root()
    assert same_rev == root and other_rev != root
    # Keys the caller hashed store and look up like tokens do.
    blocks = blocks_for(cache.layout, 2, seed=3)
    cache.store_keys(keys, blocks)
    with cache.lookup(tokens) as hit:
        assert hit.hit_blocks == 2 and list(hit.keys) == keys
    with cache.lookup(tokens, tenant="other") as hit:
        assert hit.hit_blocks == 0


def test_wrong_size_buffer_is_a_value_error(cache):
    tokens = list(range(32))
    layout = cache.layout
    with pytest.raises(ValueError, match="not a whole number"):
        cache.store(tokens, np.zeros(layout.bytes_per_block + 1, np.uint8))
    with pytest.raises(ValueError, match=r"blocks\[1\]: 8 bytes"):
        cache.store(tokens, [np.zeros(layout.bytes_per_block, np.uint8), np.zeros(8, np.uint8)])
    with pytest.raises(kvtier.InvalidArgument, match="make only 2 full blocks"):
        cache.store(tokens, np.zeros((3, layout.bytes_per_block), np.uint8))
    cache.store(tokens, blocks_for(layout, 2, seed=4))
    with cache.lookup(tokens) as hit:
        with pytest.raises(ValueError):
            cache.load(hit, np.zeros((3, layout.bytes_per_block), np.uint8))
        with pytest.raises(ValueError, match="not C-contiguous"):
            cache.load(hit, np.zeros((layout.bytes_per_block, 2), np.uint8)[:, 0])
        with pytest.raises(ValueError):
            cache.load(hit, "not a buffer")


def test_errors_carry_kvtiers_message_and_code():
    layout = small_layout()
    with pytest.raises(kvtier.InvalidArgument) as e:
        kvtier.open_cache(layout, [kvtier.TierSpec("host", 0)])
    assert "capacity" in str(e.value) and e.value.code == "InvalidArgument"
    assert isinstance(e.value, kvtier.KvtierError) and isinstance(e.value, ValueError)
    with pytest.raises(kvtier.InvalidArgument, match="no-such-kind"):
        kvtier.open_cache(layout, [kvtier.TierSpec("no-such-kind", 1 << 20)])
    with pytest.raises(kvtier.InvalidArgument, match=r"kvtier.yaml"):
        kvtier.CacheOptions.from_yaml("tiers: [{kind: host, capacity: 8XB}]", "kvtier.yaml")


def test_corrupted_disk_block_is_refused(tmp_path):
    layout = small_layout()
    disk = tmp_path / "disk"
    tokens = list(range(32))
    blocks = blocks_for(layout, 2, seed=5)
    c = kvtier.open_cache(layout, [kvtier.disk_tier(disk, "16MiB")], model_id="m")
    c.store(tokens, blocks)
    del c  # closes the tier; the files stay
    seg = sorted(disk.glob("seg-*.kvs"))[0]
    raw = bytearray(seg.read_bytes())
    # Second record's payload: header page, record 1 (header + payload), record 2's header.
    off = 4096 + (4096 + layout.bytes_per_block) + 4096 + 10
    raw[off] ^= 0xFF
    seg.write_bytes(bytes(raw))
    c = kvtier.open_cache(layout, [kvtier.disk_tier(disk, "16MiB")], model_id="m")
    with c.lookup(tokens) as hit:
        assert hit.hit_blocks == 2
        out = np.zeros_like(blocks)
        r = c.load(hit, out)
    assert r.loaded_blocks == 1 and r.block_errors[0] is None and r.block_errors[1]
    np.testing.assert_array_equal(out[0], blocks[0])


def test_the_gil_is_released_during_transfers(tmp_path):
    # Big blocks so one store takes a while; the main thread must run Python code meanwhile.
    layout = kvtier.KvLayout(num_layers=8, num_kv_heads=8, head_dim=128, dtype="fp32",
                             block_tokens=64)
    cache = kvtier.open_cache(layout, [kvtier.host_tier("1GiB")], model_id="m")
    n = 48
    tokens = list(range(n * 64))
    blocks = np.ones((n, layout.bytes_per_block), np.uint8)
    window = {}

    def store():
        window["t0"] = time.perf_counter_ns()
        cache.store(tokens, blocks)
        window["t1"] = time.perf_counter_ns()

    t = threading.Thread(target=store)
    stamps = []
    t.start()
    while t.is_alive():
        stamps.append(time.perf_counter_ns())
    t.join()
    inside = sum(window["t0"] < s < window["t1"] for s in stamps)
    # Holding the GIL for the whole call would leave a handful at most (switch points around
    # the call); released, the main thread spins throughout.
    assert inside > 1000, f"only {inside} main-thread iterations during the store"
