"""PagedKv against CPU tensors: the byte order kvtier stores, round trips, refused layouts."""

import pytest

import kvtier

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
from kvtier.integrations.paged import PagedKv, layer_order  # noqa: E402

L, H, D, P, N = 3, 2, 64, 16, 10  # layers, kv heads, head_dim, page tokens, pages


def layout(block_tokens=64):
    return kvtier.KvLayout(num_layers=L, num_kv_heads=H, head_dim=D, dtype="fp32",
                           block_tokens=block_tokens)


def value(layer, kv, page, head, tok, d):
    # A distinct integer per element, exact in fp32.
    return ((((layer * 2 + kv) * N + page) * H + head) * P + tok) * D + d


def fused_layers():
    # The CPU kernel's layout: [N, H, P, 2D] read as [N, H, 2P, D] (K rows, then V rows).
    out = []
    for layer in range(L):
        t = torch.empty(N, H, 2, P, D)
        for kv in range(2):
            for page in range(N):
                for head in range(H):
                    base = value(layer, kv, page, head, 0, 0)
                    t[page, head, kv] = torch.arange(base, base + P * D, dtype=torch.float32
                                                     ).view(P, D)
        out.append(t.view(N, H, P, 2 * D))
    return out


def test_gather_writes_kvtiers_byte_order():
    layers = fused_layers()
    paged = PagedKv(layers, layout(), P)
    assert paged.kind == "fused" and paged.ratio == 4
    pages = [7, 2, 9, 0]  # one kvtier block spans 4 scattered pages
    out = paged.staging(1)
    paged.gather(torch.tensor(pages), out)
    # Block order (doc/layout.md): per layer K[tokens][heads][head_dim], then V.
    for layer in range(L):
        for kv in range(2):
            for tok in (0, 15, 16, 40, 63):
                page, t = pages[tok // P], tok % P
                for head in range(H):
                    assert out[0, layer, kv, tok, head, 5].item() == value(layer, kv, page,
                                                                            head, t, 5)


@pytest.mark.parametrize("kind", ["fused", "split"])
def test_scatter_round_trips_and_skips_pages(kind):
    torch.manual_seed(0)
    if kind == "fused":
        src_layers = [torch.randn(N, H, P, 2 * D) for _ in range(L)]
    else:
        src_layers = [torch.randn(2, N, H, P, D) for _ in range(L)]
    src = PagedKv(src_layers, layout(), P)
    assert src.kind == kind
    blocks = src.staging(2)
    src.gather(torch.tensor([1, 3, 5, 7, 0, 2, 4, 6]), blocks)
    # kvtier's bytes do not depend on the engine's page layout.
    dst_layers = [torch.zeros_like(t) for t in src_layers]
    dst = PagedKv(dst_layers, layout(), P)
    # The first page is the engine's own (skip=1): it must stay untouched.
    dst.scatter(blocks, torch.tensor([3, 5, 7, 0, 2, 4, 6]), skip=1)
    for s, d in zip(src_layers, dst_layers):
        sp, dp = src.pages(s), dst.pages(d)
        for page in (3, 5, 7, 0, 2, 4, 6):
            assert torch.equal(sp[page], dp[page])
        assert not dp[1].any()


def test_fused_and_split_give_the_same_block_bytes():
    torch.manual_seed(1)
    fused = [torch.randn(N, H, P, 2 * D) for _ in range(L)]
    a = PagedKv(fused, layout(), P)
    split = [torch.stack([a.pages(t)[..., 0, :], a.pages(t)[..., 1, :]]).contiguous()
             for t in fused]
    b = PagedKv(split, layout(), P)
    ids = torch.tensor([4, 1, 8, 3])
    x, y = a.staging(1), b.staging(1)
    a.gather(ids, x)
    b.gather(ids, y)
    assert torch.equal(x, y)


def test_unknown_layouts_are_refused_naming_the_shape():
    with pytest.raises(ValueError, match=r"unknown paged KV layout \[10, 2, 2, 16, 64\]"):
        PagedKv([torch.zeros(N, 2, 2, P, D) for _ in range(L)], layout(), P)
    with pytest.raises(ValueError, match="3 layers"):
        PagedKv([torch.zeros(N, H, P, 2 * D)], layout(), P)
    with pytest.raises(ValueError, match="torch.float16"):
        PagedKv([torch.zeros(N, H, P, 2 * D, dtype=torch.float16) for _ in range(L)], layout(),
                P)
    with pytest.raises(ValueError, match="whole number"):
        PagedKv([torch.zeros(N, H, 24, 2 * D) for _ in range(L)], layout(), 24)


def test_layer_order_is_numeric():
    names = ["model.layers.10.self_attn.attn", "model.layers.2.self_attn.attn",
             "model.layers.0.self_attn.attn"]
    assert layer_order(names) == [names[2], names[1], names[0]]


# ---- kvtier.gather_pages / scatter_pages directly: one C++ call for many blocks.


def reference_gather(paged, page_ids, n):
    """The pure-torch gather PagedKv used before gather_pages (per layer index_select)."""
    out = paged.staging(n)
    r, P = paged.ratio, paged.page_tokens
    ids = torch.tensor(page_ids)
    for li, layer in enumerate(paged.layers):
        src = paged.pages(layer).index_select(0, ids)  # [n*r, H, P, 2, D]
        src = src.view(n, r, *src.shape[1:]).permute(0, 4, 1, 3, 2, 5)  # [n, 2, r, P, H, D]
        out[:, li].view(n, 2, r, P, *out.shape[4:]).copy_(src)
    return out


@pytest.mark.parametrize("kind", ["fused", "split"])
def test_gather_pages_matches_the_torch_reference_for_many_blocks(kind):
    torch.manual_seed(2)
    shape = (N, H, P, 2 * D) if kind == "fused" else (2, N, H, P, D)
    layers = [torch.randn(*shape) for _ in range(L)]
    paged = PagedKv(layers, layout(), P)
    ids = [9, 0, 3, 3, 5, 1, 8, 2]  # two blocks; a page may repeat
    want = reference_gather(paged, ids, 2)
    for form in (ids, torch.tensor(ids), torch.tensor(ids, dtype=torch.int32)):
        out = paged.staging(2)
        kvtier.gather_pages(layers, form, out, layout(), P, kind)
        assert torch.equal(out, want)


def test_scatter_pages_round_trips_many_blocks_with_skip():
    torch.manual_seed(3)
    src_layers = [torch.randn(N, H, P, 2 * D) for _ in range(L)]
    blocks = torch.empty(2, L, 2, 64, H, D)
    kvtier.gather_pages(src_layers, [0, 1, 2, 3, 4, 5, 6, 7], blocks, layout(), P)
    dst_layers = [torch.zeros_like(t) for t in src_layers]
    kvtier.scatter_pages(blocks, dst_layers, [2, 3, 4, 5, 6, 7], layout(), P, skip=2)
    for s, d in zip(src_layers, dst_layers):
        assert torch.equal(s[2:8], d[2:8])
        assert not d[:2].any() and not d[8:].any()


def test_gather_pages_refuses_wrong_sizes_with_a_value_error_and_copies_nothing():
    layers = fused_layers()
    lay = layout()
    out = torch.full((1, L, 2, 64, H, D), -1.0)
    cases = [
        (dict(page_ids=[0, 1, 2]), "3 page ids for 1 blocks of 4 pages"),
        (dict(page_ids=[0, 1, 2, N]), "page id 10 .* outside layer 0's 10 pages"),
        (dict(page_ids=[0, 1, -1, 2]), "page id -1"),
        (dict(out=torch.empty(100)), "not a whole number of"),
        (dict(out=torch.empty(2, L, 2, 64, H, D)[:, :, :, ::2]), "not C-contiguous"),
        (dict(layers=layers[:2]), "2 layer arrays for a layout of 3 layers"),
        (dict(layers=[t.half() for t in layers]), "2-byte elements"),
        (dict(layers=[t[:, :, :8] for t in layers]), "not the 'fused' layout"),
        (dict(layers=[t.transpose(0, 1) for t in layers]), "not the 'fused' layout"),
        (dict(kind="paged"), "page layout 'paged'"),
        (dict(page_tokens=24), "not a whole number of 24-token pages"),
        (dict(page_ids="0123"), "page ids"),
    ]
    for change, message in cases:
        args = dict(layers=layers, page_ids=[0, 1, 2, 3], out=out, layout=lay, page_tokens=P,
                    kind="fused")
        args.update(change)
        with pytest.raises(ValueError, match=message):
            kvtier.gather_pages(**args)
        assert (out == -1).all(), f"{message}: out was written"
    # A non-contiguous layer of the right shape.
    strided = [torch.empty(N, H, 2 * D, P).transpose(2, 3) for _ in range(L)]
    with pytest.raises(ValueError, match="not C-contiguous"):
        kvtier.gather_pages(strided, [0, 1, 2, 3], out, lay, P)


def test_scatter_pages_refuses_wrong_sizes_and_writes_nothing():
    layers = [torch.zeros(N, H, P, 2 * D) for _ in range(L)]
    src = torch.ones(1, L, 2, 64, H, D)
    with pytest.raises(ValueError, match="skip 5 > the 4 pages"):
        kvtier.scatter_pages(src, layers, [], layout(), P, skip=5)
    with pytest.raises(ValueError, match="4 page ids for the 3 pages of src after skip 1"):
        kvtier.scatter_pages(src, layers, [0, 1, 2, 3], layout(), P, skip=1)
    with pytest.raises(ValueError, match="page id 12"):
        kvtier.scatter_pages(src, layers, [0, 1, 2, 12], layout(), P)
    with pytest.raises(ValueError, match="not a whole number"):
        kvtier.scatter_pages(torch.ones(7), layers, [0], layout(), P)
    assert not any(t.any() for t in layers)


def test_gather_pages_releases_the_gil():
    import threading

    big = kvtier.KvLayout(num_layers=8, num_kv_heads=8, head_dim=128, dtype="fp32",
                          block_tokens=64)
    layers = [torch.randn(64, 8, 16, 256) for _ in range(8)]
    out = torch.empty(16, 8, 2, 64, 8, 128)  # 16 blocks = 64 pages, 64 MiB
    ids = list(range(64))
    inside = 0
    running = threading.Event()
    finished = threading.Event()

    def gather():
        running.set()
        for _ in range(5):
            kvtier.gather_pages(layers, ids, out, big, 16)
        finished.set()

    t = threading.Thread(target=gather)
    t.start()
    running.wait()
    while not finished.is_set():
        inside += 1
    t.join()
    assert inside > 1000, f"only {inside} main-thread iterations during the gathers"


def test_grouped_layout_puts_each_group_at_its_offset_and_keeps_a_windows_last_pages():
    # A sliding-window group (window 16 in 16-token pages: one page of a 64-token block kept)
    # beside a full group: each group's bytes equal what the ungrouped layout of its shape
    # gathers, at the group's offset; scatter's -1 pages stay untouched.
    sw = kvtier.KvLayoutGroup("sliding_window", L, H, D, "fp32", window=16, page_tokens=P)
    full = kvtier.KvLayoutGroup("full", L, H, D, "fp32")
    lay = kvtier.KvLayout.from_groups([sw, full], 64)
    assert lay.grouped and sw.stored_tokens(64) == P
    assert lay.bytes_per_block == L * 2 * H * D * 4 * (P + 64)
    assert lay.full_bytes_per_block == 2 * L * 2 * H * D * 4 * 64
    layers = fused_layers()
    sw_part = PagedKv(layers, lay, P, group=0)
    full_part = PagedKv(layers, lay, P, group=1)
    assert (sw_part.keep, full_part.keep) == (1, 4)
    out = torch.zeros((2, lay.bytes_per_block), dtype=torch.uint8)
    sw_part.gather([3, 7], out)
    full_part.gather([0, 1, 2, 3, 4, 5, 6, 7], out)
    want_full = torch.zeros((2, layout().bytes_per_block), dtype=torch.uint8)
    PagedKv(layers, layout(), P).gather([0, 1, 2, 3, 4, 5, 6, 7], want_full)
    want_sw = torch.zeros((2, layout(P).bytes_per_block), dtype=torch.uint8)
    PagedKv(layers, layout(P), P).gather([3, 7], want_sw)
    off = lay.group_offset(1)
    assert off == want_sw.shape[1]
    assert torch.equal(out[:, :off], want_sw) and torch.equal(out[:, off:], want_full)
    back = [torch.zeros_like(t) for t in layers]
    PagedKv(back, lay, P, group=0).scatter(out, [-1, 9])
    for t, src in zip(back, layers):
        assert torch.equal(t[9], src[7]) and not t[3].any() and not t[:9].any()


def test_latent_pages_round_trip_one_latent_per_token():
    mla = kvtier.KvLayout(num_layers=L, num_kv_heads=1, head_dim=D, dtype="fp32",
                          block_tokens=32, attention="mla")
    layers = [torch.arange(N * P * D, dtype=torch.float32).view(N, 1, P, D) + 1e5 * i
              for i in range(L)]
    paged = PagedKv(layers, mla, P)
    assert paged.kind == "latent" and mla.bytes_per_block == L * 32 * D * 4
    out = torch.zeros((1, L, 32, D))
    paged.gather([4, 2], out)
    for i in range(L):
        assert torch.equal(out[0, i], torch.cat([layers[i][4, 0], layers[i][2, 0]]))
    back = [torch.zeros_like(t) for t in layers]
    PagedKv(back, mla, P).scatter(out, [5, 6])
    for t, src in zip(back, layers):
        assert torch.equal(t[5], src[4]) and torch.equal(t[6], src[2])
    with pytest.raises(ValueError, match="'fused' holds K and V"):
        kvtier.gather_pages(layers, [4, 2], out, mla, P, "fused")


@pytest.mark.parametrize("door", ["inprocess", "daemon"])
def test_load_pages_writes_what_scatter_would_through_either_door(door, tmp_path):
    # In process the host tier lends its blocks (one copy, into the pages), and a daemon's
    # client its shared arena's. The pages must come out the same either way.
    torch.manual_seed(4)
    src_layers = [torch.randn(N, H, P, 2 * D) for _ in range(L)]
    blocks = torch.empty(2, L, 2, 64, H, D)
    kvtier.gather_pages(src_layers, list(range(8)), blocks, layout(), P)
    daemon = None
    if door == "inprocess":
        cache = kvtier.open_cache(layout(), [kvtier.host_tier("4MiB")], model_id="m")
    else:
        from daemon import Daemon

        daemon = Daemon(tmp_path, f"{{num_layers: {L}, num_kv_heads: {H}, head_dim: {D}, "
                                  "dtype: fp32, block_tokens: 64}").start()
        cache = kvtier.Client.connect(layout(), socket=daemon.socket, model_id="m")
        assert cache.wait_connected(5000)
    try:
        tokens = list(range(2 * 64 + 1))
        assert cache.store(tokens, blocks.numpy()).stored_blocks == 2
        ids = [9, 8, -1, 6, 5, 4, 3, 2]  # -1: the engine's own page, left as it is
        want = [torch.zeros_like(t) for t in src_layers]
        kvtier.scatter_pages(blocks, want, ids, layout(), P)
        got = [torch.zeros_like(t) for t in src_layers]
        scratch = torch.empty(1, layout().bytes_per_block, dtype=torch.uint8)
        with cache.lookup(tokens) as hit:
            assert hit.hit_blocks == 2
            r = kvtier.load_pages(cache, hit, 0, 2, [(got, ids, P, "fused", -1)], scratch)
            assert r.loaded_blocks == 2
            with pytest.raises(ValueError, match="page ids for 2 blocks"):
                kvtier.load_pages(cache, hit, 0, 2, [(got, ids[:4], P, "fused", -1)], scratch)
            with pytest.raises(ValueError, match="no scratch block"):
                kvtier.load_pages(cache, hit, 0, 2, [(got, ids, P, "fused", -1)],
                                  scratch[:0])
        for w, g in zip(want, got):
            assert torch.equal(w, g)
        assert not got[0][7].any()  # the skipped page
    finally:
        if daemon is not None:
            daemon.kill()


# ---- The torch copies: vLLM's CUDA layouts, and any tensor on a device. Checked on the CPU
# against the C++ kernels (forced with torch_copies), byte for byte.


def cuda_layouts(split_layers):
    """The same pages as vLLM on CUDA keeps them: FlashAttention's [2, N, P, H, D] and
    FlashInfer's [N, 2, P, H, D]."""
    flash = [t.permute(0, 1, 3, 2, 4).contiguous() for t in split_layers]
    return {"flash": flash, "flashinfer": [t.transpose(0, 1).contiguous() for t in flash]}


@pytest.mark.parametrize("kind", ["fused", "split", "latent"])
def test_torch_copies_write_what_the_kernels_write(kind):
    torch.manual_seed(5)
    lay = layout()
    if kind == "latent":
        lay = kvtier.KvLayout(num_layers=L, num_kv_heads=1, head_dim=D, dtype="fp32",
                              block_tokens=64, attention="mla")
        layers = [torch.randn(N, 1, P, D) for _ in range(L)]
    else:
        layers = [torch.randn(*((N, H, P, 2 * D) if kind == "fused" else (2, N, H, P, D)))
                  for _ in range(L)]
    kernels, by_torch = PagedKv(layers, lay, P), PagedKv(layers, lay, P)
    assert kernels.kind == kind and not kernels.torch_copies
    by_torch.torch_copies = True
    ids = [9, 0, 3, 3, 5, 1, 8, 2]  # two blocks; a page may repeat
    want, got = (torch.full((2, lay.bytes_per_block), 7, dtype=torch.uint8) for _ in range(2))
    kernels.gather(ids, want)
    by_torch.gather(ids, got)
    assert torch.equal(got, want)
    dst = {name: [torch.zeros_like(t) for t in layers] for name in ("kernels", "torch")}
    PagedKv(dst["kernels"], lay, P).scatter(want, [5, -1, 7, 0, 2, 9, 6], skip=1)
    back = PagedKv(dst["torch"], lay, P)
    back.torch_copies = True
    back.scatter(want, [5, -1, 7, 0, 2, 9, 6], skip=1)
    for a, b in zip(dst["kernels"], dst["torch"]):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="outside -1..9"):
        by_torch.gather([9, 0, 3, 10, 5, 1, 8, 2], got)
    with pytest.raises(ValueError, match="for 2 blocks"):
        by_torch.scatter(want, list(range(9)))


def test_torch_copies_put_a_group_at_its_offset():
    sw = kvtier.KvLayoutGroup("sliding_window", L, H, D, "fp32", window=16, page_tokens=P)
    full = kvtier.KvLayoutGroup("full", L, H, D, "fp32")
    lay = kvtier.KvLayout.from_groups([sw, full], 64)
    layers = fused_layers()
    out = {}
    for forced in (False, True):
        parts = [PagedKv(layers, lay, P, group=0), PagedKv(layers, lay, P, group=1)]
        for p in parts:
            p.torch_copies = forced
        o = torch.zeros((2, lay.bytes_per_block), dtype=torch.uint8)
        parts[0].gather([3, 7], o)
        parts[1].gather([0, 1, 2, 3, 4, 5, 6, 7], o)
        out[forced] = o
    assert torch.equal(out[True], out[False])


@pytest.mark.parametrize("kind", ["flash", "flashinfer"])
def test_cuda_layouts_are_read_and_written_as_vllm_keeps_them(kind):
    torch.manual_seed(6)
    split = [torch.randn(2, N, H, P, D) for _ in range(L)]
    layers = cuda_layouts(split)[kind]
    paged = PagedKv(layers, layout(), P)
    assert paged.kind == kind and paged.torch_copies
    ids = [9, 0, 3, 3, 5, 1, 8, 2]
    want, got = paged.staging(2), paged.staging(2)
    PagedKv(split, layout(), P).gather(ids, want)
    paged.gather(ids, got)
    assert torch.equal(got, want)
    back = [torch.zeros_like(t) for t in layers]
    PagedKv(back, layout(), P).scatter(want, [3, 5, 7, 0, 2, 4, 6], skip=1)
    for b, t in zip(back, cuda_layouts([s for s in split])[kind]):
        bp, tp = paged.pages(b), paged.pages(t)
        for dst, src in zip((3, 5, 7, 0, 2, 4, 6), (0, 3, 3, 5, 1, 8, 2)):
            assert torch.equal(bp[dst], tp[src])
        assert not bp[1].any()


def test_grouped_load_writes_device_layouts_through_scratch():
    from kvtier.integrations.paged import GroupedPaged

    torch.manual_seed(7)
    split = [torch.randn(2, N, H, P, D) for _ in range(L)]
    blocks = torch.empty(2, L, 2, 64, H, D)
    PagedKv(split, layout(), P).gather(list(range(8)), blocks)
    cache = kvtier.open_cache(layout(), [kvtier.host_tier("4MiB")], model_id="m")
    tokens = list(range(2 * 64 + 1))
    assert cache.store(tokens, blocks.numpy()).stored_blocks == 2
    got = [torch.zeros_like(t) for t in cuda_layouts(split)["flash"]]
    grouped = GroupedPaged([PagedKv(got, layout(), P)])
    ids = [9, 8, -1, 6, 5, 4, 3, 2]  # -1: the engine's own page, left as it is
    with cache.lookup(tokens) as hit:
        assert grouped.load(cache, hit, 2, [ids], grouped.staging(1)) == 2
    want = [torch.zeros_like(t) for t in cuda_layouts(split)["flash"]]
    PagedKv(want, layout(), P).scatter(blocks, ids)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    assert not grouped.parts[0].pages(got[0])[7].any()
