"""kvtier.integrations.sglang: the HiCache storage backend, against fake host pools of CPU
tensors shaped as SGLang's MHA host pool lays them out (SGLang itself needs CUDA)."""

import logging
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import kvtier
from kvtier import backends
from kvtier.integrations.sglang import KvtierHiCacheStorage

L, H, D, P, PAGES = 2, 2, 8, 4, 8  # layers, kv heads, head_dim, page tokens, host pages
T = P * PAGES


def make_pool(layout="page_first", dtype=torch.float32, seed=0):
    dims = {"layer_first": (2, L, T, H, D), "page_first": (2, T, L, H, D),
            "page_first_direct": (2, PAGES, L, P, H, D), "page_head": (2, PAGES, H, P, L, D)}
    g = torch.Generator().manual_seed(seed)
    buf = torch.randn(dims[layout], generator=g).to(dtype)
    return SimpleNamespace(layout=layout, kv_buffer=buf, page_size=P)


def element(pool, page, l, kv, t, h, d):
    """The pool's element for (page, layer, K/V, token, head, dim), written out per layout."""
    b = pool.kv_buffer
    return {"layer_first": lambda: b[kv, l, page * P + t, h, d],
            "page_first": lambda: b[kv, page * P + t, l, h, d],
            "page_first_direct": lambda: b[kv, page, l, t, h, d],
            "page_head": lambda: b[kv, page, h, t, l, d]}[pool.layout]()


def storage_config(model="org/model", tp_rank=0, tp_size=1, **extra):
    cfg = {"backend_name": "kvtier", "module_path": "kvtier.integrations.sglang",
           "class_name": "KvtierHiCacheStorage", "interface_v1": 1, "host_capacity": "8MiB"}
    cfg.update(extra)
    return SimpleNamespace(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1,
                           attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
                           model_name=model, extra_config=cfg)


def backend(pool, **kw):
    b = KvtierHiCacheStorage(storage_config(**kw), {})  # as SGLang's dynamic loader builds it
    b.register_mem_pool_host(pool)
    return b


def host_indices(pages):
    return torch.cat([torch.arange(p * P, (p + 1) * P) for p in pages])


def page_of(pool, page):
    return torch.stack([torch.stack([torch.stack([torch.stack([torch.stack(
        [element(pool, page, l, kv, t, h, d) for d in range(D)]) for h in range(H)])
        for t in range(P)]) for kv in range(2)]) for l in range(L)])


@pytest.fixture(autouse=True)
def fresh_registry():
    backends.close_all()
    yield
    backends.close_all()


@pytest.mark.parametrize("layout", ["layer_first", "page_first", "page_first_direct",
                                    "page_head"])
def test_pages_come_back_identical(layout):
    pool = make_pool(layout, torch.float16 if layout == "page_head" else torch.float32)
    b = backend(pool)
    assert b._pages.layout == kvtier.KvLayout(num_layers=L, num_kv_heads=H, head_dim=D,
                                              dtype=b._pages.layout.dtype, block_tokens=P)
    keys = ["k-a", "k-b", "k-c"]
    pages = [5, 1, 6]
    before = pool.kv_buffer.clone()
    assert b.batch_set_v1(keys, host_indices(pages)) == [True] * 3
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(keys, host_indices(pages)) == [True] * 3
    for p in range(PAGES):
        want = page_of(SimpleNamespace(layout=layout, kv_buffer=before), p) if p in pages \
            else torch.zeros(L, 2, P, H, D, dtype=before.dtype)
        assert torch.equal(page_of(pool, p), want), f"page {p}"
    # Loaded into other pages, in another order: each key's page lands where it is asked.
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(["k-c", "k-a"], host_indices([0, 2])) == [True, True]
    src = SimpleNamespace(layout=layout, kv_buffer=before)
    assert torch.equal(page_of(pool, 0), page_of(src, 6))
    assert torch.equal(page_of(pool, 2), page_of(src, 5))


def test_blocks_are_in_kvtiers_byte_order_whatever_the_pool_layout():
    src = make_pool("layer_first", seed=3)
    writer = backend(src)
    assert writer.batch_set_v1(["p0", "p1"], host_indices([2, 7])) == [True, True]
    # kvtier's block: per layer, K[tokens][heads][dim] then V (doc/layout.md).
    out = np.zeros((1, writer._pages.layout.bytes_per_block), np.uint8)
    with writer._cache.lookup_keys([writer.key_of("p1")]) as hit:
        assert writer._cache.load(hit, out).loaded_blocks == 1
    assert np.array_equal(out.view(np.float32).reshape(L, 2, P, H, D), page_of(src, 7).numpy())
    # So a page_first pool of the same model reads what a layer_first one wrote.
    dst = make_pool("page_first", seed=4)
    reader = backend(dst)
    assert reader.batch_get_v1(["p0", "p1"], host_indices([0, 1])) == [True, True]
    assert torch.equal(page_of(dst, 0), page_of(src, 2))
    assert torch.equal(page_of(dst, 1), page_of(src, 7))


def test_page_keys_name_the_pages_in_kvtiers_events():
    from kvtier.integrations.sglang import _key_bytes

    pool = make_pool()
    keys = ["a1" * 32, "b2" * 32]  # SGLang's keys are sha256 hex digests
    b = backend(pool, events_addr="tcp://127.0.0.1:*", events_int_hashes=False)
    assert b._cache.wants_engine_hashes
    assert b.batch_set_v1(keys, host_indices([0, 3]),
                          SimpleNamespace(prefix_keys=["c3" * 32])) == [True, True]
    assert b._cache.events_info()["engine_hash_blocks"] == 2
    assert _key_bytes(keys[0]) == bytes.fromhex(keys[0])
    assert _key_bytes("not hex") == b"not hex"
    assert len(_key_bytes("x" * 100)) == 32
    # Without a publisher nothing is kept.
    backends.close_all()
    plain = backend(make_pool())
    assert not plain._cache.wants_engine_hashes
    assert plain.batch_set_v1(keys, host_indices([0, 3])) == [True, True]


def test_batch_exists_counts_the_leading_keys_present():
    b = backend(make_pool())
    assert b.batch_exists([]) == 0
    assert b.batch_exists(["a"]) == 0
    assert b.batch_set_v1(["a", "b", "c"], host_indices([0, 1, 2])) == [True] * 3
    assert b.batch_exists(["a", "b", "c"]) == 3
    assert b.batch_exists(["a", "b", "x", "c"]) == 2
    assert b.batch_exists(["x", "a"]) == 0
    assert b.exists("c") and not b.exists("x")
    # A get stops at the first missing page, like SGLang's prefix reads.
    assert b.batch_get_v1(["a", "x", "c"], host_indices([3, 4, 5])) == [True, False, False]


def test_ranks_and_models_never_meet():
    pool = make_pool()
    b = backend(pool, tp_rank=0, tp_size=2)
    assert b.batch_set_v1(["a", "b"], host_indices([0, 1])) == [True, True]
    # One shared in-process cache, three namespaces.
    rank1 = backend(pool, tp_rank=1, tp_size=2)
    assert rank1._cache is b._cache
    assert rank1.batch_exists(["a", "b"]) == 0
    assert backend(pool, tp_rank=0, tp_size=1).batch_exists(["a"]) == 0
    other_model = backend(pool, model="org/other", tp_rank=0, tp_size=2)
    assert other_model.batch_exists(["a"]) == 0
    assert backend(pool, tp_rank=0, tp_size=2).batch_exists(["a", "b"]) == 2
    assert b.key_of("a") != rank1.key_of("a")


def test_wrong_layouts_and_configs_are_refused_with_a_message():
    with pytest.raises(ValueError, match="'page_first_split'"):
        backend(SimpleNamespace(layout="page_first_split", kv_buffer=torch.zeros(2, T, L, H, D),
                                page_size=P))
    mla = SimpleNamespace(layout="layer_first", kv_buffer=torch.zeros(L, T, 1, 72), page_size=P)
    with pytest.raises(ValueError, match=r"'layer_first' has kv_buffer \[2, 32, 1, 72\]"):
        backend(mla)
    with pytest.raises(ValueError, match="float64"):
        backend(make_pool(dtype=torch.float64))
    with pytest.raises(ValueError, match="interface_v1"):
        KvtierHiCacheStorage(storage_config(interface_v1=0))
    cfg = storage_config()
    cfg.is_mla_model = True
    with pytest.raises(ValueError, match="MLA"):
        KvtierHiCacheStorage(cfg)
    with pytest.raises(kvtier.InvalidArgument, match="backend 'redis'"):
        backends.open_cache({"backend": "redis"}, kvtier.KvLayout(1, 1, 8, "fp32", 4))


def test_bad_calls_are_misses_not_exceptions(caplog):
    b = KvtierHiCacheStorage(storage_config())
    assert b.batch_get_v1(["a"], host_indices([0])) == [False]  # no pool registered yet
    assert b.batch_exists(["a"]) == 0
    b.register_mem_pool_host(make_pool())
    assert b.batch_set_v1(["a"], torch.tensor([1, 2, 3, 4])) == [False]  # not a page start
    assert b.batch_get_v1(["a", "b"], host_indices([0])) == [False, False]  # too few indices
    assert b.batch_set(["a"], [torch.zeros(4)]) is False
    assert "not page starts" in caplog.text


def test_a_missing_daemon_is_a_miss_within_the_deadline(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="kvtier.sglang")
    t0 = time.monotonic()
    b = backend(make_pool(), backend="daemon", socket=str(tmp_path / "none.sock"),
                timeout_ms=200, connect_wait_ms=100)
    assert isinstance(b._cache, kvtier.Client)
    for _ in range(2):
        assert b.batch_set_v1(["a", "b"], host_indices([0, 1])) == [False, False]
        assert b.batch_get_v1(["a", "b"], host_indices([0, 1])) == [False, False]
        assert b.batch_exists(["a", "b"]) == 0
    assert time.monotonic() - t0 < 5.0
    assert caplog.text.count("is not reachable") == 1  # logged once


LAYOUT_YAML = f"{{num_layers: {L}, num_kv_heads: {H}, head_dim: {D}, dtype: fp32, " \
              f"block_tokens: {P}}}"


def test_pages_meet_through_the_daemon_and_a_killed_daemon_is_a_miss(tmp_path, caplog):
    from daemon import Daemon

    d = Daemon(tmp_path, LAYOUT_YAML).start()
    try:
        cfg = dict(backend="daemon", socket=d.socket, timeout_ms=500, connect_wait_ms=5000)
        src = make_pool(seed=7)
        writer = backend(src, **cfg)
        assert writer.batch_set_v1(["a", "b"], host_indices([3, 4])) == [True, True]
        backends.close_all()  # the reader gets a client of its own, as another process would
        dst = make_pool(seed=8)
        reader = backend(dst, **cfg)
        assert reader._cache is not writer._cache
        assert reader.batch_exists(["a", "b", "c"]) == 2
        assert reader.batch_get_v1(["a", "b"], host_indices([0, 1])) == [True, True]
        assert torch.equal(page_of(dst, 0), page_of(src, 3))
        assert torch.equal(page_of(dst, 1), page_of(src, 4))
        d.kill()
        t0 = time.monotonic()
        assert reader.batch_get_v1(["a", "b"], host_indices([2, 5])) == [False, False]
        assert reader.batch_exists(["a"]) == 0
        assert time.monotonic() - t0 < 5.0
    finally:
        d.kill()
