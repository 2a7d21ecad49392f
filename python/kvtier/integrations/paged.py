"""PagedKv: an engine's paged KV tensors seen as kvtier blocks. No engine import.

An engine keeps one tensor per layer, paged in blocks of `page_tokens`; a kvtier block of
`layout.block_tokens` tokens spans `ratio = block_tokens / page_tokens` pages of every layer.
gather() copies pages into kvtier's block byte order (doc/layout.md: per layer, K[tokens][heads]
[head_dim] then V), scatter() copies back; both are one C++ call (kvtier.gather_pages /
scatter_pages) for any number of blocks, with the GIL released. The layout of the tensors is
found from their shapes; an unknown one is refused with a ValueError naming it.

Known page layouts (N = pages, H = kv heads, P = page tokens, D = head_dim):
  "fused":  [N, H, P, 2*D]   vLLM CPU after mid-2026: per head, P rows of K then P rows of V
  "split":  [2, N, H, P, D]  vLLM CPU before it
  "latent": [N, 1, P, D]     MLA: one latent per token
A grouped layout (hybrid models) has one PagedKv per group (`group`), each copying its group's
kept pages at the group's offset in the block, and one StatePages per state group (a Mamba /
linear-attention layer's page: its state's bytes, one row per page) copying to and from the
group's offset in a state record; GroupedPaged holds them all.
Thread-safety: none; one PagedKv per worker.
"""

from __future__ import annotations

import re

import torch

import kvtier

DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def layer_order(names) -> list[str]:
    """Layer names by their layer number ("model.layers.3.self_attn.attn" -> 3)."""
    def key(name: str):
        m = re.search(r"layers\.(\d+)\.", name)
        return (int(m.group(1)) if m else 1 << 30, name)

    return sorted(names, key=key)


def group_shape(layout: kvtier.KvLayout, group: int) -> tuple[str, int, int, int, str]:
    """(kind, layers, kv heads, head_dim, dtype) of a layout's group (-1: ungrouped)."""
    if group < 0:
        kind = "latent" if layout.attention == "mla" else "full"
        return kind, layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.dtype
    g = layout.groups[group]
    return g.kind, g.num_layers, g.num_kv_heads, g.head_dim, g.dtype


class PagedKv:
    def __init__(self, layers: list[torch.Tensor], layout: kvtier.KvLayout, page_tokens: int,
                 names: list[str] | None = None, group: int = -1):
        names = names or [str(i) for i in range(len(layers))]
        if layout.block_tokens % page_tokens != 0:
            raise ValueError(f"kvtier block of {layout.block_tokens} tokens is not a whole number "
                             f"of {page_tokens}-token pages")
        gkind, num_layers, H, D, dtype = group_shape(layout, group)
        if len(layers) != num_layers:
            raise ValueError(f"{len(layers)} KV tensors for a layout of {num_layers} layers")
        P = page_tokens
        kinds = set()
        for name, t in zip(names, layers):
            shape = tuple(t.shape)
            if gkind == "latent":
                if len(shape) != 4 or shape[1:] != (1, P, D):
                    raise ValueError(f"unknown paged MLA layout {list(shape)} ({t.dtype}) for "
                                     f"layer {name}; known: [num_blocks, 1, {P}, {D}]")
                kinds.add("latent")
            elif len(shape) == 4 and shape[1:] == (H, P, 2 * D):
                kinds.add("fused")
            elif len(shape) == 5 and shape[0] == 2 and shape[2:] == (H, P, D):
                kinds.add("split")
            else:
                raise ValueError(
                    f"unknown paged KV layout {list(shape)} ({t.dtype}) for layer {name}; known: "
                    f"[num_blocks, {H}, {P}, {2 * D}] and [2, num_blocks, {H}, {P}, {D}]")
            if DTYPES.get(t.dtype) != dtype:
                raise ValueError(f"layer {name} is {t.dtype}; the layout says {dtype}")
            if not t.is_contiguous():
                raise ValueError(f"layer {name}: the paged KV tensor is not contiguous")
        if len(kinds) != 1:
            raise ValueError(f"mixed paged KV layouts {sorted(kinds)}")
        self.kind = kinds.pop()
        self.layers = layers
        self.layout = layout
        self.group = group
        self.page_tokens = P
        self.ratio = layout.block_tokens // P
        # Pages of a kvtier block this group keeps (the last ones: a sliding window's).
        self.keep = (layout.groups[group].stored_tokens(layout.block_tokens) // P
                     if group >= 0 else self.ratio)

    def pages(self, layer: torch.Tensor) -> torch.Tensor:
        """A layer as [N, H, P, 2, D] (a view: writes go to the engine's memory)."""
        L, P = self.layout, self.page_tokens
        if self.kind == "fused":
            # The CPU kernel views each head's [P, 2D] as [2P, D]: K's P rows, then V's.
            return layer.view(layer.shape[0], L.num_kv_heads, 2, P, L.head_dim).permute(
                0, 1, 3, 2, 4)
        return layer.permute(1, 2, 3, 0, 4)

    def staging(self, n: int) -> torch.Tensor:
        """n kvtier blocks, [n, layers, 2, block_tokens, H, D]: kvtier's byte order."""
        L = self.layout
        return torch.empty((n, L.num_layers, 2, L.block_tokens, L.num_kv_heads, L.head_dim),
                           dtype=self.layers[0].dtype, device=self.layers[0].device)

    def gather(self, page_ids, out: torch.Tensor) -> None:
        """out[i] <- pages page_ids[i*ratio:(i+1)*ratio] of every layer (kvtier.gather_pages:
        one C++ call for all blocks, GIL released). page_ids: a list of ints or an int tensor."""
        kvtier.gather_pages(self.layers, page_ids, out, self.layout, self.page_tokens, self.kind,
                            self.group)

    def scatter(self, src: torch.Tensor, page_ids, skip: int = 0) -> None:
        """Pages page_ids <- src's pages from the skip-th on (src: [n, layers, 2, tokens, H, D];
        kvtier.scatter_pages); a negative page id is left unwritten."""
        kvtier.scatter_pages(src, self.layers, page_ids, self.layout, self.page_tokens,
                             self.kind, skip, self.group)


class StatePages:
    """A state group's pages: per layer, a tensor whose row p is page p, state_bytes long (vLLM
    gives a Mamba layer as [N, 1, 1, state bytes] int8, rows a padded page apart). gather()
    copies row p of every layer to the group's offset in a state record (out: [records, bytes];
    page -1: zeros); scatter() copies back, skipping -1. Torch index copies: one per layer."""

    kind = "state"
    keep = 1

    def __init__(self, layers: list[torch.Tensor], layout: kvtier.KvLayout, group: int,
                 names: list[str] | None = None):
        g = layout.groups[group]
        names = names or [str(i) for i in range(len(layers))]
        if len(layers) != g.num_layers:
            raise ValueError(f"{len(layers)} state tensors for a group of {g.num_layers} layers")
        self.layers, self.layout, self.group = layers, layout, group
        self.rows = []
        for name, t in zip(names, layers):
            size = t[0].numel() * t.element_size() if t.dim() else 0
            if t.dim() < 2 or size != g.state_bytes or not t[0].is_contiguous():
                raise ValueError(f"unknown state page layout {list(t.shape)} ({t.dtype}) for "
                                 f"layer {name}; known: [num_blocks, ...] of {g.state_bytes} "
                                 "contiguous bytes per block")
            row = torch.empty(0, dtype=torch.uint8, device=t.device)
            row.set_(t.untyped_storage(), t.storage_offset() * t.element_size(),
                     (t.shape[0], size), (t.stride(0) * t.element_size(), 1))
            self.rows.append(row)
        self.size = g.state_bytes
        self.offset = layout.group_offset(group)

    def _span(self, layer: int) -> slice:
        a = self.offset + layer * self.size
        return slice(a, a + self.size)

    def gather(self, page_ids, out: torch.Tensor) -> None:
        ids = torch.as_tensor(list(page_ids), dtype=torch.long)
        have = (ids >= 0).nonzero().flatten()
        flat = out.view(out.shape[0], -1).view(torch.uint8)
        for li, rows in enumerate(self.rows):
            part = flat[:, self._span(li)]
            if len(have) < len(ids):
                part.zero_()
            part[have] = rows[ids[have]]

    def scatter(self, src: torch.Tensor, page_ids) -> None:
        ids = torch.as_tensor(list(page_ids), dtype=torch.long)
        have = (ids >= 0).nonzero().flatten()
        if not len(have):
            return
        flat = src.view(src.shape[0], -1).view(torch.uint8)
        for li, rows in enumerate(self.rows):
            rows[ids[have]] = flat[have][:, self._span(li)]


class GroupedPaged:
    """Every KV-cache group's paged tensors as kvtier blocks: parts[g] copies group g (one part
    for an ungrouped layout). Page ids come per group: the pages each kvtier block keeps
    (PagedKv.keep per block), in block order."""

    def __init__(self, parts: list[PagedKv]):
        self.parts = parts
        self.layout = parts[0].layout
        self.kind = ",".join(p.kind for p in parts)

    def staging(self, n: int) -> torch.Tensor:
        """n kvtier blocks as bytes."""
        return torch.empty((n, self.layout.bytes_per_block), dtype=torch.uint8)

    def records(self, blocks: torch.Tensor) -> torch.Tensor:
        """State records over staging blocks (state_blocks of them each): [records, bytes]."""
        per = self.layout.state_blocks * self.layout.bytes_per_block
        return blocks.reshape(-1).view(blocks.shape[0] // self.layout.state_blocks, per)

    def gather(self, pages: list, out: torch.Tensor) -> None:
        """Every group but the state groups (pages: per group; a state group's are not read)."""
        for part, ids in zip(self.parts, pages):
            if part.keep and part.kind != "state":
                part.gather(ids, out)

    def scatter(self, src: torch.Tensor, pages: list) -> None:
        for part, ids in zip(self.parts, pages):
            if part.keep and part.kind != "state":
                part.scatter(src, ids)

    def load(self, cache: kvtier.KvCache, hit, count: int, pages: list,
             scratch: torch.Tensor) -> int:
        """Hit blocks [0, count) of lookup hit into the pages (pages: per group, the blocks' kept
        pages, as scatter takes them; state groups are not written): one copy per block where
        the cache lends it in place, else through scratch (kvtier.load_pages). Returns how many
        leading blocks loaded."""
        parts = [(p.layers, ids, p.page_tokens, p.kind, p.group)
                 for p, ids in zip(self.parts, pages) if p.keep and p.kind != "state"]
        return kvtier.load_pages(cache, hit, 0, count, parts, scratch).loaded_blocks

    def gather_states(self, pages: list, records: torch.Tensor) -> None:
        """records[r] <- the state pages pages[g][r] of every state group g (records: [n, m x
        block bytes]); the padding past the states is zeroed."""
        records[:, self.layout.state_bytes:].zero_()
        for part, ids in zip(self.parts, pages):
            if part.kind == "state":
                part.gather(ids, records)

    def scatter_states(self, records: torch.Tensor, pages: list) -> None:
        for part, ids in zip(self.parts, pages):
            if part.kind == "state":
                part.scatter(records, ids)
