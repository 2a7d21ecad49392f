"""PagedKv: an engine's paged KV tensors seen as kvtier blocks. No engine import.

An engine keeps one tensor per layer, paged in blocks of `page_tokens`; a kvtier block of
`layout.block_tokens` tokens spans `ratio = block_tokens / page_tokens` pages of every layer.
gather() copies pages into kvtier's block byte order (doc/layout.md: per layer, K[tokens][heads]
[head_dim] then V), scatter() copies back; both are one C++ call (kvtier.gather_pages /
scatter_pages) for any number of blocks, with the GIL released. The layout of the tensors is
found from their shapes; an unknown one is refused with a ValueError naming it.

Known page layouts (N = pages, H = kv heads, P = page tokens, D = head_dim):
  "fused": [N, H, P, 2*D]   vLLM CPU after mid-2026: per head, P rows of K then P rows of V
  "split": [2, N, H, P, D]  vLLM CPU before it
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


class PagedKv:
    def __init__(self, layers: list[torch.Tensor], layout: kvtier.KvLayout, page_tokens: int,
                 names: list[str] | None = None):
        names = names or [str(i) for i in range(len(layers))]
        if layout.block_tokens % page_tokens != 0:
            raise ValueError(f"kvtier block of {layout.block_tokens} tokens is not a whole number "
                             f"of {page_tokens}-token pages")
        if len(layers) != layout.num_layers:
            raise ValueError(f"{len(layers)} KV tensors for a layout of {layout.num_layers} "
                             "layers")
        H, D, P = layout.num_kv_heads, layout.head_dim, page_tokens
        kinds = set()
        for name, t in zip(names, layers):
            shape = tuple(t.shape)
            if len(shape) == 4 and shape[1:] == (H, P, 2 * D):
                kinds.add("fused")
            elif len(shape) == 5 and shape[0] == 2 and shape[2:] == (H, P, D):
                kinds.add("split")
            else:
                raise ValueError(
                    f"unknown paged KV layout {list(shape)} ({t.dtype}) for layer {name}; known: "
                    f"[num_blocks, {H}, {P}, {2 * D}] and [2, num_blocks, {H}, {P}, {D}]")
            if DTYPES.get(t.dtype) != layout.dtype:
                raise ValueError(f"layer {name} is {t.dtype}; the layout says {layout.dtype}")
            if not t.is_contiguous():
                raise ValueError(f"layer {name}: the paged KV tensor is not contiguous")
        if len(kinds) != 1:
            raise ValueError(f"mixed paged KV layouts {sorted(kinds)}")
        self.kind = kinds.pop()
        self.layers = layers
        self.layout = layout
        self.page_tokens = P
        self.ratio = layout.block_tokens // P

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
        kvtier.gather_pages(self.layers, page_ids, out, self.layout, self.page_tokens, self.kind)

    def scatter(self, src: torch.Tensor, page_ids, skip: int = 0) -> None:
        """Pages page_ids <- src's pages from the skip-th on (src: [n, layers, 2, tokens, H, D];
        kvtier.scatter_pages)."""
        kvtier.scatter_pages(src, self.layers, page_ids, self.layout, self.page_tokens,
                             self.kind, skip)
