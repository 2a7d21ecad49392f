"""kvtier side by side with the peers inside vLLM (issue 33): one workload, every configuration in
the same run, each run in a fresh process, in interleaved rounds (A B C ..., then C B A, ...).

    python -m kvtier.bench.compare_vllm --out DIR [--rounds 3] [--configs a,b,...] [--model-preset
        compare|test] [--smoke]
    python -m kvtier.bench.compare_vllm plot DIR   (redraws DIR/compare.svg from compare.json)
    python -m kvtier.bench.compare_vllm report DIR (the figures again from DIR/runs/)
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
run's raw result and log), and prints the table. The table's ratios are paired by turn: the
median over a bucket's turns of each turn's TTFT over the same turn's in the same round of
baseline or bound (turns_vs_baseline, turns_vs_bound); compare.json also has the ratios of the
rounds' p50s (vs_baseline, vs_bound).
"""

import argparse
import json
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
from kvtier.bench.compare_report import BUCKETS, aggregate, svg, table
from kvtier.bench.serve_daemon import ServeDaemon, find_kvtier_bin, wait_rusage

CONFIGS = ["baseline", "bound", "vllm-offloading", "lmcache", "lmcache-mp", "kvtier",
           "kvtier-serve", "kvtier-serve-ssd"]
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


def _miss_same_process(llm, hooks, w):
    """The no-reuse prompts again, each twice in this process (fresh tokens each time), with the
    kvtier connector's work off and on, which first alternating: the miss cost without the
    difference two vLLM processes make (several per cent here, with no connector at all). The
    saves of a prompt are waited for before the next, so each TTFT is the request's own cost
    (the store itself runs on CPU time vLLM leaves idle)."""
    from kvtier.bench.vllm_offline import generate, make_switchable, tokens

    nr = w["no_reuse"]
    on = make_switchable(hooks)
    pairs = []
    try:
        for j, n in enumerate(nr["lengths"]):
            t = {}
            for mode in (("off", "on") if j % 2 == 0 else ("on", "off")):
                on[0] = mode == "on"
                prompt = tokens(60_000 + 2 * j + (mode == "on"), n)
                t[mode] = _ttft(generate(llm, [prompt], nr["max_tokens"])[0])
                hooks.wait_saves(30.0)
            if t["on"] and t["off"]:
                pairs.append((t["on"], t["off"]))
    finally:
        on[0] = True
    ratios = [a / b for a, b in pairs]
    return {"pairs": len(pairs), "on_over_off_p50": round(statistics.median(ratios), 4)
            if ratios else None, "ratios": [round(x, 4) for x in ratios]}


def _llvmlite_dict():
    """LMCache imports numba (so llvmlite) before vLLM's CPU worker starts, and vLLM 0.32 then
    scans every module's objects with `vars(obj).get(...)`: llvmlite's library wrapper answers
    any attribute, `__dict__` too, with a function wrapper, and the scan raises AttributeError.
    Giving the wrapper a plain `__dict__` entry lets the scan pass it; nothing else reads it."""
    try:
        from llvmlite.binding import ffi
    except ImportError:
        return
    ffi.lib._fntab.setdefault("__dict__", {})


def child_main(spec_path):
    from kvtier.bench.vllm_offline import configure_env

    with open(spec_path) as f:
        spec = json.load(f)
    for k, v in spec.get("env", {}).items():
        os.environ[k] = v
    configure_env()
    if spec.get("llvmlite_dict"):
        _llvmlite_dict()
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
        # Where the connector's time on vLLM's thread went: seconds, calls and longest call
        # per hook (start_load_kv: the synchronous loads).
        doc["kvtier_hooks"] = {
            name: {"seconds": round(s, 4), "calls": hooks.HOOK_CALLS.get(name, 0),
                   "max_s": round(hooks.HOOK_MAX_SECONDS.get(name, 0.0), 4)}
            for name, s in sorted(hooks.HOOK_SECONDS_BY_NAME.items())}
        if "no_reuse" in spec["workloads"]:  # last: the figures above are the workloads' own
            doc["miss_same_process"] = _miss_same_process(llm, hooks, w)
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
        from kvtier.bench.vllm_offline import BLOCK_SIZE, layout_yaml, model_layout

        self.block = a.block_tokens
        if self.block <= 0 or self.block % BLOCK_SIZE:
            raise SystemExit(f"compare-vllm: --block-tokens {self.block} is not a positive "
                             f"multiple of vLLM's block ({BLOCK_SIZE})")
        self.layout = dict(model_layout(self.model), block_tokens=self.block)
        self.layout_yaml = layout_yaml(self.layout)
        w = compare_workloads.build(a.traces, turns=a.turns, sessions=not a.smoke,
                                    short_sessions=4 if a.smoke else 8,
                                    no_reuse=3 if a.smoke else 12)
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
            "offload_block_tokens": self.block, "host_bytes": HOST_BYTES,
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
        from kvtier.bench.vllm_offline import BLOCK_SIZE

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
                                              "block_size": self.block}}
        elif name in ("lmcache", "lmcache-mp"):
            if not self.lmcache_python or not os.access(self.lmcache_python, os.X_OK):
                return {"error": "no LMCache environment (scripts/compare-vllm makes "
                                 ".venv-lmcache; --lmcache-python names one)"}
            python = self.lmcache_python
            spec["llvmlite_dict"] = True
            if name == "lmcache":
                spec["env"] = {"LMCACHE_CHUNK_SIZE": str(self.block), "LMCACHE_LOCAL_CPU": "True",
                               "LMCACHE_MAX_LOCAL_CPU_SIZE": str(HOST_BYTES / 2**30),
                               "LMCACHE_USE_EXPERIMENTAL": "True"}
                spec["kv_transfer_config"] = {"kv_connector": "LMCacheConnectorV1",
                                              "kv_role": "kv_both"}
            else:
                port = _free_port()
                cmd = [python, "-m", "lmcache.v1.multiprocess.server", "--host", "localhost",
                       "--port", str(port), "--chunk-size", str(self.block),
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
            spec["kvtier"] = {"host_capacity": str(HOST_BYTES), "stats_path": stats_path,
                              "block_tokens": self.block}
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
                              "stats_path": stats_path, "block_tokens": self.block}
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


def report_main(out):
    """Aggregates DIR/runs/r<round>-<config>.json again (the runs of an earlier run, this
    version's figures), rewrites DIR/compare.json's configs and DIR/compare.svg, prints the
    table."""
    path = os.path.join(out, "compare.json")
    with open(path) as f:
        doc = json.load(f)
    names = list(doc["configs"])
    errors = {c: v["error"] for c, v in doc["configs"].items() if v.get("error")}
    results = {c: [] for c in names}
    for rnd in range(max(v.get("rounds", 0) for v in doc["configs"].values())):
        for c in names:
            run = os.path.join(out, "runs", f"r{rnd}-{c}.json")
            if c not in errors and os.path.exists(run):
                with open(run) as f:
                    results[c].append(json.load(f))
    doc["configs"] = aggregate(results, errors, names)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    svg(doc["configs"], os.path.join(out, "compare.svg"))
    print(table(doc["configs"]))
    return 0


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "child":
        return child_main(argv[1])
    if argv and argv[0] == "plot":  # plot DIR: redraw DIR/compare.svg from DIR/compare.json
        with open(os.path.join(argv[1], "compare.json")) as f:
            svg(json.load(f)["configs"], os.path.join(argv[1], "compare.svg"))
        return 0
    if argv and argv[0] == "report":  # report DIR: the figures again from DIR/runs/
        return report_main(argv[1])
    ap = argparse.ArgumentParser(prog="compare-vllm", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results folder (compare.json, compare.svg)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--model-preset", default="compare", choices=["compare", "test"])
    ap.add_argument("--model", help="an existing model folder instead of making one")
    ap.add_argument("--block-tokens", type=int, default=32,
                    help="every offload's block (kvtier block_tokens, LMCache chunk, vLLM "
                         "offloading block): a multiple of vLLM's block (32)")
    ap.add_argument("--turns", type=int, default=4, help="turns per conversation session")
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
