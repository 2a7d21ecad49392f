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
  "flash":  [2, N, P, H, D]  vLLM on CUDA (FlashAttention; on the CPU a shape "split" also
                             fits is read as "split")
  "flashinfer": [N, 2, P, H, D]  vLLM on CUDA (FlashInfer)
  "latent": [N, 1, P, D]     MLA: one latent per token
Tensors on the CPU in the first two layouts and "latent" are copied by the C++ kernels; the
others, and every tensor on a device (CUDA), by torch: an index copy of the blocks' pages on the
tensors' device, then one copy each way between it and the host buffer (pinned where the
device is CUDA: GroupedPaged.staging).
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
            elif (len(shape) == 5 and shape[0] == 2 and shape[2:] == (H, P, D)
                  and (t.device.type == "cpu" or shape[2:] != (P, H, D))):
                kinds.add("split")
            elif len(shape) == 5 and shape[0] == 2 and shape[2:] == (P, H, D):
                kinds.add("flash")
            elif len(shape) == 5 and shape[1:] == (2, P, H, D):
                kinds.add("flashinfer")
            else:
                raise ValueError(
                    f"unknown paged KV layout {list(shape)} ({t.dtype}) for layer {name}; known: "
                    f"[num_blocks, {H}, {P}, {2 * D}], [2, num_blocks, {H}, {P}, {D}], "
                    f"[2, num_blocks, {P}, {H}, {D}] and [num_blocks, 2, {P}, {H}, {D}]")
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
        self.heads, self.head_dim = H, D
        self.torch_copies = (self.kind in ("flash", "flashinfer")
                             or any(t.device.type != "cpu" for t in layers))
        # This group's bytes in a block: from offset, one run of layer_bytes per layer.
        self.offset = layout.group_offset(group) if group >= 0 else 0
        tokens = self.keep * P * (1 if gkind == "latent" else 2 * H)
        self.layer_bytes = tokens * D * layers[0].element_size()

    def pages(self, layer: torch.Tensor) -> torch.Tensor:
        """A layer as [N, H, P, 2, D], or [N, P, D] for "latent" (a view: writes go to the
        engine's memory)."""
        P = self.page_tokens
        if self.kind == "fused":
            # The CPU kernel views each head's [P, 2D] as [2P, D]: K's P rows, then V's.
            return layer.view(layer.shape[0], self.heads, 2, P, self.head_dim).permute(
                0, 1, 3, 2, 4)
        if self.kind == "flash":
            return layer.permute(1, 3, 2, 0, 4)
        if self.kind == "flashinfer":
            return layer.permute(0, 3, 2, 1, 4)
        if self.kind == "latent":
            return layer[:, 0]
        return layer.permute(1, 2, 3, 0, 4)

    def _block_view(self, sel: torch.Tensor, n: int) -> torch.Tensor:
        """n blocks' kept pages (sel: pages() rows, block-major) in kvtier's order, [n, bytes]
        of one layer."""
        if self.kind == "latent":  # [n*keep, P, D]: tokens in order
            out = sel
        else:  # [n*keep, H, P, 2, D] -> [n, 2, keep, P, H, D]: K's tokens, then V's
            H, P, D = sel.shape[1], sel.shape[2], sel.shape[4]
            out = sel.view(n, self.keep, H, P, 2, D).permute(0, 4, 1, 3, 2, 5)
        return out.contiguous().view(n, -1).view(torch.uint8)

    def _check_ids(self, ids: torch.Tensor, what: str) -> None:
        # Checked here: a bad index on a device would be an asynchronous device fault.
        pages = self.pages(self.layers[0]).shape[0]
        if len(ids) and (int(ids.min()) < -1 or int(ids.max()) >= pages):
            raise ValueError(f"{what}: a page id outside -1..{pages - 1} "
                             f"({int(ids.min())}..{int(ids.max())})")

    def _torch_gather(self, page_ids, out: torch.Tensor) -> None:
        ids = torch.as_tensor(page_ids, dtype=torch.long).flatten()
        self._check_ids(ids, "gather")
        n = len(ids) // self.keep
        if n * self.keep != len(ids) or n > out.shape[0]:
            raise ValueError(f"gather: {len(ids)} page ids for {out.shape[0]} blocks of "
                             f"{self.keep} pages")
        dev = self.layers[0].device
        idx = ids.clamp(min=0).to(dev)
        absent = (ids < 0).to(dev) if bool((ids < 0).any()) else None
        blocks = torch.empty((n, len(self.layers) * self.layer_bytes), dtype=torch.uint8,
                             device=dev)
        for li, layer in enumerate(self.layers):
            sel = self.pages(layer)[idx]
            if absent is not None:
                sel[absent] = 0  # page -1: zeros, as the C++ kernels write
            blocks[:, li * self.layer_bytes:(li + 1) * self.layer_bytes] = self._block_view(sel, n)
        flat = out.reshape(out.shape[0], -1).view(torch.uint8)
        flat[:n, self.offset:self.offset + blocks.shape[1]].copy_(blocks)

    def _torch_scatter(self, src: torch.Tensor, page_ids, skip: int) -> None:
        # page_ids name the blocks' pages from the skip-th on.
        given = torch.as_tensor(page_ids, dtype=torch.long).flatten()
        self._check_ids(given, "scatter")
        ids = torch.cat([torch.full((skip,), -1, dtype=torch.long), given])
        n = -(-len(ids) // self.keep)
        if n > src.shape[0]:
            raise ValueError(f"scatter: {len(given)} page ids past {skip} for {src.shape[0]} "
                             f"blocks of {self.keep} pages")
        ids = torch.cat([ids, torch.full((n * self.keep - len(ids),), -1, dtype=torch.long)])
        have = (ids >= 0).nonzero().flatten()
        if not len(have):
            return
        dev = self.layers[0].device
        flat = src.reshape(src.shape[0], -1).view(torch.uint8)
        blocks = flat[:n, self.offset:self.offset + len(self.layers) * self.layer_bytes].to(dev)
        idx, rows = ids[have].to(dev), have.to(dev)
        for li, layer in enumerate(self.layers):
            view = self.pages(layer)
            one = blocks[:, li * self.layer_bytes:(li + 1) * self.layer_bytes].contiguous()
            typed = one.view(layer.dtype)
            if self.kind == "latent":
                pages = typed.view(n * self.keep, *view.shape[1:])
            else:
                _, H, P, _, D = view.shape
                pages = typed.view(n, 2, self.keep, P, H, D).permute(0, 2, 4, 3, 1, 5).reshape(
                    n * self.keep, H, P, 2, D)
            view[idx] = pages[rows]

    def staging(self, n: int) -> torch.Tensor:
        """n kvtier blocks, [n, layers, 2, block_tokens, H, D]: kvtier's byte order."""
        L = self.layout
        return torch.empty((n, L.num_layers, 2, L.block_tokens, L.num_kv_heads, L.head_dim),
                           dtype=self.layers[0].dtype, device=self.layers[0].device)

    def gather(self, page_ids, out: torch.Tensor) -> None:
        """out[i] <- pages page_ids[i*ratio:(i+1)*ratio] of every layer (kvtier.gather_pages:
        one C++ call for all blocks, GIL released). page_ids: a list of ints or an int tensor."""
        if self.torch_copies:
            return self._torch_gather(page_ids, out)
        kvtier.gather_pages(self.layers, page_ids, out, self.layout, self.page_tokens, self.kind,
                            self.group)

    def scatter(self, src: torch.Tensor, page_ids, skip: int = 0) -> None:
        """Pages page_ids <- src's pages from the skip-th on (src: [n, layers, 2, tokens, H, D];
        kvtier.scatter_pages); a negative page id is left unwritten."""
        if self.torch_copies:
            return self._torch_scatter(src, page_ids, skip)
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
            part[have] = rows[ids[have].to(rows.device)].to(part.device)

    def scatter(self, src: torch.Tensor, page_ids) -> None:
        ids = torch.as_tensor(list(page_ids), dtype=torch.long)
        have = (ids >= 0).nonzero().flatten()
        if not len(have):
            return
        flat = src.view(src.shape[0], -1).view(torch.uint8)
        for li, rows in enumerate(self.rows):
            rows[ids[have].to(rows.device)] = flat[have][:, self._span(li)].to(rows.device)


class GroupedPaged:
    """Every KV-cache group's paged tensors as kvtier blocks: parts[g] copies group g (one part
    for an ungrouped layout). Page ids come per group: the pages each kvtier block keeps
    (PagedKv.keep per block), in block order."""

    def __init__(self, parts: list[PagedKv]):
        self.parts = parts
        self.layout = parts[0].layout
        self.kind = ",".join(p.kind for p in parts)

    def staging(self, n: int) -> torch.Tensor:
        """n kvtier blocks as bytes (pinned where the pages are on CUDA: DMA both ways)."""
        pin = any(p.layers[0].device.type == "cuda" for p in self.parts)
        return torch.empty((n, self.layout.bytes_per_block), dtype=torch.uint8, pin_memory=pin)

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
        kv = [(p, ids) for p, ids in zip(self.parts, pages) if p.keep and p.kind != "state"]
        if any(p.torch_copies for p, _ in kv):
            # Pages kvtier's kernels cannot write (a device's): through scratch, a chunk at once.
            done, k = 0, scratch.shape[0]
            while done < count:
                m = min(k, count - done)
                got = cache.load(hit, scratch[:m], first=done).loaded_blocks
                for p, ids in kv:
                    p.scatter(scratch[:got], ids[done * p.keep:(done + got) * p.keep])
                done += got
                if got < m:
                    break
            return done
        parts = [(p.layers, ids, p.page_tokens, p.kind, p.group) for p, ids in kv]
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
