"""KvtierHiCacheStorage: kvtier as the L3 storage backend of SGLang's HiCache. See doc/sglang.md.

    python -m sglang.launch_server --model-path M --enable-hierarchical-cache \
      --hicache-mem-layout page_first --hicache-storage-backend dynamic \
      --hicache-storage-backend-extra-config '{"backend_name":"kvtier",
        "module_path":"kvtier.integrations.sglang","class_name":"KvtierHiCacheStorage",
        "interface_v1":1,"backend":"daemon"}'

SGLang hands over pages of its host KV pool by host index, keyed by its own per-page hash
strings (each chained on the previous page's hash, so equal prefixes give equal strings in every
process). One SGLang page is one kvtier block; its key is XXH3-128 over the namespace root
(model, revision, layout), a salt naming this rank's shard, then the string. The pages are
copied into kvtier's block byte order (doc/layout.md) on a store and back on a load, whatever
the host pool's layout. Nothing here raises into SGLang once running: a failed call is a miss
(or an unsaved page), logged once per kind.

SGLang is not imported at module import (it needs CUDA); HiCacheStorage is the base class only
when SGLang can be imported.
Thread-safety: SGLang calls get and set from its prefetch and backup threads at once; calls
share only the KvCache (thread-safe) and allocate their own staging tensors.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
from typing import Any

import torch

import kvtier
from kvtier import backends
from kvtier.integrations.paged import DTYPES

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
except Exception:  # not installed, or no CUDA here: keep SGLang's method names, no base class

    class _Base:  # type: ignore[no-redef]
        def register_mem_pool_host(self, mem_pool_host) -> None:
            self.mem_pool_host = mem_pool_host


logger = logging.getLogger("kvtier.sglang")

# Keys of extra_config that are SGLang's own (its loader's), not kvtier's.
_SGLANG_KEYS = ("backend_name", "module_path", "class_name", "interface_v1")
# Keys read here and not by kvtier.backends.
_OWN_KEYS = ("connect_wait_ms",)

# SGLang's MHA host pool layouts (--hicache-mem-layout): kv_buffer's dims, with T = tokens,
# N = pages, P = page_size, L = layers, H = kv heads, D = head_dim, and the view that turns it
# into [N, L, 2, P, H, D]: one kvtier block per page, in kvtier's byte order.
_LAYOUTS = {
    "layer_first": "[2, L, T, H, D]",
    "page_first": "[2, T, L, H, D]",
    "page_first_direct": "[2, N, L, P, H, D]",
    "page_head": "[2, N, H, P, L, D]",
}


def _pages_view(layout: str, buf: torch.Tensor, page: int) -> torch.Tensor:
    """buf seen as [N, L, 2, P, H, D] (a view: writes go to the pool)."""
    if layout == "layer_first":
        _, L, T, H, D = buf.shape
        return buf.view(2, L, T // page, page, H, D).permute(2, 1, 0, 3, 4, 5)
    if layout == "page_first":
        _, T, L, H, D = buf.shape
        return buf.view(2, T // page, page, L, H, D).permute(1, 3, 0, 2, 4, 5)
    if layout == "page_first_direct":
        return buf.permute(1, 2, 0, 3, 4, 5)
    return buf.permute(1, 4, 0, 3, 2, 5)  # page_head


def _words(text: str) -> list[int]:
    """text as little-endian uint32 words, its byte length first (so padding never collides)."""
    raw = text.encode()
    padded = raw + b"\0" * (-len(raw) % 4)
    return [len(raw), *struct.unpack(f"<{len(padded) // 4}I", padded)]


def _key_bytes(key: str) -> bytes:
    """A page key as hash bytes: SGLang's keys are hex digests (decoded); any other string is
    its UTF-8, or its SHA-256 when longer than an event's 64-byte hash."""
    try:
        b = bytes.fromhex(key)
    except ValueError:
        b = key.encode()
    return b if len(b) <= 64 else hashlib.sha256(b).digest()


def _hash_string(parent: kvtier.BlockKey, text: str) -> kvtier.BlockKey:
    words = _words(text)
    return kvtier.hash_prefix(parent, len(words), words)[0]


class _HostPages:
    """SGLang's host KV pool seen as kvtier blocks (one per page)."""

    def __init__(self, pool: Any):
        layout = getattr(pool, "layout", None)
        buf = getattr(pool, "kv_buffer", None)
        page = int(getattr(pool, "page_size", 0) or 0)
        if layout not in _LAYOUTS:
            raise ValueError(f"kvtier HiCache backend: host pool layout {layout!r} "
                             f"({type(pool).__name__}) is not supported; supported: "
                             f"{', '.join(_LAYOUTS)} (MHA only)")
        want = _LAYOUTS[layout]
        if not isinstance(buf, torch.Tensor) or buf.dim() != want.count(",") + 1 or \
                buf.shape[0] != 2:
            shape = list(buf.shape) if isinstance(buf, torch.Tensor) else type(buf).__name__
            raise ValueError(f"kvtier HiCache backend: host pool layout {layout!r} has kv_buffer "
                             f"{shape}, expected {want} (an MLA or split K/V pool is not "
                             f"supported)")
        if page <= 0:
            raise ValueError(f"kvtier HiCache backend: host pool page_size {page} is not > 0")
        if layout in ("layer_first", "page_first") and buf.shape[2 if layout == "layer_first"
                                                                  else 1] % page:
            raise ValueError(f"kvtier HiCache backend: host pool of {list(buf.shape)} "
                             f"({layout}) is not a whole number of {page}-token pages")
        if layout in ("page_first_direct", "page_head") and buf.shape[3] != page:
            raise ValueError(f"kvtier HiCache backend: host pool {list(buf.shape)} ({layout}) "
                             f"has pages of {buf.shape[3]} tokens, page_size is {page}")
        dtype = DTYPES.get(buf.dtype)
        if dtype is None:
            raise ValueError(f"kvtier HiCache backend: KV dtype {buf.dtype} is not supported "
                             f"(supported: {', '.join(str(d) for d in DTYPES)})")
        if not buf.is_contiguous() or buf.device.type != "cpu":
            raise ValueError(f"kvtier HiCache backend: the host pool's kv_buffer must be a "
                             f"contiguous CPU tensor (it is on {buf.device})")
        self.kind = layout
        self.page = page
        self.pages = _pages_view(layout, buf, page)
        n, L, _, _, H, D = self.pages.shape
        self.num_pages = n
        self.layout = kvtier.KvLayout(num_layers=L, num_kv_heads=H, head_dim=D, dtype=dtype,
                                      block_tokens=page)

    def page_ids(self, host_indices, n: int) -> torch.Tensor:
        """The pages of n keys: host_indices holds n * page_size token slots, page-aligned."""
        idx = torch.as_tensor(host_indices).to("cpu", torch.long).reshape(-1)
        if idx.numel() < n * self.page:
            raise ValueError(f"{idx.numel()} host indices for {n} pages of {self.page} tokens")
        starts = idx[: n * self.page: self.page]
        if bool((starts % self.page).any()) or bool((starts // self.page >= self.num_pages).any()):
            raise ValueError(f"host indices {starts.tolist()} are not page starts inside a pool "
                             f"of {self.num_pages} pages")
        return starts // self.page

    def gather(self, ids: torch.Tensor) -> torch.Tensor:
        """The pages ids as one contiguous [n, L, 2, P, H, D] staging tensor."""
        return self.pages.index_select(0, ids).contiguous()

    def scatter(self, ids: torch.Tensor, staging: torch.Tensor) -> None:
        self.pages.index_copy_(0, ids, staging)


class KvtierHiCacheStorage(_Base):
    """HiCache storage backed by kvtier. Built by SGLang's dynamic loader as
    cls(storage_config, kwargs); kvtier's keys come from storage_config.extra_config."""

    def __init__(self, storage_config: Any, kwargs: dict | None = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        if not extra.get("interface_v1"):
            # Without it SGLang calls batch_get/batch_set with flat page copies instead.
            raise ValueError('kvtier HiCache backend: set "interface_v1": 1 in '
                             "--hicache-storage-backend-extra-config (kvtier moves pages by host "
                             "index, batch_get_v1/batch_set_v1)")
        if getattr(storage_config, "is_mla_model", False):
            raise ValueError("kvtier HiCache backend: MLA models are not supported yet")
        self._connect_wait_ms = int(extra.get("connect_wait_ms", 1000))
        self._config = {k: v for k, v in extra.items() if k not in _SGLANG_KEYS + _OWN_KEYS}
        model = getattr(storage_config, "model_name", None) or "default"
        self._config.setdefault("model_id", model)
        self._config.setdefault("model_revision", backends.model_fingerprint(model))
        # Each rank holds its own shard of every page: the salt keeps shards apart.
        def rank(name: str) -> tuple[int, int]:
            return (int(getattr(storage_config, f"{name}_rank", 0) or 0),
                    int(getattr(storage_config, f"{name}_size", 1) or 1))

        self._salt = "sglang-hicache-v1 tp=%d/%d pp=%d/%d cp=%d/%d" % (
            *rank("tp"), *rank("pp"), *rank("attn_cp"))
        self._kwargs = kwargs or {}
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        self._pages: _HostPages | None = None
        self._cache: kvtier.KvCache | None = None
        self._root: kvtier.BlockKey | None = None
        self.mem_pool_host = None

    # ------------------------------------------------------------------------------ setup

    def register_mem_pool_host(self, mem_pool_host) -> None:
        """Finds the layout from the pool's tensors and opens the cache. A pool it cannot use
        is refused here (ValueError naming the layout); a cache that cannot be opened is not
        (every call is then a miss)."""
        self.mem_pool_host = mem_pool_host
        self._pages = _HostPages(mem_pool_host)
        try:
            self._cache = backends.shared_cache(self._config, self._pages.layout)
            ns = self._cache.root(tenant=str(self._config.get("tenant", "")),
                                  lora_id=str(self._config.get("lora_id", "")))
            self._root = _hash_string(ns, self._salt)
        except kvtier.KvtierError as e:
            self._cache = None
            self._warn("open", f"kvtier: cannot open the cache ({e}); HiCache storage misses "
                               "every page")
            return
        if isinstance(self._cache, kvtier.Client) and \
                not self._cache.wait_connected(self._connect_wait_ms):
            self._warn("daemon", "kvtier: the daemon at "
                                 f"{self._config.get('socket') or kvtier.default_socket_path()} is "
                                 "not reachable; HiCache storage misses until it is "
                                 "(reconnecting in the background)")
        logger.info("kvtier HiCache backend: host pool %s (%s), %s, salt %r, backend %s",
                    list(mem_pool_host.kv_buffer.shape), self._pages.kind, self._pages.layout,
                    self._salt, self._config.get("backend", "inprocess"))

    def _warn(self, what: str, message: str) -> None:
        with self._warn_lock:
            if what in self._warned:
                return
            self._warned.add(what)
        logger.warning(message)

    def key_of(self, key: str) -> kvtier.BlockKey:
        """The kvtier key of SGLang's page key `key` on this rank."""
        if self._root is None:
            raise kvtier.Unavailable("kvtier HiCache backend: no host pool registered yet")
        return _hash_string(self._root, key)

    def _engine_hashes(self, keys: list[str], extra_info) -> list:
        """SGLang's page keys as the blocks' engine hashes, for kvtier's KV events (one hash per
        page, its parent the key before it); none when nothing publishes."""
        if not self._cache.wants_engine_hashes:
            return []
        prefix = getattr(extra_info, "prefix_keys", None)
        parent = _key_bytes(prefix[-1]) if prefix else b""
        out = []
        for k in keys:
            h = _key_bytes(k)
            out.append(kvtier.EngineBlockHashes([h], parent_hash=parent))
            parent = h
        return out

    @staticmethod
    def _first_block(extra_info) -> int:
        # The page's position in its sequence, when SGLang passes the ancestors' keys.
        prefix = getattr(extra_info, "prefix_keys", None)
        return len(prefix) if prefix else 0

    def _ready(self, op: str) -> bool:
        if self._cache is None or self._pages is None:
            if self._pages is None:
                self._warn("no-pool", f"kvtier HiCache backend: {op} before "
                                      "register_mem_pool_host; a miss")
            return False
        return True

    # ------------------------------------------------------------------ SGLang's v1 calls

    def batch_exists(self, keys: list[str], extra_info=None) -> int:
        """How many leading keys are stored (SGLang's convention)."""
        if not keys or not self._ready("batch_exists"):
            return 0
        try:
            with self._cache.lookup_keys([self.key_of(k) for k in keys]) as hit:
                return int(hit.hit_blocks)
        except kvtier.KvtierError as e:
            self._warn("exists", f"kvtier: lookup failed ({e}); a miss")
            return 0

    def batch_get_v1(self, keys: list[str], host_indices, extra_info=None) -> list[bool]:
        """Loads the pages of keys into the host pool at host_indices; True per page loaded.
        Only a leading run loads: a page after a missing one is reported missing."""
        n = len(keys)
        if n == 0 or not self._ready("batch_get_v1"):
            return [False] * n
        loaded = 0
        try:
            ids = self._pages.page_ids(host_indices, n)
            with self._cache.lookup_keys([self.key_of(k) for k in keys]) as hit:
                m = min(hit.hit_blocks, n)
                if m:
                    staging = torch.empty((m, *self._pages.pages.shape[1:]),
                                          dtype=self._pages.pages.dtype)
                    loaded = self._cache.load(hit, staging).loaded_blocks
                    if loaded:
                        self._pages.scatter(ids[:loaded], staging[:loaded])
        except (kvtier.KvtierError, ValueError) as e:
            self._warn("get", f"kvtier: load of {n} pages (first key {keys[0]}) failed ({e}); "
                              "misses")
        return [True] * loaded + [False] * (n - loaded)

    def batch_set_v1(self, keys: list[str], host_indices, extra_info=None) -> list[bool]:
        """Stores the host pool's pages at host_indices under keys; True per page stored (or
        already there)."""
        n = len(keys)
        if n == 0 or not self._ready("batch_set_v1"):
            return [False] * n
        try:
            staging = self._pages.gather(self._pages.page_ids(host_indices, n))
            r = self._cache.store_keys([self.key_of(k) for k in keys], staging,
                                       first_block=self._first_block(extra_info),
                                       engine_hashes=self._engine_hashes(keys, extra_info))
        except (kvtier.KvtierError, ValueError) as e:
            self._warn("set", f"kvtier: store of {n} pages (first key {keys[0]}) failed ({e})")
            return [False] * n
        if r.failed_blocks or r.stored_blocks + r.present_blocks < n:
            # Which pages failed is not reported: none counts as saved, SGLang retries later.
            self._warn("set-short", f"kvtier: {n - r.stored_blocks - r.present_blocks} of {n} "
                                    f"pages not stored ({r.first_error})")
            return [False] * n
        return [True] * n

    # --------------------------------------------------- SGLang's older per-key calls

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        self._warn("legacy", "kvtier HiCache backend: the flat-page calls (get/set/batch_get/"
                             "batch_set) are not supported; set interface_v1")
        return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        return [self.get(k) for k in keys]

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        self.get(key)
        return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        self.get(keys[0] if keys else "")
        return False

    def clear(self) -> None:
        return  # kvtier's tiers evict on their own; a shared daemon is not ours to wipe
