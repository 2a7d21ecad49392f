#!/usr/bin/env bash
# `kvtier replay --through both` on a slice of the shipped AgentX trace: the real `kvtier serve`
# the command starts, driven through a Client, hits what the in-process Cache hits (within
# 0.1 pt), for LRU and the session policy at 0.2x and 0.43x the mean live context.
# usage: through_daemon_test.sh KVTIER_BINARY TRACES_DIR
set -euo pipefail
kvtier=$1
traces=$2/agentx-weka
if [[ ! -f $traces/trace_0074.json ]]; then
  echo "skipped: $traces not found"
  exit 77
fi
command -v python3 >/dev/null || { echo "skipped: python3 is not installed"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for live in 0.2 0.43; do
  "$kvtier" replay "$traces/trace_0074.json" "$traces/trace_0211.json" --through both \
    --policy lru,session --capacity-live "$live" --json "$out/r.json" >"$out/stdout" 2>&1 ||
    { cat "$out/stdout"; exit 1; }
  python3 - "$out/r.json" "$live" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for name, p in r["policies"].items():
    c, d = p["cache"], p["daemon"]
    for k in ("hit_rate", "per_request_mean_hit_rate"):
        diff = abs(d[k] - c[k])
        print(f"{sys.argv[2]}x {name} {k}: cache {c[k]:.4%} daemon {d[k]:.4%}")
        if diff > 0.001:
            sys.exit(f"{name} at {sys.argv[2]}x: daemon and cache differ by {diff:.4%} in {k}")
    if c["hit_rate"] < 0.2:
        sys.exit(f"{name}: a degenerate run ({c['hit_rate']:.2%})")
PY
done
# An SSD tier below the host tier (--disk-live): min_reuse 2 writes fewer blocks to it than no
# rule, and says why it skipped the rest.
for reuse in 0 2; do
  "$kvtier" replay "$traces/trace_0074.json" "$traces/trace_0211.json" --through cache \
    --policy lru-tail --capacity-live 0.2 --disk-live 3 --disk-min-reuse "$reuse" \
    --json "$out/d$reuse.json" >"$out/stdout" 2>&1 || { cat "$out/stdout"; exit 1; }
done
python3 - "$out/d0.json" "$out/d2.json" <<'PY'
import json, sys
d0, d2 = (json.load(open(p))["policies"]["lru-tail"] for p in sys.argv[1:])
print(f"SSD blocks written: no rule {d0['disk']['put_blocks']}, min_reuse 2 {d2['disk']['put_blocks']}; "
      f"hit rate {d0['cache']['hit_rate']:.4%} vs {d2['cache']['hit_rate']:.4%}")
if not 0 < d2["disk"]["put_blocks"] < d0["disk"]["put_blocks"]:
    sys.exit("min_reuse 2 should write fewer (and some) blocks to the SSD tier")
if d2["disk"]["skipped_reuse"] == 0 or d0["disk"]["skipped_reuse"] != 0:
    sys.exit(f"expected reuse skips with min_reuse 2 only: {d0['disk']} {d2['disk']}")
PY
