"""The stats dicts carry every field of the stats schema (src/obs/stats_schema.h):
kvtier.stat_fields() lists it, stats() has every cache field and every tier field in each tier,
Client.daemon_stats() adds the daemon's own."""

import numpy as np
import pytest

import kvtier
from daemon import Daemon

LAYOUT = kvtier.KvLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="fp32",
                         block_tokens=16)
LAYOUT_YAML = "{num_layers: 2, num_kv_heads: 2, head_dim: 64, dtype: fp32, block_tokens: 16}"


def names(scope):
    return [f["name"] for f in kvtier.stat_fields() if f["scope"] == scope]


def check_cache_keys(s):
    for name in names("cache"):
        assert name in s, name
    assert s["tiers"]
    for tier in s["tiers"]:
        for name in names("tier"):
            assert name in tier, (tier["name"], name)
        assert "count" in tier["get_latency_ns"] and "p99" in tier["put_latency_ns"]
    assert "p50" in s["lookup_latency_ns"]  # the histograms, summarised


def test_the_schema_lists_every_scope_with_its_metric():
    fields = kvtier.stat_fields()
    assert {f["scope"] for f in fields} == {"cache", "tier", "serve"}
    for f in fields:
        assert f["metric"].startswith("kvtier_") and f["help"] and f["unit"]
        assert f["kind"] in ("counter", "gauge")
    assert "write_through_dropped_blocks" in names("cache")
    assert "write_failures" in names("tier")


def test_every_schema_field_is_a_key_of_stats(tmp_path):
    cache = kvtier.open_cache(LAYOUT, [kvtier.host_tier("4MiB"),
                                       kvtier.disk_tier(tmp_path / "disk", "16MiB")])
    tokens = list(range(2 * 16))
    cache.store(tokens, np.ones((2, LAYOUT.bytes_per_block), np.uint8))
    s = cache.stats()
    check_cache_keys(s)
    assert s["stored_blocks"] == 2
    assert "degraded" in s["tiers"][1]["counters"]  # the disk tier's own gauge


def test_every_schema_field_reaches_a_daemons_client(tmp_path):
    d = Daemon(tmp_path, LAYOUT_YAML, disk_dir=str(tmp_path / "ssd")).start()
    try:
        c = kvtier.Client.connect(LAYOUT, socket=d.socket, model_id="m")
        assert c.wait_connected(5000)
        c.store(list(range(16)), np.ones((1, LAYOUT.bytes_per_block), np.uint8))
        check_cache_keys(c.stats())
        s = c.daemon_stats()
        check_cache_keys(s)
        for name in names("serve"):
            assert name in s, name
        assert s["clients"] >= 1 and s["stored_blocks"] >= 1
        assert "degraded" in s["tiers"][1]["counters"]  # crossed the wire by name
    finally:
        d.kill()
