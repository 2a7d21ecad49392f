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
