"""The connector's load-vs-recompute model (kvtier.integrations.planning), without vLLM."""

import json

import pytest

import kvtier
from kvtier.integrations.planning import CostModel, Decision, _fit_line, whole_or_none

BT, BB = 128, 1 << 19
TIERS = [("host", "host"), ("remote", "remote")]


def model(mode="auto", **kw):
    return CostModel(mode, block_tokens=BT, block_bytes=BB, tiers=TIERS, **kw)


def learn_prefill(m, per_token=20e-6, per_pair=3e-8, fixed=2e-3):
    for tokens, ctx in [(300, 0), (700, 0), (1200, 0), (2000, 0), (128, 1000), (1, 500),
                        (1, 2000), (3000, 0), (1, 3000)]:
        pairs = tokens * ctx + tokens * tokens / 2
        m.add_step(tokens, pairs, fixed + per_token * tokens + per_pair * pairs)


def learn_remote(m, latency=0.045, bw=110e6):
    for blocks in (4, 12, 20, 31):
        m.add_load("remote", blocks, blocks * BB, latency + blocks * BB / bw)


def test_fit_line_recovers_latency_and_bandwidth():
    samples = [(b, 0.01 + b / 1e8) for b in (1e6, 4e6, 9e6)]
    lat, bw = _fit_line(samples)
    assert lat == pytest.approx(0.01) and bw == pytest.approx(1e8)
    assert _fit_line([(1e6, 0.02), (1e6, 0.03)]) is None  # one size: no slope


def test_fixed_modes_and_learning_before_judging():
    assert model("always-load").decide(4001, 0, ["remote"] * 31).load_blocks == 31
    assert model("never-load").decide(4001, 0, ["remote"] * 31).load_blocks == 0
    m = model()
    d = m.decide(4001, 0, ["remote"] * 31)
    assert (d.choice, d.load_blocks) == ("explore", 31)  # never timed: load to learn it
    learn_remote(m)
    assert m.decide(4001, 0, ["remote"] * 31).choice == "uncalibrated"  # no prefill rate yet
    with pytest.raises(ValueError, match="planner"):
        model("sometimes")


def test_learned_model_picks_the_cheaper_side_and_agrees_with_the_crossover():
    m = model()
    learn_prefill(m)
    learn_remote(m)
    x = m.crossovers()["remote"]
    assert 1000 < x < 4000, x
    short = m.decide(513, 0, ["remote"] * 4)
    long = m.decide(4001, 0, ["remote"] * 31)
    assert short.choice == "recompute" and short.load_blocks == 0, short
    assert long.choice == "load" and long.load_blocks == 31, long
    assert long.predicted_s < long.recompute_all_s
    # The crossover is the learned profile's, priced by the library's Planner.
    p = kvtier.Planner(m.profile_json())
    assert p.crossover_tokens(p.tier_index("remote"), 1 << 20) == x
    assert m.prefill_source == "learned"


def test_a_host_head_loads_and_a_slow_tail_is_computed():
    m = model()
    learn_prefill(m)
    learn_remote(m)
    for n in (4, 12):
        m.add_load("host", n, n * BB, 20e-6 + n * BB / 8e9)
    d = m.decide(12 * 128 + 4 * 128 + 1, 0, ["host"] * 12 + ["remote"] * 4)
    assert (d.choice, d.load_blocks) == ("split", 12), d


def test_cost_profile_file_starts_the_model_and_a_bad_one_is_refused(tmp_path):
    m = model()
    learn_prefill(m)
    learn_remote(m)
    good = tmp_path / "profile.json"
    good.write_text(m.profile_json())
    started = model(profile_path=str(good))
    assert started.prefill_source == "file"
    assert started.decide(4001, 0, ["remote"] * 31).choice == "load"  # no exploring, no wait
    other = json.loads(m.profile_json())
    other["block_bytes"] = BB * 2
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps(other))
    with pytest.raises(ValueError, match="other.json.*block_bytes"):
        model(profile_path=str(bad))
    broken = tmp_path / "broken.json"
    broken.write_text("{}")
    with pytest.raises(kvtier.InvalidArgument, match="broken.json"):
        model(profile_path=str(broken))


def test_a_hit_without_state_inside_loads_whole_or_not_at_all():
    # A split (load 3 of 8, compute the rest) has no state at block 3 to resume from.
    cheap_load = Decision(3, "split", 1.0, load_all_s=1.5, recompute_all_s=2.0)
    assert whole_or_none(cheap_load, 8) == Decision(8, "load", 1.5, 1.5, 2.0)
    cheap_compute = Decision(3, "split", 1.0, load_all_s=2.5, recompute_all_s=2.0)
    assert whole_or_none(cheap_compute, 8) == Decision(0, "recompute", 2.0, 2.5, 2.0)
    for d in (Decision(8, "load"), Decision(0, "recompute")):
        assert whole_or_none(d, 8) is d
