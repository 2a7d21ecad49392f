"""One vLLM run in this process, for test_vllm.py: prints one JSON line with what happened.

    python vllm_run.py make-model DIR [PRESET]   (PRESET: test, or a family of vllm_offline)
    python vllm_run.py run SPEC_JSON
    python vllm_run.py serve SPEC_JSON   (the 0%-hit throughput, driven over stdin; see serve())
    python vllm_run.py flood SPEC_JSON   (another process's stores into a daemon; see flood())

A run drives vLLM offline on token ids (no tokenizer, no hub), greedy, eager. SPEC_JSON:
  model: the model folder; prefix_caching: bool; kvtier: null or the connector's extra config;
  phases: "conversation" (turn 1, then turn 2 = turn 1 + its output + new tokens, repeated
  `passes` times; vLLM's counters are read right after it; reset_prefix_cache: vLLM's own
  cache emptied before each turn 2); flood_before_load: null or
  {socket, blocks, release_pins}: another process stores blocks into the daemon between the
  scheduler's promise of a load and the worker's load (flood_between_schedule_and_load).
"""

import json
import os
import sys
import time

# The helpers the comparison harness shares (kvtier.bench.vllm_offline); its configure_env()
# runs before vLLM is imported.
from kvtier.bench.vllm_offline import (BLOCK_SIZE, KVTIER_BLOCK, VOCAB,  # noqa: F401
                                       configure_env, generate, make_llm, make_switchable,
                                       metric_sum, tokens)
from kvtier.bench.vllm_offline import make_model as _make_model

configure_env()


def make_model(path: str, preset: str = "test") -> None:
    _make_model(path, preset)
    print(json.dumps({"model": path}))


def flood(spec: dict) -> None:
    """Another process's stores: spec["blocks"] fresh blocks of the tiny Llama's layout into the
    daemon at spec["socket"], as many as fit; prints KVTIER_FLOOD {"stored", "failed"}."""
    import numpy as np

    import kvtier

    layout = kvtier.KvLayout(num_layers=4, num_kv_heads=2, head_dim=64, dtype="fp32",
                             block_tokens=KVTIER_BLOCK)
    c = kvtier.Client.connect(layout, socket=spec["socket"], model_id="flood", timeout_ms=5000)
    if not c.wait_connected(5000):
        raise SystemExit(f"flood: no daemon at {spec['socket']}")
    data = np.ones((1, layout.bytes_per_block), np.uint8)
    stored = failed = 0
    for i in range(spec["blocks"]):
        r = c.store(tokens(9000 + i, KVTIER_BLOCK), data)
        stored += r.stored_blocks
        failed += r.failed_blocks
    print("KVTIER_FLOOD " + json.dumps({"stored": stored, "failed": failed}), flush=True)


def flood_between_schedule_and_load(spec: dict, out: dict) -> None:
    """Runs `flood` in another process once, after the scheduler has promised a request blocks
    to load and before the worker loads them (the executor runs both halves in this process).
    release_pins: the scheduler's pins are let go first, so the flood may evict those blocks."""
    import subprocess

    from kvtier.integrations import vllm as conn

    original = conn.KvtierConnector.build_connector_meta

    def build(self, scheduler_output):
        meta = original(self, scheduler_output)
        if getattr(meta, "loads", None) and "flood" not in out:
            if spec.get("release_pins"):
                for st in self._reqs.values():
                    self._release(st)
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "flood",
                                json.dumps(spec)], capture_output=True, text=True, timeout=120)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("KVTIER_FLOOD ")]
            if p.returncode != 0 or not lines:
                raise RuntimeError(f"flood failed: {p.stdout[-2000:]}{p.stderr[-2000:]}")
            out["flood"] = json.loads(lines[-1][len("KVTIER_FLOOD "):])
        return meta

    conn.KvtierConnector.build_connector_meta = build


def run(spec: dict) -> dict:
    out = {"pid": os.getpid()}
    if spec.get("flood_before_load"):
        flood_between_schedule_and_load(spec["flood_before_load"], out)
    llm, start_s = make_llm(spec)
    out["start_s"] = start_s

    def counters():
        return {"vllm_external_hits": metric_sum(llm, "vllm:external_prefix_cache_hits"),
                "vllm_external_queries": metric_sum(llm, "vllm:external_prefix_cache_queries"),
                "vllm_prefix_hits": metric_sum(llm, "vllm:prefix_cache_hits")}

    for phase in spec["phases"]:
        if phase == "conversation":
            turn1 = tokens(1, spec.get("turn1_tokens", 600))
            passes = []
            for _ in range(spec.get("passes", 1)):
                r1 = generate(llm, [turn1], 24)[0]
                o1 = list(r1.outputs[0].token_ids)
                turn2 = turn1 + o1 + tokens(2, spec.get("turn2_new_tokens", 150))
                if spec.get("reset_prefix_cache"):  # turn 2 finds nothing in vLLM's own cache
                    assert llm.reset_prefix_cache()
                r2 = generate(llm, [turn2], 24)[0]
                o2 = list(r2.outputs[0].token_ids)
                ttft = [getattr(r.metrics, "first_token_latency", None) for r in (r1, r2)]
                passes.append({"turn1": o1, "turn2": o2, "ttft_s": ttft,
                               "turn2_prompt_tokens": len(turn2)})
            out["passes"] = passes
            out.update(counters())
        elif phase == "events":
            out.update(events_phase(llm, spec))
            out.update(counters())
    return out


def events_phase(llm, spec: dict) -> dict:
    """Turn 1; prompts that push its blocks out of vLLM's small KV space; turn 2, which loads
    them from kvtier. Then both event streams, read back through their replay sockets and
    decoded with vLLM's classes: per stream and medium, the hashes stored and removed."""
    import time as _time

    from kv_replay import replay

    from kvtier.integrations import background

    turn1 = tokens(1, spec.get("turn1_tokens", 600))
    o1 = list(generate(llm, [turn1], 24)[0].outputs[0].token_ids)
    background.wait_saves(30.0)
    for i in range(spec.get("fillers", 4)):
        generate(llm, [tokens(500 + i, 1800)], 4)
    turn2 = turn1 + o1 + tokens(2, 150)
    o2 = list(generate(llm, [turn2], 24)[0].outputs[0].token_ids)
    background.wait_saves(30.0)
    _time.sleep(0.5)  # both publishers send a batch at most this late (kvtier 10 ms, vLLM a step)
    streams = {}
    for name, endpoint in (("vllm", spec["kv_events"]["replay_endpoint"]),
                           ("kvtier", spec["kvtier_replay"])):
        got: dict = {"topics": set()}
        for topic, _, batch in replay(endpoint):
            got["topics"].add(topic)
            for e in batch.events:
                kind = type(e).__name__
                if kind == "AllBlocksCleared":
                    continue
                key = f"{kind}:{e.medium}:{topic}"
                got.setdefault(key, []).extend(e.block_hashes)
                if kind == "BlockStored":
                    got.setdefault("block_size", set()).add(e.block_size)
        streams[name] = {k: sorted(v) if isinstance(v, set) else v for k, v in got.items()}
    return {"passes": [{"turn1": o1, "turn2": o2}], "streams": streams}


def miss_prompts(round_no: int, n: int) -> list[list[int]]:
    """Round round_no's distinct 500-token prompts: no prefix shared with any other prompt."""
    return [tokens(2000 + 100 * round_no + i, 500) for i in range(n)]


def background_cpu(hooks) -> dict[str, float]:
    """CPU seconds so far of the connector's background threads in this process, by name."""
    out: dict[str, float] = {}
    if hooks is None:
        return out
    from kvtier.integrations import background

    for s in background.savers():  # the library's store thread
        out["kvtier-store"] = out.get("kvtier-store", 0.0) + s.thread_cpu_seconds()
    from kvtier.integrations import vllm_support

    threads = []
    if vllm_support._stats_writer is not None:
        threads.append(vllm_support._stats_writer._thread)
    for th in threads:
        try:
            clock = time.pthread_getcpuclockid(th.ident)
            out[th.name] = out.get(th.name, 0.0) + time.clock_gettime(clock)
        except (OSError, TypeError):
            continue
    return out


def serve(spec: dict) -> None:
    """The 0%-hit workload, one batch per command, so a parent can measure two processes (with
    and without the connector) in alternating rounds on a shared machine.

    Protocol lines go to the original stdout (everything else printed goes to stderr):
      KVTIER_READY {...}              after the engine started and ran a warm-up batch
      stdin "batch N [on|off]" -> KVTIER_BATCH {"round": N, "tokens_per_s": x, "seconds": s,
          "hook_seconds": h, "cpu_seconds": c, "background_cpu_seconds": {thread: b}}
          (h: time in the connector's hooks; c: this process's CPU time; b: the connector's
          background threads' CPU time; "off" turns the connector's work off for that batch,
          see make_switchable)
      stdin "quit"    -> KVTIER_DONE {"hook_calls": {...}, "counters": {...}, "saver_idle": [...]},
                         after the saves
    """
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(tag, doc):
        proto.write(f"{tag} {json.dumps(doc)}\n")
        proto.flush()

    llm, start_s = make_llm(spec)
    n = spec.get("requests", 8)
    generate(llm, [tokens(1000 + i, 500) for i in range(n)], 16)  # warm-up
    hooks = sys.modules.get("kvtier.integrations.vllm")
    connector_on = make_switchable(hooks) if hooks else [False]
    say("KVTIER_READY", {"pid": os.getpid(), "start_s": start_s, "connector": hooks is not None})
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "batch":
            if hooks:
                connector_on[0] = cmd[2:] != ["off"]
            prompts = miss_prompts(int(cmd[1]), n)
            h0 = hooks.HOOK_SECONDS[0] if hooks else 0.0
            bg0 = background_cpu(hooks)
            c0 = time.process_time()
            t = time.perf_counter()
            res = generate(llm, prompts, 16)
            dt = time.perf_counter() - t
            cpu = time.process_time() - c0
            bg = {k: v - bg0.get(k, 0.0) for k, v in background_cpu(hooks).items()}
            done = sum(len(p) + len(r.outputs[0].token_ids) for p, r in zip(prompts, res))
            say("KVTIER_BATCH", {"round": int(cmd[1]), "tokens_per_s": done / dt, "seconds": dt,
                                 "hook_seconds": (hooks.HOOK_SECONDS[0] - h0) if hooks else 0.0,
                                 "cpu_seconds": cpu, "background_cpu_seconds": bg})
        elif cmd[0] == "quit":
            doc = {"hook_calls": {}, "counters": {}}
            if hooks:
                from kvtier.integrations import background

                hooks.wait_saves(30.0)
                doc = {"hook_calls": dict(hooks.HOOK_CALLS),
                       "hook_seconds": dict(hooks.HOOK_SECONDS_BY_NAME),
                       "counters": hooks.connector_counters(),
                       "saver_idle": [background.runs_idle(s.thread_id)
                                      for s in background.savers()]}
            say("KVTIER_DONE", doc)
            break


if __name__ == "__main__":
    if sys.argv[1] == "make-model":
        make_model(sys.argv[2], *sys.argv[3:4])
    elif sys.argv[1] == "serve":
        serve(json.loads(sys.argv[2]))
    elif sys.argv[1] == "flood":
        flood(json.loads(sys.argv[2]))
    else:
        result = run(json.loads(sys.argv[2]))
        print("KVTIER_RUN " + json.dumps(result), flush=True)
