"""vLLM's KV-cache groups as one kvtier layout, and which of vLLM's pages each kvtier block keeps.

vLLM (0.32, hybrid KV-cache manager) gives every group of layers its own block table: full
attention, MLA (one latent per token), sliding window (pages out of the window are the null
block, id 0), Mamba / linear-attention state (in vLLM's "align" mode a state page holds the state
at its block's end, and only where vLLM kept one). kvtier stores one block per `block_tokens`
tokens holding, group after group, what a resume at the block's end needs (doc/layout.md): every
page of a full or MLA group, the last pages of a sliding-window group (those holding window - 1
tokens). State groups are not in the block: where vLLM kept every state group's state at a block's
end, the states form the block's state record, stored under its state keys (kvtier.state_keys),
which a lookup probes; a block without one is no place to resume. A dense model keeps the ungrouped
layout of earlier releases (same keys); an MLA-only model the ungrouped MLA layout.
No vLLM import: the specs are read by their class names and fields.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import kvtier
from kvtier.integrations.paged import DTYPES

SPEC_KINDS = {"FullAttentionSpec": "full", "MLAAttentionSpec": "latent",
              "SlidingWindowSpec": "sliding_window", "MambaSpec": "state"}
NULL_PAGE = 0  # vLLM's null block: a page a group does not hold


@dataclass
class Group:
    kind: str  # kvtier's group kind
    layer_names: list[str]
    page_tokens: int  # vLLM's block size of this group
    per_block: int  # vLLM pages per kvtier block
    keep: int  # of them, the last `keep` are stored


def _state_group(spec, names: list[str], kb: int, page: int,
                 index: int) -> tuple[Group, kvtier.KvLayoutGroup]:
    mode = str(getattr(spec, "mamba_cache_mode", "none"))
    if mode != "align":
        raise ValueError(f"kvtier connector: KV-cache group {index} is Mamba / linear-attention "
                         f"state in vLLM's mamba_cache_mode '{mode}', which keeps no state at "
                         "block boundaries; kvtier needs 'align' (turn prefix caching on, or pass "
                         "--mamba-cache-mode align)")
    # One layer's state: its tensors (conv, SSM), unpadded, as vLLM lays them in a page.
    nbytes = sum(math.prod(shape) * dt.itemsize for shape, dt in zip(spec.shapes, spec.dtypes))
    g = kvtier.KvLayoutGroup("state", len(names), 0, 0, "fp32", state_bytes=nbytes)
    return Group("state", list(names), page, kb // page, 1), g


def _group_of(spec, names: list[str], kb: int, index: int) -> tuple[Group, kvtier.KvLayoutGroup]:
    cls = type(spec).__name__
    kind = SPEC_KINDS.get(cls)
    if kind is None:
        raise ValueError(f"kvtier connector: KV-cache group {index} is {cls}, which kvtier does "
                         "not store (supported: full attention, MLA, sliding window, Mamba / "
                         "linear-attention state)")
    page = int(spec.block_size)
    if kb % page != 0:
        raise ValueError(f"kvtier connector: block_tokens {kb} is not a multiple of group "
                         f"{index}'s block size {page}")
    if kind == "state":
        return _state_group(spec, names, kb, page, index)
    if kind == "full" and getattr(spec, "sliding_window", None):
        kind = "sliding_window"
    dtype = DTYPES.get(spec.dtype)
    if dtype is None or str(getattr(spec, "cache_dtype_str", "auto")) not in ("auto", "None"):
        raise ValueError(f"kvtier connector: KV-cache group {index} ({cls}) has KV dtype "
                         f"{spec.dtype} / {getattr(spec, 'cache_dtype_str', '')}; kvtier "
                         "stores fp32, fp16 and bf16 caches")
    heads = 1 if kind == "latent" else int(spec.num_kv_heads)
    window = int(spec.sliding_window) if kind == "sliding_window" else 0
    g = kvtier.KvLayoutGroup(kind, len(names), heads, int(spec.head_size), dtype, window=window,
                             page_tokens=page if window else 0)
    keep = g.stored_tokens(kb) // page
    return Group(kind, list(names), page, kb // page, keep), g


def layout_from(kv_cache_config, kb: int) -> tuple[kvtier.KvLayout, list[Group]]:
    """kvtier's layout for vLLM's KV-cache groups, and the groups in kvtier's order."""
    specs = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
    if not specs:
        raise ValueError("kvtier connector: vLLM gave no KV-cache groups")
    pairs = [_group_of(g.kv_cache_spec, g.layer_names, kb, i) for i, g in enumerate(specs)]
    groups = [p[0] for p in pairs]
    if len(pairs) == 1 and groups[0].kind in ("full", "latent"):
        g = pairs[0][1]
        return kvtier.KvLayout(num_layers=g.num_layers, num_kv_heads=g.num_kv_heads,
                               head_dim=g.head_dim, dtype=g.dtype, block_tokens=kb,
                               attention="mla" if g.kind == "latent" else "mha"), groups
    return kvtier.KvLayout.from_groups([p[1] for p in pairs], kb), groups


def save_pages(groups: list[Group], block_ids, first: int, end: int) -> tuple[int, list, list]:
    """The pages kvtier blocks [first, end) keep, per group (flat, block after block), the end
    actually covered, and the blocks among them whose every state group holds the state at the
    block's end (resumable: their state records are stored). A block whose kept window page vLLM
    no longer holds ends the run (only a sliding window drops pages, and only those out of every
    later window); a state page vLLM did not keep is -1."""
    pages: list[list[int]] = [[] for _ in groups]
    resumable: list[int] = []
    has_state = any(g.kind == "state" for g in groups)
    for i in range(first, end):
        picked, whole_state = [], has_state
        for g, ids in zip(groups, block_ids):
            span = list(ids[i * g.per_block:(i + 1) * g.per_block])
            kept = span[g.per_block - g.keep:] if g.keep else []
            if len(span) < g.per_block:
                return i, pages, resumable
            if g.kind == "state":
                whole_state = whole_state and NULL_PAGE not in kept
                kept = [p if p != NULL_PAGE else -1 for p in kept]
            elif NULL_PAGE in kept:
                return i, pages, resumable
            picked.append(kept)
        for out, kept in zip(pages, picked):
            out.extend(kept)
        if whole_state:
            resumable.append(i)
    return end, pages, resumable


def load_pages(groups: list[Group], block_ids, first: int, end: int,
               from_token: int) -> tuple[list, int]:
    """The pages to write for kvtier blocks [first, end), per group, -1 where a page is not
    written (before from_token: vLLM computed it; the null block: the group does not need it;
    a state group's page of any block but the last: the last block's state is the one vLLM
    resumes from); and how many leading blocks can be restored: a block with a page vLLM needs
    but kvtier does not keep ends them (it never happens with vLLM 0.32's window accounting),
    and a load whose last block has no state page vLLM allocated restores none."""
    pages: list[list[int]] = [[] for _ in groups]
    whole = end - first
    for i in range(first, end):
        for gi, (g, ids) in enumerate(zip(groups, block_ids)):
            span = list(ids[i * g.per_block:(i + 1) * g.per_block])
            span += [NULL_PAGE] * (g.per_block - len(span))
            if g.kind == "state":
                page = span[-1] if i == end - 1 else NULL_PAGE
                if i == end - 1 and page == NULL_PAGE:
                    whole = 0
                pages[gi].append(page if page != NULL_PAGE else -1)
                continue
            for j, page in enumerate(span):
                start = (i * g.per_block + j) * g.page_tokens
                needed = page != NULL_PAGE and start >= from_token
                if j < g.per_block - g.keep:
                    if needed:
                        whole = min(whole, i - first)
                    continue
                pages[gi].append(page if needed else -1)
    return pages, whole


def stored_report(layout: kvtier.KvLayout, groups: list[Group]) -> dict:
    """What a kvtier block stores, per group and in all, beside what storing every group's every
    token would take (a sliding window keeps only its last pages); a state group's bytes are in
    the state records, one per boundary where vLLM kept a state, not in every block."""
    kb = layout.block_tokens
    per_group = ([{"kind": g.kind, "bytes": lg.bytes_per_block(kb),
                   "state_record_bytes": lg.state_record_bytes,
                   "full_bytes": lg.full_bytes_per_block(kb), "kept_pages": g.keep,
                   "pages": g.per_block} for g, lg in zip(groups, layout.groups)]
                 if layout.grouped else [{"kind": groups[0].kind, "bytes": layout.bytes_per_block,
                                          "full_bytes": layout.bytes_per_block,
                                          "kept_pages": groups[0].keep,
                                          "pages": groups[0].per_block}])
    return {"layout": repr(layout), "fingerprint": layout.fingerprint,
            "block_bytes": layout.bytes_per_block,
            "full_block_bytes": layout.full_bytes_per_block, "groups": per_group,
            "state_bytes": layout.state_bytes, "state_blocks": layout.state_blocks}
