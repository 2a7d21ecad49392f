"""Where an engine integration gets its KvCache: one factory, two backends.

    cache = kvtier.backends.shared_cache(config, layout)

- backend "inprocess": a Cache opened in this process from the config's tiers. Every caller in
  the process that passes an equal config and layout gets the same Cache (a module-level
  registry), so the two halves of a vLLM connector that live in one EngineCore process share it.
- backend "daemon": the node's `kvtier serve` through the C++ Client (every process of the
  engine talks to the same daemon; a dead daemon is a miss within timeout_ms, never a hang).

Config keys (a dict, e.g. vLLM's kv_connector_extra_config) are listed in doc/python.md.
Thread-safety: shared_cache may be called from any thread.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any

import kvtier

BACKENDS = ("inprocess", "daemon")

_lock = threading.Lock()
_registry: dict[str, kvtier.KvCache] = {}


def model_fingerprint(model: str, revision: str | None = None) -> str:
    """What tells two checkpoints served under one name apart: for a local folder, a hash of
    config.json and the weight files' names and sizes; otherwise the name and revision."""
    h = hashlib.sha256()
    if os.path.isdir(model):
        cfg = os.path.join(model, "config.json")
        if os.path.exists(cfg):
            with open(cfg, "rb") as f:
                h.update(f.read())
        for name in sorted(os.listdir(model)):
            if name.endswith((".safetensors", ".bin", ".pt", ".gguf")):
                h.update(f"{name}:{os.path.getsize(os.path.join(model, name))}\n".encode())
    else:
        h.update(f"{model}@{revision or ''}".encode())
    return "sha256:" + h.hexdigest()[:32]


def _registry_key(config: dict[str, Any], layout: kvtier.KvLayout) -> str:
    return json.dumps({"config": config, "layout": repr(layout)}, sort_keys=True, default=str)


def _tier_params(config: dict[str, Any], kind: str, own: tuple[str, ...]) -> dict[str, Any]:
    """The `<kind>_<param>` keys of config as a tier's params, but for the connector's own
    `<kind>_<key>` keys (own)."""
    prefix = kind + "_"
    return {k[len(prefix):]: v for k, v in config.items()
            if k.startswith(prefix) and k[len(prefix):] not in own}


def _tiers(config: dict[str, Any]) -> list[kvtier.TierSpec]:
    tiers = []
    host = config.get("host_capacity", "1GiB")
    if host and kvtier.parse_bytes(host) > 0:
        # host_<param>: the host tier's params (doc/config.md). Not prefaulted by default: a
        # prefault at start competes with the engine's first steps; the store thread faults in
        # the pages it fills. (warm_ahead, faulting ahead of the stores on an idle thread, made
        # the stores 6-10x faster but resumed turns slower in a comparison run: doc/vllm.md.)
        params = {"prefault": "false", **_tier_params(config, "host", ("capacity", "threads"))}
        tiers.append(kvtier.host_tier(host, threads=int(config.get("host_threads", 1)),
                                      **params))
    if config.get("disk_path"):
        tiers.append(kvtier.disk_tier(config["disk_path"], config.get("disk_capacity", "8GiB"),
                                      **_tier_params(config, "disk", ("path", "capacity"))))
    if config.get("remote_url"):
        # remote_url: redis://host:port; remote_<param>: the remote tier's params (doc/config.md).
        tiers.append(kvtier.TierSpec("remote", kvtier.parse_bytes(
            config.get("remote_capacity", "16GiB")), params=kvtier._param_strings(
                _tier_params(config, "remote", ("capacity",)))))
    if not tiers:
        raise kvtier.InvalidArgument("kvtier config: no tier (set host_capacity, disk_path or "
                                     "remote_url)")
    return tiers


# events_<key>: the in-process cache's KV-event publisher (kvtier.EventsOptions; the same words
# as kvtier serve's serve.events_* keys, doc/config.md). events_addr turns it on.
_EVENT_KEYS = {
    "events_addr": ("endpoint", str),
    "events_socket": ("socket", str),
    "events_topic": ("topic", str),
    "events_keys_topic_suffix": ("keys_topic_suffix", str),
    "events_topic_host": ("topic_host", str),
    "events_topic_port": ("topic_port", str),
    "events_replay_addr": ("replay_endpoint", str),
    "events_replay_batches": ("replay_batches", int),
    "events_batch_events": ("max_batch_events", int),
    "events_batch_ms": ("batch_interval_ms", int),
    "events_queue_events": ("queue_events", int),
    "events_dp_rank": ("data_parallel_rank", int),
    "events_int_hashes": ("int_hashes", "bool"),
    "events_engine_hash_blocks": ("engine_hash_blocks", int),
}


def _events(config: dict[str, Any],
            tiers: list[kvtier.TierSpec]) -> "kvtier.EventsOptions | None":
    if not config.get("events_addr"):
        return None
    e = kvtier.EventsOptions()
    for key, value in config.items():
        if not key.startswith("events_"):
            continue
        if key == "events_media":  # tier name (host, disk, remote) -> medium
            order = [t.name or t.kind for t in tiers]
            e.media = [str(value.get(name, "")) for name in order]
            continue
        if key not in _EVENT_KEYS:
            raise kvtier.InvalidArgument(f"kvtier config: unknown key '{key}' (events keys: "
                                         f"{', '.join(sorted(_EVENT_KEYS))}, events_media)")
        field, kind = _EVENT_KEYS[key]
        if kind == "bool":
            if str(value).lower() not in ("true", "false", "1", "0"):
                raise kvtier.InvalidArgument(f"kvtier config: {key}: {value!r} is not true or "
                                             "false")
            value, kind = str(value).lower() in ("true", "1"), bool
        try:
            setattr(e, field, kind(value))
        except (TypeError, ValueError) as err:
            raise kvtier.InvalidArgument(f"kvtier config: {key}: {err}") from None
    return e


def _open_inprocess(config: dict[str, Any], layout: kvtier.KvLayout) -> kvtier.KvCache:
    tiers = _tiers(config)
    return kvtier.open_cache(
        layout, tiers,
        model_id=str(config.get("model_id", "default")),
        model_revision=str(config.get("model_revision", "")),
        tenant=str(config.get("tenant", "")),
        lora_id=str(config.get("lora_id", "")),
        write_mode=str(config.get("write_mode", "write-through")),
        verify_checksums=bool(config.get("verify_checksums", True)),
        events=_events(config, tiers))


def _open_daemon(config: dict[str, Any], layout: kvtier.KvLayout) -> kvtier.KvCache:
    # A daemon that is not running is no error: the client starts disconnected, every call is a
    # miss within timeout_ms, and it reconnects in the background.
    return kvtier.Client.connect(
        layout,
        socket=str(config.get("socket", "")),
        model_id=str(config.get("model_id", "default")),
        model_revision=str(config.get("model_revision", "")),
        tenant=str(config.get("tenant", "")),
        lora_id=str(config.get("lora_id", "")),
        token=str(config.get("token", "")),
        timeout_ms=int(config.get("timeout_ms", 1000)))


def open_cache(config: dict[str, Any], layout: kvtier.KvLayout) -> kvtier.KvCache:
    """A new KvCache for config. Raises kvtier.InvalidArgument for a bad key, or the backend's
    error (Unavailable when the daemon cannot be reached)."""
    backend = config.get("backend", "inprocess")
    if backend == "inprocess":
        return _open_inprocess(config, layout)
    if backend == "daemon":
        return _open_daemon(config, layout)
    raise kvtier.InvalidArgument(f"kvtier config: backend '{backend}' is not one of {BACKENDS}")


def shared_cache(config: dict[str, Any], layout: kvtier.KvLayout) -> kvtier.KvCache:
    """The process's KvCache for (config, layout), opened on first use."""
    key = _registry_key(config, layout)
    with _lock:
        cache = _registry.get(key)
        if cache is None:
            cache = open_cache(config, layout)
            _registry[key] = cache
        return cache


def close_all() -> None:
    """Drops every shared cache (tests; a process exit does the same)."""
    with _lock:
        _registry.clear()
