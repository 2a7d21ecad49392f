"""kvtier: tiered KV-cache offload (host DRAM, SSD, Redis) for LLM inference engines.

The C++ library, bound with nanobind. See doc/python.md.

    import kvtier, numpy as np
    layout = kvtier.KvLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="fp32",
                             block_tokens=64)
    cache = kvtier.open_cache(layout, tiers=[kvtier.host_tier("64MiB")], model_id="m")
    tokens = list(range(128))
    blocks = np.zeros((2, layout.bytes_per_block), np.uint8)
    cache.store(tokens, blocks)
    with cache.lookup(tokens) as hit:
        out = np.empty_like(blocks)
        cache.load(hit, out[: hit.hit_blocks])
"""

from kvtier._kvtier import (  # noqa: F401
    AsyncStore,
    BlockKey,
    Cache,
    CacheOptions,
    Client,
    Corruption,
    EngineBlockHashes,
    EventsOptions,
    Internal,
    InvalidArgument,
    KvCache,
    KvLayout,
    KvLayoutGroup,
    KvtierError,
    LoadResult,
    LookupResult,
    Namespace,
    NotFound,
    Plan,
    Planner,
    ResourceExhausted,
    StoreResult,
    TierSpec,
    Unavailable,
    checksum64,
    default_socket_path,
    fit_prefill,
    gather_pages,
    hash_prefix,
    layout_preset,
    layout_preset_names,
    load_pages,
    scatter_pages,
    stat_fields,
    state_keys,
)

__all__ = [
    "AsyncStore",
    "BlockKey",
    "Cache",
    "CacheOptions",
    "Client",
    "Corruption",
    "EngineBlockHashes",
    "EventsOptions",
    "Internal",
    "InvalidArgument",
    "KvCache",
    "KvLayout",
    "KvLayoutGroup",
    "KvtierError",
    "LoadResult",
    "LookupResult",
    "Namespace",
    "NotFound",
    "Plan",
    "Planner",
    "ResourceExhausted",
    "StoreResult",
    "TierSpec",
    "Unavailable",
    "checksum64",
    "default_socket_path",
    "disk_tier",
    "fit_prefill",
    "gather_pages",
    "hash_prefix",
    "host_tier",
    "layout_preset",
    "layout_preset_names",
    "open_cache",
    "parse_bytes",
    "load_pages",
    "scatter_pages",
    "stat_fields",
    "state_keys",
]

_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def parse_bytes(size) -> int:
    """An int, or "64MiB" / "2 GiB" / "1048576" -> bytes. InvalidArgument otherwise."""
    if isinstance(size, int):
        return size
    text = str(size).strip().lower().replace(" ", "")
    digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(digits):]
    if not digits or unit not in _UNITS:
        raise InvalidArgument(f"cannot parse '{size}' as a size (e.g. 64MiB, 2GiB)")
    return int(float(digits) * _UNITS[unit])


def _param_strings(params: dict) -> dict[str, str]:
    """A tier's params as the strings its config reads (True -> "true", 8 -> "8")."""
    return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in params.items()}


def host_tier(capacity, *, threads: int = 1, eviction: str = "lru", name: str = "",
              **params) -> TierSpec:
    """A host DRAM tier of `capacity` bytes (an int or "8GiB"); params as in doc/config.md
    (prefault, prefault_background, huge_pages, pin, warm_ahead)."""
    return TierSpec("host", parse_bytes(capacity), name=name, threads=threads, eviction=eviction,
                    params=_param_strings(params))


def disk_tier(path, capacity, *, name: str = "", **params) -> TierSpec:
    """An SSD tier in directory `path` (created when missing); params as in doc/config.md."""
    return TierSpec("disk", parse_bytes(capacity), name=name,
                    params={"path": str(path), **_param_strings(params)})


def open_cache(layout: KvLayout, tiers, *, model_id: str = "default", model_revision: str = "",
               tenant: str = "", lora_id: str = "", write_mode: str = "write-through",
               verify_checksums: bool = True, promote_on_load: bool = True,
               events: "EventsOptions | None" = None) -> Cache:
    """Opens an in-process Cache. Raises kvtier.InvalidArgument naming a wrong option.
    events: its KV-event publisher (kvtier.EventsOptions; doc/events.md); none by default."""
    options = CacheOptions(layout, list(tiers), model_id=model_id,
                           model_revision=model_revision, tenant=tenant, lora_id=lora_id,
                           write_mode=write_mode, verify_checksums=verify_checksums,
                           promote_on_load=promote_on_load)
    if events is not None:
        options.events = events
    return Cache.open(options)
