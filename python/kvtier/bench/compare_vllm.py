"""kvtier side by side with the peers inside vLLM (issue 33): one workload, every configuration in
the same run, each run in a fresh process, in interleaved rounds (A B C ..., then C B A, ...).

    python -m kvtier.bench.compare_vllm --out DIR [--rounds 3] [--configs a,b,...] [--model-preset
        compare|test] [--smoke]
    python -m kvtier.bench.compare_vllm plot DIR   (redraws DIR/compare.svg from compare.json)
    (scripts/compare-vllm sets up the environments and runs this)

Configurations (CONFIGS): baseline (vLLM's prefix cache only, its KV cache smaller than the live
sessions), bound (the same with a KV cache that holds everything: no transfer at all),
vllm-offloading (vLLM's OffloadingConnector, CPU backend), lmcache (LMCacheConnectorV1 in
process, local CPU), lmcache-mp (LMCache's server and LMCacheMPConnector), kvtier (in process,
host tier), kvtier-serve (through `kvtier serve`, host tier) and kvtier-serve-ssd (a small host
tier over an SSD tier). Same block size, tier bytes and vLLM settings for all; printed with the
results. A configuration that cannot start, or starts but cannot offload (vLLM's CPU build), is
tried once and recorded with its reason as skipped.

Writes DIR/compare.json ({"configs": {NAME: {"error", "tokens_equal", "first_turn_ttft_s",
"resumed_ttft_s": {BUCKET: {"p50", "p99", "min_prefix_tokens", ...}}, ...}}, "settings", ...}),
DIR/compare.svg (TTFT against reused-prefix length, p50 solid, p99 dashed), DIR/runs/ (each
run's raw result and log), and prints the table.
"""

import argparse
import json
import math
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from kvtier.bench import compare_workloads
from kvtier.bench.serve_daemon import ServeDaemon, find_kvtier_bin, wait_rusage

CONFIGS = ["baseline", "bound", "vllm-offloading", "lmcache", "lmcache-mp", "kvtier",
           "kvtier-serve", "kvtier-serve-ssd"]
# Reused-prefix buckets (tokens): name, lower bound.
BUCKETS = [("<512", 0), ("512-1K", 512), ("1K-2K", 1024), ("2K-4K", 2048), (">=4K", 4096)]
HOST_BYTES = 1 << 30  # every offload configuration's CPU tier
SSD_HOST_BYTES = 64 << 20  # kvtier-serve-ssd: a host tier smaller than the workload, over
SSD_BYTES = 1 << 30  # an SSD tier
# vLLM's context, and so the KV cache of every configuration but bound (num_gpu_blocks_override:
# this many tokens plus 4 blocks): one longest prompt fits, the live sessions do not.
MAX_MODEL_LEN = {"compare": 6144, "test": 4096}
BOUND_BLOCKS = 4096  # 131K tokens: every session of every workload stays in vLLM's cache
CHILD_TIMEOUT_S = 900
PROBE_TIMEOUT_S = 300
LMCACHE_CANNOT_OFFLOAD = "No supported cpu connector found"


# ----------------------------------------------------------------------------------------------
# The child: one configuration's run, in a fresh process.

def _ttft(r):
    return getattr(r.metrics, "first_token_latency", None) if r.metrics is not None else None


def _prompt_tokens_by_source(llm):
    """vLLM's prompt tokens so far by source: computed, from its own cache, from the connector."""
    out = {"computed": 0.0, "vllm_cache": 0.0, "external": 0.0}
    names = {"local_compute": "computed", "local_cache_hit": "vllm_cache",
             "external_kv_transfer": "external"}
    for m in llm.get_metrics():
        if m.name == "vllm:prompt_tokens_by_source" and hasattr(m, "value"):
            key = names.get((getattr(m, "labels", None) or {}).get("source"))
            if key:
                out[key] += m.value
    return out


def _run_workloads(llm, w, names, filler_tokens):
    from kvtier.bench.vllm_offline import generate, tokens

    records, per = [], {}

    def one(workload, session, turn, ctx, new, max_tokens):
        prompt = ctx + new
        r = generate(llm, [prompt], max_tokens)[0]
        out = list(r.outputs[0].token_ids)
        records.append({"workload": workload, "session": session, "turn": turn,
                        "prompt_tokens": len(prompt), "prefix_tokens": len(ctx),
                        "ttft_s": _ttft(r), "cached_tokens": r.num_cached_tokens, "out": out})
        return prompt + out

    for name in names:
        src0 = _prompt_tokens_by_source(llm)
        n0 = len(records)
        t0 = time.perf_counter()
        if name == "conversation":
            conv = w["conversation"]
            ctx = {}
            for i, k in conv["order"]:
                turn = conv["sessions"][i]["turns"][k]
                ctx[i] = one(name, i, k, ctx.get(i, []), tokens(10_000 + 100 * i + k,
                                                                turn["new_tokens"]),
                             turn["max_tokens"])
        elif name == "short":
            s = w["short"]
            ctx = [one(name, j, 0, [], tokens(20_000 + j, s["first_tokens"]), s["max_tokens"])
                   for j in range(s["sessions"])]
            # Other traffic: one prompt as long as vLLM's context evicts the short prompts from
            # its KV cache (not from bound's), so only an offload tier can serve them again.
            # (vLLM's reset_prefix_cache is no substitute: it refuses while a connector's
            # asynchronous save holds the last request's blocks, LMCache's every time.)
            generate(llm, [tokens(50_000, filler_tokens)], 1)
            for j in range(s["sessions"]):
                one(name, j, 1, ctx[j], tokens(21_000 + j, s["new_tokens"]), s["max_tokens"])
        elif name == "no_reuse":
            nr = w["no_reuse"]
            for j, n in enumerate(nr["lengths"]):
                one(name, j, 0, [], tokens(30_000 + j, n), nr["max_tokens"])
        wall = time.perf_counter() - t0
        src1 = _prompt_tokens_by_source(llm)
        out_tokens = sum(len(r["out"]) for r in records[n0:])
        per[name] = {"wall_s": round(wall, 3), "output_tokens": out_tokens,
                     "output_tokens_per_s": round(out_tokens / wall, 2) if wall > 0 else None,
                     "prompt_tokens": {k: int(src1[k] - src0[k]) for k in src1}}
    return records, per


def child_main(spec_path):
    from kvtier.bench.vllm_offline import configure_env

    with open(spec_path) as f:
        spec = json.load(f)
    for k, v in spec.get("env", {}).items():
        os.environ[k] = v
    configure_env()
    import resource

    try:
        from kvtier.bench.vllm_offline import generate, make_llm, tokens

        llm, start_s = make_llm(spec)
    except Exception as e:  # the reason it did not start, for the parent's record
        print("COMPARE_ERROR " + json.dumps({"error": f"{type(e).__name__}: {e}"[:2000]}),
              flush=True)
        raise
    with open(spec["workloads_path"]) as f:
        w = json.load(f)
    generate(llm, [tokens(999_999, 256)], 4)  # warm-up: kernels, allocator
    records, per = _run_workloads(llm, w, spec["workloads"], spec["filler_tokens"])
    ru = resource.getrusage(resource.RUSAGE_SELF)
    doc = {"pid": os.getpid(), "start_s": start_s, "records": records, "workloads": per,
           "cpu_s": round(ru.ru_utime + ru.ru_stime, 2),
           "peak_rss_mib": round(ru.ru_maxrss / 1024, 1)}
    hooks = sys.modules.get("kvtier.integrations.vllm")
    if hooks is not None:
        hooks.wait_saves(30.0)
        doc["kvtier_connector"] = hooks.connector_counters()
    print("COMPARE_RESULT " + json.dumps(doc), flush=True)
    # vLLM's and LMCache's threads can keep an interpreter alive at exit: the result is out.
    sys.stdout.flush()
    os._exit(0)


# ----------------------------------------------------------------------------------------------
# The parent: environments, rounds, aggregation, the table and the picture.

def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port, proc, timeout_s):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.2)
    return False


def _last_error(log):
    """The line of a log that says why a run failed: the last exception line, else its tail."""
    lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln):
            return ln[:500]
    return (lines[-1] if lines else "no output")[:500]


class Harness:
    def __init__(self, args):
        self.args = args
        self.out = os.path.abspath(args.out)
        self.runs_dir = os.path.join(self.out, "runs")
        os.makedirs(self.runs_dir, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix="kvtier-compare-")
        self.python = args.python or sys.executable
        self.lmcache_python = args.lmcache_python
        self.kvtier_bin = args.kvtier_bin or find_kvtier_bin(os.getcwd())
        self.gpu = self._has_gpu()

    def _has_gpu(self):
        p = subprocess.run([self.python, "-c", "import torch; print(torch.cuda.is_available())"],
                           capture_output=True, text=True)
        return p.stdout.strip() == "True"

    def prepare(self):
        a = self.args
        self.model = a.model or os.path.join(self.work, f"model-{a.model_preset}")
        if not a.model:
            p = subprocess.run([self.python, "-c",
                                "import sys; from kvtier.bench.vllm_offline import make_model; "
                                "make_model(sys.argv[1], sys.argv[2])", self.model,
                                a.model_preset], capture_output=True, text=True)
            if p.returncode != 0:
                raise SystemExit(f"compare-vllm: cannot make the model:\n{p.stderr[-3000:]}")
        from kvtier.bench.vllm_offline import BLOCK_SIZE, KVTIER_BLOCK, layout_yaml, model_layout

        self.layout = model_layout(self.model)
        self.layout_yaml = layout_yaml(self.layout)
        w = compare_workloads.build(a.traces, turns=a.turns, sessions=not a.smoke,
                                    short_sessions=4 if a.smoke else 8,
                                    no_reuse=3 if a.smoke else 6)
        self.workloads = w
        self.workloads_path = os.path.join(self.out, "workloads.json")
        with open(self.workloads_path, "w") as f:
            json.dump(w, f)
        self.workload_names = (["short", "no_reuse"] if a.smoke
                               else ["conversation", "short", "no_reuse"])
        max_len = MAX_MODEL_LEN[a.model_preset]
        self.settings = {
            "vllm": {"block_size": BLOCK_SIZE, "max_model_len": max_len, "max_num_seqs": 8,
                     "dtype": "float32", "enforce_eager": True, "enable_prefix_caching": True,
                     "distributed_executor_backend": "uni",
                     "num_gpu_blocks_override": max_len // BLOCK_SIZE + 4,
                     "bound_num_gpu_blocks_override": BOUND_BLOCKS,
                     "env": {k: os.environ.get(k) for k in ("VLLM_CPU_KVCACHE_SPACE",
                                                            "VLLM_CPU_OMP_THREADS_BIND",
                                                            "THP_MEM_ALLOC_ENABLE")}},
            "offload_block_tokens": KVTIER_BLOCK, "host_bytes": HOST_BYTES,
            "ssd_row": {"host_bytes": SSD_HOST_BYTES, "ssd_bytes": SSD_BYTES},
            "model": {"preset": a.model_preset, "layout": self.layout,
                      "kv_bytes_per_token": self.layout["num_layers"] * 2 *
                      self.layout["num_kv_heads"] * self.layout["head_dim"] * 4},
            "workloads": {"names": self.workload_names,
                          "sessions": compare_workloads.summary(w),
                          "short": w["short"], "no_reuse": w["no_reuse"]},
            "rounds": a.rounds, "configs": self.configs(),
            "device": "cuda" if self.gpu else "cpu",
        }

    def configs(self):
        return [c for c in self.args.configs.split(",") if c]

    # One run -----------------------------------------------------------------------------

    def run_one(self, name, rnd, probe=False):
        """Runs configuration `name` once (round rnd) in a fresh process; returns its result,
        or {"error": ...}."""
        from kvtier.bench.vllm_offline import BLOCK_SIZE, KVTIER_BLOCK

        tag = f"r{rnd}-{name}"
        d = os.path.join(self.work, tag)
        os.makedirs(d, exist_ok=True)
        s = self.settings["vllm"]
        spec = {"model": self.model, "prefix_caching": True, "max_model_len": s["max_model_len"],
                "num_gpu_blocks_override": s["num_gpu_blocks_override"],
                "workloads_path": self.workloads_path,
                "workloads": ["short"] if probe else self.workload_names,
                "filler_tokens": s["max_model_len"] - 2 * BLOCK_SIZE, "env": {}}
        python = self.python
        daemon = server = None
        stats_path = os.path.join(d, "stats")
        if name == "bound":
            spec["num_gpu_blocks_override"] = BOUND_BLOCKS
        elif name == "vllm-offloading":
            spec["kv_transfer_config"] = {
                "kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"cpu_bytes_to_use": HOST_BYTES,
                                              "block_size": KVTIER_BLOCK}}
        elif name in ("lmcache", "lmcache-mp"):
            if not self.lmcache_python or not os.access(self.lmcache_python, os.X_OK):
                return {"error": "no LMCache environment (scripts/compare-vllm makes "
                                 ".venv-lmcache; --lmcache-python names one)"}
            python = self.lmcache_python
            if name == "lmcache":
                spec["env"] = {"LMCACHE_CHUNK_SIZE": str(KVTIER_BLOCK), "LMCACHE_LOCAL_CPU": "True",
                               "LMCACHE_MAX_LOCAL_CPU_SIZE": str(HOST_BYTES / 2**30),
                               "LMCACHE_USE_EXPERIMENTAL": "True"}
                spec["kv_transfer_config"] = {"kv_connector": "LMCacheConnectorV1",
                                              "kv_role": "kv_both"}
            else:
                port = _free_port()
                cmd = [python, "-m", "lmcache.v1.multiprocess.server", "--host", "localhost",
                       "--port", str(port), "--chunk-size", str(KVTIER_BLOCK),
                       "--l1-size-gb", str(HOST_BYTES / 2**30), "--eviction-policy", "LRU",
                       "--disable-metrics",
                       "--supported-transfer-mode", "engine_driven",
                       "--shm-name", f"kvtier-compare-{os.getpid()}-{rnd}"]
                server_log = open(os.path.join(self.runs_dir, tag + ".server.log"), "w")
                server = subprocess.Popen(cmd, stdout=server_log, stderr=subprocess.STDOUT,
                                          cwd=d, start_new_session=True)
                if not _wait_port(port, server, 180):
                    server.kill()
                    wait_rusage(server, 30)
                    with open(server_log.name) as f:
                        return {"error": "LMCache server did not start: " + _last_error(f.read())}
                spec["kv_transfer_config"] = {
                    "kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                    "kv_connector_extra_config": {"lmcache.mp.host": "tcp://localhost",
                                                  "lmcache.mp.port": port}}
        elif name == "kvtier":
            spec["kvtier"] = {"host_capacity": str(HOST_BYTES), "stats_path": stats_path}
        elif name in ("kvtier-serve", "kvtier-serve-ssd"):
            if not self.kvtier_bin:
                return {"error": "no kvtier binary for `kvtier serve` (KVTIER_BIN, or build "
                                 "kvtier-cli)"}
            tiers = [f"{{kind: host, capacity: {HOST_BYTES}}}"]
            if name == "kvtier-serve-ssd":
                tiers = [f"{{kind: host, capacity: {SSD_HOST_BYTES}}}",
                         f"{{kind: disk, capacity: {SSD_BYTES}, params: {{path: {d}/ssd}}}}"]
            daemon = ServeDaemon(self.kvtier_bin, d, self.layout_yaml, tiers)
            try:
                daemon.start()
            except RuntimeError as e:
                return {"error": str(e)[:2000]}
            spec["kvtier"] = {"backend": "daemon", "socket": daemon.socket, "timeout_ms": 5000,
                              "stats_path": stats_path}
        elif name != "baseline":
            return {"error": f"unknown configuration {name}"}
        spec_path = os.path.join(d, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        log_path = os.path.join(self.runs_dir, tag + ".log")
        t0 = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen([python, "-m", "kvtier.bench.compare_vllm", "child",
                                     spec_path], stdout=subprocess.PIPE, stderr=log, text=True,
                                    cwd=d, start_new_session=True)
            try:
                stdout, _ = proc.communicate(timeout=PROBE_TIMEOUT_S if probe
                                             else CHILD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, _ = proc.communicate()
                stdout += "\nCOMPARE_TIMEOUT"
            log.write(stdout)
        elapsed = time.perf_counter() - t0
        result = None
        for line in stdout.splitlines():
            if line.startswith("COMPARE_RESULT "):
                result = json.loads(line[len("COMPARE_RESULT "):])
            elif line.startswith("COMPARE_ERROR ") and result is None:
                result = json.loads(line[len("COMPARE_ERROR "):])
        with open(log_path) as f:
            log_text = f.read()
        if result is None:
            why = ("timed out" if "COMPARE_TIMEOUT" in stdout
                   else f"exited {proc.returncode}")
            result = {"error": f"{why}: {_last_error(log_text)}"}
        if daemon is not None:
            daemon.stop()
            result["daemon"] = daemon.usage
        if server is not None:
            server.send_signal(signal.SIGTERM)
            result["daemon"] = wait_rusage(server, 30)
        if name in ("kvtier", "kvtier-serve", "kvtier-serve-ssd"):
            for role in ("worker", "scheduler"):
                try:
                    with open(f"{stats_path}.{role}.json") as f:
                        result.setdefault("kvtier_stats", {})[role] = json.load(f)
                except (OSError, ValueError):
                    pass
        if name.startswith("kvtier") and "error" not in result:
            # The connector runs on when it cannot reach its cache (every request recomputed):
            # that is no kvtier figure.
            said = [ln for ln in log_text.splitlines()
                    if "kvtier: cannot open the cache" in ln or "is not reachable" in ln]
            if said:
                result = {"error": said[0][said[0].find("kvtier:"):][:500]}
        if name == "lmcache" and "error" not in result and not self.gpu:
            ext = sum(v["prompt_tokens"]["external"] for v in result["workloads"].values())
            if LMCACHE_CANNOT_OFFLOAD in log_text or ext == 0:
                said = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip()
                        for ln in log_text.splitlines()
                        if LMCACHE_CANNOT_OFFLOAD in ln or "degraded" in ln][:2]
                result = {"error": f"starts but cannot offload on vLLM's CPU build: {ext:.0f} "
                                   f"external hit tokens; its log: " + " | ".join(said)}
        result["elapsed_s"] = round(elapsed, 2)
        result["connector"] = spec.get("kvtier") or spec.get("kv_transfer_config")
        result["env"] = spec["env"]
        with open(os.path.join(self.runs_dir, tag + ".json"), "w") as f:
            json.dump(result, f)
        return result

    # Rounds ------------------------------------------------------------------------------

    def run(self):
        configs = self.configs()
        results = {c: [] for c in configs}
        errors = {}
        # Tried once, first: the configurations vLLM's CPU build cannot run (on a GPU they run
        # in the rounds like the others).
        if not self.gpu:
            for c in ("vllm-offloading", "lmcache"):
                if c in configs:
                    r = self.run_one(c, 0, probe=True)
                    errors[c] = r.get("error") or "probe ran; not compared on this device"
                    print(f"compare-vllm: {c}: skipped: {errors[c]}", flush=True)
        active = [c for c in configs if c not in errors]
        t_start = time.perf_counter()
        for rnd in range(self.args.rounds):
            order = active if rnd % 2 == 0 else list(reversed(active))
            for c in order:
                if c in errors:
                    continue
                r = self.run_one(c, rnd)
                if "error" in r and r["error"]:
                    errors[c] = r["error"]
                    print(f"compare-vllm: round {rnd} {c}: {r['error'][:300]}", flush=True)
                    continue
                results[c].append(r)
                print(f"compare-vllm: round {rnd} {c}: {r['elapsed_s']} s", flush=True)
        self.total_s = round(time.perf_counter() - t_start, 1)
        return results, errors

    def cleanup(self):
        shutil.rmtree(self.work, ignore_errors=True)


# ----------------------------------------------------------------------------------------------
# Aggregation.

def _pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (k - lo), 5)


def _bucket(prefix):
    name = BUCKETS[0][0]
    for b, lo in BUCKETS:
        if prefix >= lo:
            name = b
    return name


def _resumed(records):
    return [r for r in records if r["prefix_tokens"] > 0]


def _first(records):
    return [r for r in records if r["prefix_tokens"] == 0]


def _key(r):
    return (r["workload"], r["session"], r["turn"])


def _round_p50s(runs, select):
    return [_pct([r["ttft_s"] for r in run["records"] if select(r)], 0.5) for run in runs]


def _paired(runs, ref_runs, select):
    """Median over rounds of (this run's p50 / the reference's p50 in the same round)."""
    ratios = []
    for a, b in zip(runs, ref_runs):
        pa = _pct([r["ttft_s"] for r in a["records"] if select(r)], 0.5)
        pb = _pct([r["ttft_s"] for r in b["records"] if select(r)], 0.5)
        if pa and pb:
            ratios.append(pa / pb)
    return (round(statistics.median(ratios), 4), [round(x, 4) for x in ratios]) if ratios \
        else (None, [])


def aggregate(results, errors, configs):
    base = results.get("baseline") or []
    bound = results.get("bound") or []
    base_out = {_key(r): r["out"] for r in base[0]["records"]} if base else {}
    out = {}
    for c in configs:
        runs = results.get(c) or []
        if c in errors or not runs:
            out[c] = {"error": errors.get(c, "did not run"), "tokens_equal": None,
                      "first_turn_ttft_s": None, "resumed_ttft_s": {}}
            continue
        recs = [r for run in runs for r in run["records"]]
        if base_out:
            equal = all(base_out.get(_key(r)) == r["out"] for r in recs)
        else:
            equal = None
        doc = {"error": None, "tokens_equal": equal, "rounds": len(runs)}
        firsts = _first(recs)
        doc["first_turn_ttft_s"] = {"p50": _pct([r["ttft_s"] for r in firsts], 0.5),
                                    "p99": _pct([r["ttft_s"] for r in firsts], 0.99),
                                    "n": len(firsts)}
        sel_first = (lambda r: r["prefix_tokens"] == 0)
        doc["first_turn_ttft_s"]["vs_baseline"], doc["first_turn_ttft_s"]["rounds_vs_baseline"] \
            = _paired(runs, base, sel_first) if c != "baseline" else (1.0, [])
        buckets = {}
        for b, lo in BUCKETS:
            def sel(r, b=b):
                return r["prefix_tokens"] > 0 and _bucket(r["prefix_tokens"]) == b
            xs = [r for r in recs if sel(r)]
            if not xs:
                continue
            p50s = _round_p50s(runs, sel)
            vb, vb_rounds = _paired(runs, base, sel) if c != "baseline" else (1.0, [])
            vbound, _ = _paired(runs, bound, sel) if c != "bound" else (1.0, [])
            buckets[b] = {"p50": _pct([r["ttft_s"] for r in xs], 0.5),
                          "p99": _pct([r["ttft_s"] for r in xs], 0.99),
                          "min_prefix_tokens": min(r["prefix_tokens"] for r in xs),
                          "median_prefix_tokens": int(statistics.median(
                              r["prefix_tokens"] for r in xs)),
                          "n": len(xs), "round_p50_min": min(p for p in p50s if p is not None),
                          "round_p50_max": max(p for p in p50s if p is not None),
                          "vs_baseline": vb, "rounds_vs_baseline": vb_rounds,
                          "vs_bound": vbound}
        doc["resumed_ttft_s"] = buckets
        wl = {}
        for name in runs[0]["workloads"]:
            walls = [run["workloads"][name]["wall_s"] for run in runs]
            wl[name] = {"wall_s": round(statistics.median(walls), 3),
                        "wall_s_min": min(walls), "wall_s_max": max(walls),
                        "output_tokens_per_s": round(statistics.median(
                            run["workloads"][name]["output_tokens_per_s"] for run in runs), 2),
                        "prompt_tokens": runs[0]["workloads"][name]["prompt_tokens"]}
            if base and c != "baseline":
                ratios = [a["workloads"][name]["wall_s"] / b["workloads"][name]["wall_s"]
                          for a, b in zip(runs, base)]
                wl[name]["wall_vs_baseline"] = round(statistics.median(ratios), 4)
                wl[name]["rounds_wall_vs_baseline"] = [round(x, 4) for x in ratios]
        doc["workloads"] = wl
        tiers = {}
        for run in runs[:1]:
            by_tier = ((run.get("kvtier_stats") or {}).get("worker") or {}) \
                .get("connector", {}).get("by_tier") or {}
            for t, v in by_tier.items():
                tiers[t] = v.get("loaded_tokens")
        if tiers:
            doc["offload_tier_loaded_tokens_round0"] = tiers
        doc["vllm_cpu_s"] = statistics.median(run["cpu_s"] for run in runs)
        doc["vllm_peak_rss_mib"] = statistics.median(run["peak_rss_mib"] for run in runs)
        ds = [run["daemon"] for run in runs if run.get("daemon")]
        if ds:
            doc["daemon_cpu_s"] = statistics.median(d["cpu_s"] for d in ds)
            doc["daemon_peak_rss_mib"] = statistics.median(d["peak_rss_mib"] for d in ds)
        doc["run_elapsed_s"] = [run["elapsed_s"] for run in runs]
        doc["connector"] = runs[0].get("connector")
        if runs[0].get("env"):
            doc["env"] = runs[0]["env"]
        out[c] = doc
    return out


def table(configs):
    """The printed table: one row per configuration."""
    cols = [b for b, _ in BUCKETS]
    head = ["config", "first p50", *[f"{b} p50/p99 (x base, x bound)" for b in cols],
            "no-reuse wall x base", "equal"]
    rows = [head]
    for c, d in configs.items():
        if d.get("error"):
            rows.append([c, "skipped: " + d["error"][:110]])
            continue
        row = [c, f"{d['first_turn_ttft_s']['p50']:.3f}s"]
        for b in cols:
            x = d["resumed_ttft_s"].get(b)
            if not x:
                row.append("-")
                continue
            vb = f"{x['vs_baseline']:.2f}" if x.get("vs_baseline") else "-"
            vbd = f"{x['vs_bound']:.2f}" if x.get("vs_bound") else "-"
            row.append(f"{x['p50']:.3f}/{x['p99']:.3f} ({vb}, {vbd})")
        nr = d["workloads"].get("no_reuse", {})
        row.append(f"{nr.get('wall_vs_baseline', 1.0):.3f}" if nr else "-")
        row.append(str(d["tokens_equal"]))
        rows.append(row)
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


# ----------------------------------------------------------------------------------------------
# The picture, an SVG written by hand: TTFT against reused-prefix length (log x).

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
          "#7f7f7f"]


def svg(configs, path):
    series = []
    for i, (c, d) in enumerate(configs.items()):
        if d.get("error") or not d.get("resumed_ttft_s"):
            continue
        pts = sorted((v["median_prefix_tokens"], v["p50"], v["p99"])
                     for v in d["resumed_ttft_s"].values())
        series.append((c, COLORS[i % len(COLORS)], pts))
    W, H, L, R, T, B = 760, 440, 70, 190, 30, 50
    xs = [p[0] for _, _, pts in series for p in pts] or [100, 1000]
    ys = [p[k] for _, _, pts in series for p in pts for k in (1, 2) if p[k]] or [0.1, 1.0]
    x0, x1 = math.log10(max(1, min(xs)) / 1.3), math.log10(max(xs) * 1.3)
    # Log y too: the offloads' TTFTs are a tenth of the baseline's at long prefixes.
    y0, y1 = math.log10(min(ys) / 1.2), math.log10(max(ys) * 1.2)

    def X(v):
        return L + (math.log10(max(v, 1)) - x0) / (x1 - x0) * (W - L - R)

    def Y(v):
        return T + (1 - (math.log10(max(v, 1e-6)) - y0) / (y1 - y0)) * (H - T - B)

    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
         f'font-family="sans-serif" font-size="12">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{L}" y="18">TTFT of resumed turns against reused-prefix length '
         f'(p50 solid, p99 dashed)</text>',
         f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
         f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>']
    for v in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20):
        if not y0 <= math.log10(v) <= y1:
            continue
        o.append(f'<text x="{L - 6}" y="{Y(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
        o.append(f'<line x1="{L}" y1="{Y(v):.1f}" x2="{W - R}" y2="{Y(v):.1f}" stroke="#ddd"/>')
    for v in (128, 256, 512, 1024, 2048, 4096, 8192):
        if x0 <= math.log10(v) <= x1:
            o.append(f'<text x="{X(v):.1f}" y="{H - B + 16}" text-anchor="middle">{v}</text>')
            o.append(f'<line x1="{X(v):.1f}" y1="{T}" x2="{X(v):.1f}" y2="{H - B}" '
                     f'stroke="#eee"/>')
    o.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">reused prefix '
             f'(tokens, bucket median)</text>')
    o.append(f'<text x="16" y="{(T + H - B) / 2}" transform="rotate(-90 16 {(T + H - B) / 2})" '
             f'text-anchor="middle">TTFT (s, log)</text>')
    for n, (c, col, pts) in enumerate(series):
        for idx, dash in ((1, ""), (2, ' stroke-dasharray="5,4"')):
            d = " ".join(f"{X(p[0]):.1f},{Y(p[idx]):.1f}" for p in pts)
            o.append(f'<polyline points="{d}" fill="none" stroke="{col}" stroke-width="2"{dash}/>')
        for p in pts:
            o.append(f'<circle cx="{X(p[0]):.1f}" cy="{Y(p[1]):.1f}" r="3" fill="{col}"/>')
        ly = T + 14 + 18 * n
        o.append(f'<line x1="{W - R + 12}" y1="{ly - 4}" x2="{W - R + 36}" y2="{ly - 4}" '
                 f'stroke="{col}" stroke-width="2"/>')
        o.append(f'<text x="{W - R + 42}" y="{ly}">{c}</text>')
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")


# ----------------------------------------------------------------------------------------------

def machine():
    info = {"platform": platform.platform(), "cpus": os.cpu_count(),
            "loadavg_start": list(os.getloadavg())}
    try:
        for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
            if line.startswith("Model name:"):
                info["cpu_model"] = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return info


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "child":
        return child_main(argv[1])
    if argv and argv[0] == "plot":  # plot DIR: redraw DIR/compare.svg from DIR/compare.json
        with open(os.path.join(argv[1], "compare.json")) as f:
            svg(json.load(f)["configs"], os.path.join(argv[1], "compare.svg"))
        return 0
    ap = argparse.ArgumentParser(prog="compare-vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results folder (compare.json, compare.svg)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--model-preset", default="compare", choices=["compare", "test"])
    ap.add_argument("--model", help="an existing model folder instead of making one")
    ap.add_argument("--turns", type=int, default=3, help="turns per conversation session")
    ap.add_argument("--traces", default=os.environ.get("KVTIER_TRACES"),
                    help="shared/traces (default: ../shared/traces from the current folder)")
    ap.add_argument("--smoke", action="store_true",
                    help="short and no-reuse workloads only (the smoke run of scripts/test-vllm)")
    ap.add_argument("--python", help="vLLM's Python (default: this one)")
    ap.add_argument("--lmcache-python", default=os.environ.get("KVTIER_LMCACHE_PYTHON"),
                    help="the LMCache environment's Python (scripts/compare-vllm: .venv-lmcache)")
    ap.add_argument("--kvtier-bin", help="the kvtier CLI for `kvtier serve` (default: KVTIER_BIN)")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (model, daemons)")
    a = ap.parse_args(argv)
    if not a.traces:  # run from a checkout's root, shared/ beside it
        a.traces = os.path.abspath(os.path.join("..", "shared", "traces"))
    from kvtier.bench.vllm_offline import configure_env

    configure_env()  # the children inherit it; the settings print it
    m = machine()
    h = Harness(a)
    t0 = time.perf_counter()
    try:
        h.prepare()
        print(f"compare-vllm: model {h.model} ({a.model_preset}), device "
              f"{h.settings['device']}, configs {','.join(h.configs())}, rounds {a.rounds}",
              flush=True)
        for line in h.settings["workloads"]["sessions"]:
            print("compare-vllm: session " + line, flush=True)
        results, errors = h.run()
    finally:
        if not a.keep:
            h.cleanup()
    configs = aggregate(results, errors, h.configs())
    m["loadavg_end"] = list(os.getloadavg())
    doc = {"configs": configs, "settings": h.settings, "machine": m,
           "command": "scripts/compare-vllm " + " ".join(argv),
           "rounds_s": h.total_s, "total_s": round(time.perf_counter() - t0, 1),
           "buckets": {b: lo for b, lo in BUCKETS}}
    with open(os.path.join(h.out, "compare.json"), "w") as f:
        json.dump(doc, f, indent=1)
    svg(configs, os.path.join(h.out, "compare.svg"))
    print(json.dumps({"settings": h.settings["vllm"], "machine": m}))
    print(table(configs))
    print(f"compare-vllm: {h.out}/compare.json, compare.svg ({doc['total_s']} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
