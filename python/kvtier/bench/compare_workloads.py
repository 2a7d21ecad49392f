"""The comparison's workloads, derived from the real traces in shared/traces (read, never copied):

- conversation: live sessions whose turn structure (prompt growth per turn, output lengths)
  comes from AgentX coding-agent sessions (agentx-weka/) and Mooncake
  conversations (mooncake/conversation_trace.jsonl), each scaled to a target final prompt length
  that fits the model's context; the sessions are interleaved turn by turn, so vLLM's own KV
  cache (sized to one longest prompt, below the live sessions' total) cannot hold them all.
- short: short prompts (200 tokens) resumed once, evicted from vLLM's cache in between: where
  reloading should lose to recomputing.
- no_reuse: distinct prompts, lengths from Mooncake first turns: the miss cost.

Token contents are seeded random ids (the traces give lengths and structure, not text). A turn's
prompt is the previous turn's prompt, its generated output, then the turn's new tokens; the
child process builds it as it goes (the outputs are the model's).
"""

import glob
import json
import os

# Final prompt length of each conversation session (tokens). With 4 turns a round has 3 to 6
# resumed turns in each bucket from 512 tokens: one turn alone would decide a bucket's median.
AGENTX_TARGETS = [6000, 5000, 3500, 2500]
MOONCAKE_TARGETS = [1800, 900]
OUT_MIN, OUT_MAX = 4, 16  # generated tokens per turn, after scaling


def _scaled_session(name, ins, outs, times, target):
    """A session from prompt lengths `ins`, output lengths `outs` and times (s), scaled so the
    last prompt is `target` tokens (never scaled up)."""
    scale = min(1.0, target / ins[-1])
    first = max(64, round(ins[0] * scale))
    turns = [{"new_tokens": first, "max_tokens": _out(outs[0] * scale), "t": 0.0}]
    prev_len = first
    for k in range(1, len(ins)):
        want = round(ins[k] * scale)
        grown = prev_len + turns[-1]["max_tokens"]
        turns.append({"new_tokens": max(16, want - grown), "max_tokens": _out(outs[k] * scale),
                      "t": times[k] - times[0]})
        prev_len = grown + turns[-1]["new_tokens"]
    return {"name": name, "scale": round(scale, 4), "turns": turns}


def _out(n):
    return int(min(OUT_MAX, max(OUT_MIN, round(n))))


def agentx_sessions(trace_dir, turns):
    """The first `turns` model calls (sub-agents left out) of AgentX sessions whose prompt grows
    at every call, as many as AGENTX_TARGETS."""
    out = []
    for path in sorted(glob.glob(os.path.join(trace_dir, "agentx-weka", "trace_*.json"))):
        with open(path) as f:
            doc = json.load(f)
        reqs = [r for r in doc["requests"] if r.get("type") != "subagent"][:turns]
        if len(reqs) < turns or any(b["in"] <= a["in"] + a["out"]
                                    for a, b in zip(reqs, reqs[1:])):
            continue
        # Session i gets the i-th target; longer sessions take the larger ones.
        out.append((doc["id"] if "id" in doc else os.path.basename(path), reqs))
        if len(out) == len(AGENTX_TARGETS):
            break
    return [_scaled_session("agentx:" + str(name), [r["in"] for r in reqs],
                            [r["out"] for r in reqs], [r["t"] for r in reqs], target)
            for (name, reqs), target in zip(out, AGENTX_TARGETS)]


def mooncake_conversations(trace_dir, turns):
    """Conversations of the Mooncake trace: a request continues an earlier one when its hash ids
    start with all of the earlier one's but its last (partial) block. The first chains of at
    least `turns` requests whose prompt grows, from distinct roots, as many as
    MOONCAKE_TARGETS."""
    path = os.path.join(trace_dir, "mooncake", "conversation_trace.jsonl")
    with open(path) as f:
        reqs = [json.loads(line) for line in f]
    index, parent = {}, {}
    for j, r in enumerate(reqs):
        h = r["hash_ids"]
        for k in range(len(h) - 1, 1, -1):
            i = index.get(tuple(h[:k]))
            if i is not None and k >= len(reqs[i]["hash_ids"]) - 1:
                parent[j] = i
                break
        for k in range(2, len(h) + 1):
            index[tuple(h[:k])] = j
    chains, roots = [], set()
    for j in range(len(reqs)):
        chain = [j]
        while chain[-1] in parent and len(chain) < turns:
            chain.append(parent[chain[-1]])
        if len(chain) < turns or chain[-1] in parent:
            continue  # shorter, or the middle of a longer conversation
        chain.reverse()
        if chain[0] in roots or any(reqs[b]["input_length"] <= reqs[a]["input_length"]
                                    for a, b in zip(chain, chain[1:])):
            continue
        roots.add(chain[0])
        chains.append(chain)
        if len(chains) == len(MOONCAKE_TARGETS):
            break
    return [_scaled_session(f"mooncake:{c[0]}", [reqs[i]["input_length"] for i in c],
                            [reqs[i]["output_length"] for i in c],
                            [reqs[i]["timestamp"] / 1000.0 for i in c], target)
            for c, target in zip(chains, MOONCAKE_TARGETS)]


def no_reuse_lengths(trace_dir, n, lo=512, hi=2048):
    """Prompt lengths of the first n Mooncake requests, clamped to [lo, hi]."""
    path = os.path.join(trace_dir, "mooncake", "conversation_trace.jsonl")
    out = []
    with open(path) as f:
        for line in f:
            out.append(min(hi, max(lo, json.loads(line)["input_length"] // 4)))
            if len(out) == n:
                break
    return out


def build(trace_dir, turns=4, short_sessions=8, no_reuse=12, sessions=True):
    """All three workloads as one JSON-able dict (token ids are drawn by the child from seeds).
    sessions=False leaves the conversation workload out (the smoke run)."""
    conv = []
    if sessions:
        conv = agentx_sessions(trace_dir, turns) + mooncake_conversations(trace_dir, turns)
        # Round-robin, as sessions live at once on a server: every session's turn k before any
        # session's turn k + 1, so between two turns of a session all the others run, more
        # tokens than vLLM's KV cache holds. (The traces' think times are kept in "t" but not
        # slept: an idle machine would only lengthen the run.)
        order = [[i, k] for k in range(turns) for i in range(len(conv))]
    else:
        order = []
    return {
        "conversation": {"sessions": conv, "order": order},
        "short": {"sessions": short_sessions, "first_tokens": 200, "new_tokens": 40,
                  "max_tokens": 4},
        "no_reuse": {"lengths": no_reuse_lengths(trace_dir, no_reuse), "max_tokens": 8},
    }


def summary(w):
    """One line per session: name, scale, prompt lengths if the outputs are as long as asked."""
    lines = []
    for s in w["conversation"]["sessions"]:
        n, lens = 0, []
        for t in s["turns"]:
            n += t["new_tokens"]
            lens.append(n)
            n += t["max_tokens"]
        lines.append(f"{s['name']} x{s['scale']}: prompts {lens}")
    return lines
