#!/usr/bin/env bash
# `kvtier replay --through cache --replicas 2` on a slice of the shipped AgentX traces: every
# router replays the same requests on fresh replicas, the command checked that each router's
# view (built from the KV events alone) equals what the caches hold, the table prints the paired
# difference, every hit is counted in one medium, and a daemon cannot be routed.
# usage: routed_test.sh KVTIER_BINARY TRACES_DIR
set -euo pipefail
kvtier=$1
traces=$2/agentx-weka
if [[ ! -f $traces/trace_0274.json ]]; then
  echo "skipped: $traces not found"
  exit 77
fi
command -v python3 >/dev/null || { echo "skipped: python3 is not installed"; exit 77; }
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
"$kvtier" replay "$traces/trace_0274.json" "$traces/trace_0211.json" --through cache \
  --replicas 2 --device-live 0.25 --json "$out/r.json" >"$out/stdout" 2>&1 ||
  { cat "$out/stdout"; exit 1; }
cat "$out/stdout"
grep -q "medium - gpu-only" "$out/stdout" || { echo "no paired difference in the table"; exit 1; }
grep -q "the router's view equalled the caches" "$out/stdout" || { echo "no view check"; exit 1; }
python3 - "$out/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
routers = r["routers"]
if sorted(routers) != ["affinity", "gpu-only", "medium", "round-robin"]:
    sys.exit(f"routers: {sorted(routers)}")
prompt = {p["prompt_tokens"] for p in routers.values()}
if len(prompt) != 1:
    sys.exit(f"the routers replayed different requests: {prompt}")
for name, p in routers.items():
    if not p["view_matches_caches"]:
        sys.exit(f"{name}: the view differs from the caches")
    if sum(p["hit_blocks_by_medium"].values()) != p["hit_blocks"]:
        sys.exit(f"{name}: hits by medium {p['hit_blocks_by_medium']} != {p['hit_blocks']}")
    if sorted(p["hit_blocks_by_medium"]) != ["CPU", "GPU"]:
        sys.exit(f"{name}: media {sorted(p['hit_blocks_by_medium'])}")
    if sum(t["hit_tokens"] for t in p["per_trace"].values()) != p["hit_tokens"]:
        sys.exit(f"{name}: per-trace hits do not add up")
    if sum(p["requests_per_replica"]) != p["requests"]:
        sys.exit(f"{name}: requests per replica do not add up")
if routers["affinity"]["moved_requests"] != 0:
    sys.exit("affinity moved a session")
if routers["medium"]["matched_requests"] == 0:
    sys.exit("the medium router never followed a prefix")
print("medium {:.2%} gpu-only {:.2%}".format(routers["medium"]["hit_rate"],
                                             routers["gpu-only"]["hit_rate"]))
PY
if "$kvtier" replay "$traces/trace_0211.json" --through daemon --replicas 2 >"$out/bad" 2>&1; then
  echo "--through daemon --replicas 2 should be refused"; exit 1
fi
grep -q "in-process Caches" "$out/bad" || { cat "$out/bad"; exit 1; }
