"""vLLM's KV-cache groups as kvtier layouts and the pages each kvtier block keeps
(kvtier.integrations.vllm_groups), on stand-ins for vLLM's specs: no vLLM needed."""

from types import SimpleNamespace

import pytest

import kvtier

torch = pytest.importorskip("torch", reason="torch is not installed in this environment")
from kvtier.integrations.vllm_groups import (  # noqa: E402
    layout_from, load_pages, save_pages)
from kvtier import state_keys  # noqa: E402


def spec(cls, **kw):
    fields = dict(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.float32,
                  sliding_window=None)
    fields.update(kw)
    return type(cls, (SimpleNamespace,), {})(**fields)  # read by its class name, as vLLM's


def config(*groups):
    return SimpleNamespace(kv_cache_groups=[
        SimpleNamespace(kv_cache_spec=s, layer_names=[f"model.layers.{i}.attn" for i in layers])
        for s, layers in groups])


def test_dense_and_mla_keep_the_ungrouped_layouts():
    dense, groups = layout_from(config((spec("FullAttentionSpec"), range(4))), 128)
    assert not dense.grouped and dense == kvtier.KvLayout(4, 2, 64, "fp32", 128)
    assert (groups[0].per_block, groups[0].keep) == (4, 4)
    mla, _ = layout_from(config((spec("MLAAttentionSpec", num_kv_heads=1, head_size=576,
                                      dtype=torch.bfloat16), range(3))), 128)
    assert mla == kvtier.KvLayout(3, 1, 576, "bf16", 128, "mla")


def test_sliding_and_full_make_a_grouped_layout_keeping_the_windows_last_page():
    lay, groups = layout_from(config((spec("SlidingWindowSpec", sliding_window=32), [0, 2]),
                                     (spec("FullAttentionSpec"), [1, 3])), 128)
    assert lay.grouped and [g.kind for g in lay.groups] == ["sliding_window", "full"]
    assert [(g.per_block, g.keep) for g in groups] == [(4, 1), (4, 4)]
    assert lay.bytes_per_block * 8 == lay.full_bytes_per_block * 5  # 1/4 + 1 of 2 groups
    # A 100-token window needs the last 99 tokens before a boundary: 4 pages, the whole block.
    wide, groups = layout_from(config((spec("SlidingWindowSpec", sliding_window=100), [0])), 128)
    assert groups[0].keep == 4 and wide.bytes_per_block == wide.full_bytes_per_block


def mamba(mode="align", block_size=64):
    # Qwen3-Next's gated delta net: a bf16 conv state and an fp32 recurrent state per layer.
    return spec("MambaSpec", block_size=block_size, mamba_cache_mode=mode,
                shapes=((3, 192), (1, 64, 64)), dtypes=(torch.bfloat16, torch.float32))


def test_groups_kvtier_cannot_store_are_refused_naming_them():
    with pytest.raises(ValueError, match="group 1 is Mamba .* mamba_cache_mode 'none'"):
        layout_from(config((spec("FullAttentionSpec"), [0]), (mamba("none"), [1])), 128)
    with pytest.raises(ValueError, match="group 1 is ChunkedLocalAttentionSpec"):
        layout_from(config((spec("FullAttentionSpec"), [0]),
                           (spec("ChunkedLocalAttentionSpec"), [1])), 128)
    with pytest.raises(ValueError, match="not a multiple of group 0's block size 48"):
        layout_from(config((spec("FullAttentionSpec", block_size=48), [0])), 128)
    with pytest.raises(ValueError, match="fp32, fp16 and bf16"):
        layout_from(config((spec("FullAttentionSpec", dtype=torch.int8), [0])), 128)


def test_saves_take_each_groups_kept_pages_and_stop_where_vllm_freed_one():
    _, groups = layout_from(config((spec("SlidingWindowSpec", sliding_window=32), [0]),
                                   (spec("FullAttentionSpec"), [1])), 128)
    sliding = [0, 0, 0, 11, 0, 0, 0, 0, 13, 14, 15, 16]  # block 1's window page freed
    full = list(range(21, 33))
    end, pages, resumable = save_pages(groups, (sliding, full), 0, 3)
    assert end == 1 and pages == [[11], [21, 22, 23, 24]] and resumable == []
    sliding[7] = 12
    end, pages, _ = save_pages(groups, (sliding, full), 1, 3)
    assert end == 3 and pages == [[12, 16], list(range(25, 33))]


def test_loads_write_from_vllms_own_hit_and_skip_null_pages():
    _, groups = layout_from(config((spec("SlidingWindowSpec", sliding_window=32), [0]),
                                   (spec("FullAttentionSpec"), [1])), 128)
    sliding = [0, 0, 0, 0, 0, 0, 0, 7]  # vLLM holds only the window before token 256
    full = list(range(1, 9))
    pages, whole = load_pages(groups, (sliding, full), 0, 2, from_token=64)
    assert whole == 2
    assert pages == [[-1, 7], [-1, -1, 3, 4, 5, 6, 7, 8]]
    # A page vLLM holds that kvtier does not keep (block 1's third page): blocks end before it.
    sliding[6] = 9
    _, whole = load_pages(groups, (sliding, full), 0, 2, from_token=0)
    assert whole == 1


def test_groups_with_different_page_sizes_keep_and_load_their_own_pages():
    # vLLM raises the scheduler's block to the groups' LCM: here a 16-token window group beside
    # a 64-token full-attention group, under 128-token kvtier blocks.
    lay, groups = layout_from(config((spec("SlidingWindowSpec", sliding_window=32, block_size=16),
                                      [0]),
                                     (spec("FullAttentionSpec", block_size=64), [1])), 128)
    assert [(g.page_tokens, g.per_block, g.keep) for g in groups] == [(16, 8, 2), (64, 2, 2)]
    assert lay.bytes_per_block * 8 == lay.full_bytes_per_block * 5  # 32 + 128 of 2 x 128 tokens
    sliding = [0] * 6 + [5, 6] + [0] * 6 + [7, 8]
    full = [1, 2, 3, 4]
    assert save_pages(groups, (sliding, full), 0, 2) == (2, [[5, 6, 7, 8], [1, 2, 3, 4]], [])
    pages, whole = load_pages(groups, (sliding, full), 0, 2, from_token=64)
    assert whole == 2 and pages == [[5, 6, 7, 8], [-1, 2, 3, 4]]


def test_state_groups_store_the_state_where_vllm_kept_one_and_load_it_only_at_the_end():
    lay, groups = layout_from(config((mamba(), [0]), (mamba(), [1]),
                                     (spec("FullAttentionSpec", block_size=64), [2])), 128)
    assert [g.kind for g in lay.groups] == ["state", "state", "full"]
    assert lay.groups[0].state_bytes == 3 * 192 * 2 + 64 * 64 * 4
    # The block holds the full group only; the two states form a record of one block.
    assert lay.bytes_per_block == 128 * 2 * 2 * 64 * 4 and lay.state_blocks == 1
    assert lay.state_bytes == 2 * lay.groups[0].state_bytes
    assert [(g.per_block, g.keep) for g in groups] == [(2, 1), (2, 1), (2, 2)]
    # vLLM's align mode: a state page where a step or a prefill chunk ended on a boundary
    # (block 1 here; block 2's in one group only), the null block elsewhere.
    s0, s1, full = [0, 0, 0, 5, 0, 8], [0, 0, 0, 6, 0, 0], [1, 2, 3, 4, 7, 9]
    end, pages, resumable = save_pages(groups, (s0, s1, full), 0, 3)
    assert end == 3 and resumable == [1]
    assert pages == [[-1, 5, 8], [-1, 6, -1], full]  # -1: no state there
    # A load resuming at block 1's end writes its state only (vLLM resumes from it).
    pages, whole = load_pages(groups, ([0, 0, 0, 11], [0, 0, 0, 12], [1, 2, 3, 4]), 0, 2, 0)
    assert whole == 2 and pages == [[-1, 11], [-1, 12], [1, 2, 3, 4]]
    # No state page where the load ends: nothing can be restored.
    _, whole = load_pages(groups, ([0, 0, 0, 0], [0, 0, 0, 12], [1, 2, 3, 4]), 0, 2, 0)
    assert whole == 0


def test_state_keys_are_apart_from_every_chain_key():
    root = kvtier.BlockKey(1, 2)
    chain = kvtier.hash_prefix(root, 4, list(range(12)))
    states = [k for c in chain for k in state_keys(c, 2)]
    assert len(set(states) | set(chain)) == 9
    assert state_keys(chain[1], 2) == states[2:4]  # the same keys every time
    assert state_keys(chain[1], 1) == states[2:3]
    # The documented derivation: one token, 0xFFFFFFFF - p, chained on the block's key.
    assert states[3] == kvtier.hash_prefix(chain[1], 1, [0xFFFFFFFF - 1])[0]


def test_state_pages_copy_rows_at_the_groups_offset_and_zero_a_missing_state():
    from kvtier.integrations.paged import GroupedPaged, StatePages
    lay, _ = layout_from(config((spec("FullAttentionSpec", block_size=64), [0]), (mamba(), [1]),
                                (mamba(), [2])), 128)
    size = lay.groups[1].state_bytes
    # vLLM's view: [pages, 1, 1, state bytes] int8, rows a padded page apart.
    raw = torch.randint(-128, 127, (6, size + 100), dtype=torch.int8)
    layer = raw[:, :size].view(6, 1, 1, size)
    part = StatePages([layer], lay, 2)
    grouped = GroupedPaged([part])
    grouped.layout = lay
    blocks = torch.full((2 * lay.state_blocks, lay.bytes_per_block), 7, dtype=torch.uint8)
    out = grouped.records(blocks)
    assert out.shape == (2, lay.state_blocks * lay.bytes_per_block)
    part.gather([4, -1], out)
    off = lay.group_offset(2)
    assert off == size  # after group 1's state in the record
    assert torch.equal(out[0, off:off + size], raw[4, :size].view(torch.uint8))
    assert int(out[1, off:off + size].abs().sum()) == 0 and int(out[0, 0]) == 7
    assert torch.equal(blocks.reshape(-1)[off:off + size], raw[4, :size].view(torch.uint8))
    before = raw.clone()
    part.scatter(out, [2, -1])
    assert torch.equal(raw[2, :size], raw[4, :size]) and torch.equal(raw[2, size:], before[2, size:])
    assert torch.equal(raw[[0, 1, 3, 4, 5]], before[[0, 1, 3, 4, 5]])
    with pytest.raises(ValueError, match="unknown state page layout"):
        StatePages([raw.view(6, 1, 1, -1)], lay, 1)
