"""One vLLM run for test_vllm_planner.py: prints one KVTIER_RUN JSON line with what happened.

    python vllm_planner_run.py SPEC_JSON

SPEC_JSON is vllm_run.py's (model, prefix_caching, kvtier) plus `phases`, a list of:
  {"prompts": [[seed, tokens], ...], "record": bool}  one request at a time, 2 tokens each;
      recorded: TTFT and output tokens of each
  {"flush": true}                                      waits for the saves and the writes below
  {"modes": {"modes": [...], "prompts": [[mode, seed, tokens], ...]}}
      like "prompts", each under its planner mode (the connector's mode switched in place, so
      the modes are measured interleaved, in one process and one machine state)
  {"itl": {"b_seed", "b_tokens", "b_out", "a_seed", "a_tokens", "a_after"}}
      request B decodes b_out tokens; once it has a_after of them, request A (whose prefix
      kvtier holds) arrives; every step's time is recorded, and when A's first token came
"""

import json
import os
import statistics
import sys
import threading
import time

from vllm_run import generate, make_llm, tokens


def run_prompts(llm, prompts) -> list[dict]:
    rows = []
    for seed, n in prompts:
        r = generate(llm, [tokens(seed, n)], 2)[0]
        rows.append({"seed": seed, "tokens": n, "ttft_s": r.metrics.first_token_latency,
                     "out": list(r.outputs[0].token_ids)})
    return rows


def run_modes(llm, prompts) -> list[dict]:
    import kvtier.integrations.vllm as hooks

    rows, seen = [], []
    for c in list(hooks._CONNECTORS):
        if c._cost is not None:  # each decision and what the model predicted, for the report
            decide = c._cost.decide

            def recorded(*a, _decide=decide, **k):
                d = _decide(*a, **k)
                seen.append(d)
                return d
            c._cost.decide = recorded
    for mode, seed, n in prompts:
        for c in list(hooks._CONNECTORS):
            if c._cost is not None:
                c._cost.mode = mode
        del seen[:]
        row = run_prompts(llm, [[seed, n]])[0]
        row["mode"] = mode
        if seen:
            d = seen[-1]
            row["plan"] = {"choice": d.choice, "load_blocks": d.load_blocks,
                           "load_all_ms": round(d.load_all_s * 1e3, 1),
                           "recompute_all_ms": round(d.recompute_all_s * 1e3, 1)}
        rows.append(row)
    return rows


def flush() -> None:
    from kvtier import backends
    from kvtier.integrations import background

    background.wait_saves(60.0)
    for cache in list(backends._registry.values()):
        if hasattr(cache, "wait_for_writes"):  # in process; a daemon's writes are its own
            cache.wait_for_writes()


def itl(llm, spec: dict) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    eng = llm.llm_engine

    def params(n):
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)

    eng.add_request("B", TokensPrompt(prompt_token_ids=tokens(spec["b_seed"], spec["b_tokens"])),
                    params(spec["b_out"]))
    stamps: list[float] = []
    a_added = a_first = a_done = None
    n_b = 0
    while eng.has_unfinished_requests():
        outs = eng.step()
        now = time.perf_counter()
        for o in outs:
            k = len(o.outputs[0].token_ids)
            if o.request_id == "B" and k > n_b:
                stamps.extend([now] * (k - n_b))
                n_b = k
            if o.request_id == "A" and k and a_first is None:
                a_first = now
            if o.request_id == "A" and o.finished:
                a_done = now
        if a_added is None and n_b >= spec["a_after"]:
            a = tokens(spec["a_seed"], spec["a_tokens"])
            hooks = sys.modules.get("kvtier.integrations.vllm")
            if hooks is not None:
                hooks.HOOK_MAX_SECONDS.clear()
            eng.add_request("A", TokensPrompt(prompt_token_ids=a), params(2))
            a_added = time.perf_counter()
    loader = [t for t in threading.enumerate() if t.name == "kvtier-load"]
    loader_cpu = (time.clock_gettime(time.pthread_getcpuclockid(loader[0].ident))
                  if loader else None)
    loader_cpus = sorted(os.sched_getaffinity(loader[0].native_id)) if loader else None
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    before = [g for g, t in zip(gaps, stamps[1:]) if t <= a_added]
    during = [g for g, t in zip(gaps, stamps[1:]) if a_added < t <= a_first]
    # B alone: before A came and after A was done (more steps than before alone: steadier).
    alone = before + [g for g, t in zip(gaps, stamps) if a_done is not None and t > a_done]
    return {"itl_before_p50_s": statistics.median(before),
            "itl_alone_mean_s": statistics.fmean(alone), "itl_alone_p50_s": statistics.median(alone),
            "itl_alone_n": len(alone),
            "itl_during_p50_s": statistics.median(during) if during else None,
            "itl_during": during,
            "itl_during_mean_s": statistics.fmean(during) if during else None,
            "a_wait_s": a_first - a_added, "b_tokens": n_b, "loader_cpu_s": loader_cpu,
            "loader_cpus": loader_cpus, "main_cpus": sorted(os.sched_getaffinity(0)),
            "hook_max_s": dict(getattr(sys.modules.get("kvtier.integrations.vllm"),
                                       "HOOK_MAX_SECONDS", {}))}


def main(spec: dict) -> dict:
    if spec.get("load_delay_s"):
        # The decode test's control: the load waits this long before it starts, so what slows
        # the other request while it waits is vLLM's own handling of a parked request.
        import kvtier.integrations.vllm as hooks

        real = hooks.KvtierConnector._load

        def delayed(self, t, _real=real, _d=spec["load_delay_s"]):
            time.sleep(_d)
            return _real(self, t)

        hooks.KvtierConnector._load = delayed
    llm, start_s = make_llm(spec)
    out = {"start_s": start_s, "prompts": []}
    for phase in spec["phases"]:
        if "prompts" in phase:
            rows = run_prompts(llm, phase["prompts"])
            if phase.get("record"):
                out["prompts"].extend(rows)
        elif "modes" in phase:
            out["prompts"].extend(run_modes(llm, phase["modes"]))
        elif "flush" in phase:
            flush()
        elif "itl" in phase:
            out["itl"] = itl(llm, phase["itl"])
    hooks = sys.modules.get("kvtier.integrations.vllm")
    if hooks is not None:
        hooks.wait_saves(30.0)
        out["counters"] = hooks.connector_counters()
    return out


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]))
    print("KVTIER_RUN " + json.dumps(result), flush=True)
