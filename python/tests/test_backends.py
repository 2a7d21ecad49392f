"""kvtier.backends: the factory engine integrations get their KvCache from."""

import time

import numpy as np
import pytest

import kvtier
from kvtier import backends

LAYOUT = kvtier.KvLayout(num_layers=2, num_kv_heads=2, head_dim=64, dtype="fp32",
                         block_tokens=16)


@pytest.fixture(autouse=True)
def fresh_registry():
    backends.close_all()
    yield
    backends.close_all()


def test_inprocess_caches_are_shared_per_config(tmp_path):
    cfg = {"host_capacity": "4MiB", "disk_path": str(tmp_path / "d"), "disk_capacity": "16MiB",
           "model_id": "m", "model_revision": "r1"}
    a = backends.shared_cache(dict(cfg), LAYOUT)
    b = backends.shared_cache(dict(cfg), LAYOUT)
    assert a is b  # both halves of a connector in one process meet here
    assert [t["kind"] for t in a.stats()["tiers"]] == ["host", "disk"]
    tokens = list(range(16))
    a.store(tokens, np.ones((1, LAYOUT.bytes_per_block), np.uint8))
    with b.lookup(tokens) as hit:
        assert hit.hit_blocks == 1
    other = backends.shared_cache({"host_capacity": "4MiB", "model_id": "m",
                                   "model_revision": "r2"}, LAYOUT)
    assert other is not a
    with other.lookup(tokens) as hit:
        assert hit.hit_blocks == 0  # another revision of the model never shares a block


def test_daemon_backend_without_a_daemon_is_a_miss_within_the_deadline(tmp_path):
    import time

    cache = backends.open_cache({"backend": "daemon", "socket": str(tmp_path / "none.sock"),
                                 "timeout_ms": 200}, LAYOUT)
    assert isinstance(cache, kvtier.Client)
    assert not cache.connected
    t0 = time.monotonic()
    with cache.lookup(list(range(4 * LAYOUT.block_tokens))) as hit:
        assert hit.hit_blocks == 0
    assert time.monotonic() - t0 < 5.0
    assert cache.client_stats()["missed_lookups"] >= 1


def test_bad_configs_name_the_key():
    with pytest.raises(kvtier.InvalidArgument, match="backend 'redis'"):
        backends.open_cache({"backend": "redis"}, LAYOUT)
    with pytest.raises(kvtier.InvalidArgument, match="no tier"):
        backends.open_cache({"host_capacity": 0}, LAYOUT)
    with pytest.raises(kvtier.InvalidArgument, match="8XB"):
        backends.open_cache({"host_capacity": "8XB"}, LAYOUT)
    with pytest.raises(kvtier.InvalidArgument, match="no_such_param"):
        backends.open_cache({"disk_path": "/tmp/x", "disk_no_such_param": 1}, LAYOUT)
    with pytest.raises(kvtier.InvalidArgument, match="events_colour"):
        backends.open_cache({"events_addr": "tcp://127.0.0.1:*", "events_colour": 1}, LAYOUT)
    with pytest.raises(kvtier.InvalidArgument, match="events_int_hashes: 'maybe'"):
        backends.open_cache({"events_addr": "tcp://127.0.0.1:*", "events_int_hashes": "maybe"},
                            LAYOUT)
    with pytest.raises(kvtier.InvalidArgument, match="endpoint"):
        backends.open_cache({"events_addr": "http://x"}, LAYOUT)


def test_host_params_reach_the_host_tier_and_it_is_not_prefaulted_by_default():
    # The store thread faults in the pages it fills; a prefault would compete with the engine.
    assert backends._tiers({"host_capacity": "4MiB"})[0].params == {"prefault": "false"}
    spec = backends._tiers({"host_capacity": "4MiB", "host_prefault": True,
                            "host_huge_pages": False, "host_warm_ahead": "0"})[0]
    assert spec.params == {"prefault": "true", "huge_pages": "false", "warm_ahead": "0"}
    # Asked for, warm_ahead faults in ahead of the stores (here the whole 4 MiB arena).
    c = backends.open_cache({"host_capacity": "4MiB", "host_warm_ahead": "8MiB"}, LAYOUT)
    deadline = time.monotonic() + 10
    warmed = 0
    while warmed < 4 << 20 and time.monotonic() < deadline:
        counters = c.stats()["tiers"][0]["counters"]
        warmed = counters.get("warmed_bytes", 0)
        time.sleep(0.005)
    assert warmed == 4 << 20, c.stats()["tiers"][0]
    c = backends.open_cache({"host_capacity": "4MiB", "host_prefault": True}, LAYOUT)
    assert c.stats()["tiers"][0]["capacity_bytes"] == 4 << 20
    with pytest.raises(kvtier.InvalidArgument, match="params.colour: unknown host tier param"):
        backends.open_cache({"host_capacity": "4MiB", "host_colour": 1}, LAYOUT)


def test_inprocess_events_keys_reach_the_publisher():
    cache = backends.open_cache({"host_capacity": "1MiB", "events_addr": "tcp://127.0.0.1:*",
                                 "events_topic": "kv@{model}", "events_int_hashes": "false",
                                 "model_id": "m"}, LAYOUT)
    info = cache.events_info()
    assert info["endpoint"].startswith("tcp://127.0.0.1:") and info["topic"] == "kv@m"
    assert cache.wants_engine_hashes
    assert backends.open_cache({"host_capacity": "1MiB"}, LAYOUT).events_info()["endpoint"] == ""


def test_yaml_configs_take_the_serve_event_keys_in_process():
    text = ("layout: {num_layers: 2, num_kv_heads: 2, head_dim: 64, dtype: fp32, "
            "block_tokens: 16}\n"
            "tiers: [{kind: host, capacity: 1MiB}]\n"
            "serve: {events_addr: 'tcp://127.0.0.1:*', events_topic: 'kv@{model}'}\n")
    cache = kvtier.Cache.open(kvtier.CacheOptions.from_yaml(text, "t.yaml"))
    assert cache.events_info()["topic"] == "kv@default"
    assert cache.wants_engine_hashes
    with pytest.raises(kvtier.InvalidArgument, match="t.yaml:3: serve.events_colour"):
        kvtier.CacheOptions.from_yaml(text.replace("events_topic", "events_colour"), "t.yaml")
