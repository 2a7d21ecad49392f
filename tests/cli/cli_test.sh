#!/usr/bin/env bash
# Runs the kvtier tool as a user would: every --json result must be one clean JSON document on
# stdout (logs go to stderr), bad input must fail with a message naming it, and the main
# commands must run end to end on tiny inputs.
# Usage: cli_test.sh KVTIER_BINARY SHARED_TRACES_DIR [DISK_FIXTURE_BINARY]
set -u
kvtier=$1
traces=$2
disk_fixture=${3:-}
# /var/tmp: disk-backed on Debian (bench disk needs O_DIRECT, which older tmpfs lacks).
work=$(mktemp -d -p "${TMPDIR:-/var/tmp}")
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# expect_json NAME KEY... -- COMMAND...: the command exits 0 and its stdout parses as JSON
# holding every KEY at the top level.
expect_json() {
  local name=$1
  shift
  local keys=()
  while [ "$1" != "--" ]; do
    keys+=("$1")
    shift
  done
  shift
  "$@" >"$work/out" 2>"$work/err"
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    fail "$name: exit $rc ($(tail -n 3 "$work/err"))"
    return
  fi
  if ! python3 - "$work/out" "${keys[@]}" <<'PY'; then
import json, sys
doc = json.load(open(sys.argv[1]))
missing = [k for k in sys.argv[2:] if k not in doc]
if missing:
    sys.exit("missing keys: %s" % missing)
PY
    fail "$name: stdout is not the JSON document expected: $(head -c 300 "$work/out")"
    return
  fi
  echo "ok: $name"
}

# expect_error NAME PATTERN -- COMMAND...: the command exits non-zero and says PATTERN on stderr.
expect_error() {
  local name=$1 pattern=$2
  shift 3
  if "$@" >"$work/out" 2>"$work/err"; then
    fail "$name: exited 0"
    return
  fi
  if ! grep -q -- "$pattern" "$work/err"; then
    fail "$name: stderr lacks '$pattern': $(head -c 300 "$work/err")"
    return
  fi
  echo "ok: $name"
}

if ! command -v python3 >/dev/null; then
  echo "SKIP: python3 is not installed (scripts/bootstrap installs it)"
  exit 0
fi

"$kvtier" version >/dev/null || fail "version: exit $?"

expect_json "bench host --json" host hash_ns_per_token match_1m_tokens_us -- \
  "$kvtier" bench host --json --reps 1 --working-set 8MiB
expect_json "bench cache --json -" store reps -- \
  "$kvtier" bench cache --json - --reps 1 --blocks 1 --dir "$work"
expect_json "bench disk --json" disk config -- \
  "$kvtier" bench disk --dir "$work" --bytes 16MiB --chunks 2 --qd 1 --json

if [ -d "$traces/mooncake" ]; then
  expect_json "replay --cache-only --json" policies -- \
    sh -c "'$kvtier' replay --cache-only '$traces/mooncake' --no-min --policy lru \
      --json '$work/replay.json' >/dev/null && cat '$work/replay.json'"
else
  echo "skip: replay (no traces at $traces/mooncake)"
fi

expect_json "plan ttft --json" rows gpu model -- \
  "$kvtier" plan ttft --gpu h100 --model llama-3.1-8b --tokens 1000,10000,100000 --json
expect_json "plan crossover --json" rows definition -- "$kvtier" plan crossover --json
expect_json "plan pool --json" gpu model groups terms -- \
  "$kvtier" plan pool --gpu b300 --model deepseek-v4-pro --json
expect_error "plan names an unknown profile" "unknown GPU profile 'nope'" -- \
  "$kvtier" plan crossover --gpu nope

printf '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\nnot json\n' \
  >"$work/bad.jsonl"
expect_error "malformed trace names file:line" "bad.jsonl:2" -- \
  "$kvtier" replay --cache-only --format mooncake "$work/bad.jsonl"
expect_error "unknown command is named" "unknown command 'no-such-command'" -- \
  "$kvtier" no-such-command
expect_error "bad --working-set is named" "working-set" -- \
  "$kvtier" bench host --working-set lots
expect_error "bench disk without --dir" "dir" -- "$kvtier" bench disk
# 10^8 live trees took 18 GB before the first request: refused at once, naming the option.
expect_error "replay refuses a --concurrency it cannot use" "--concurrency" -- \
  timeout 20 "$kvtier" replay --synthetic 100 --concurrency 100000000

expect_error "disk verify of a missing directory names it" "$work/nope" -- \
  "$kvtier" disk verify "$work/nope"
# Out of memory under a limit: a message and exit 1, not an abort (exit 134). A sanitizer's
# shadow memory alone is larger than any such limit, so a sanitized build skips this.
if [ -n "${KVTIER_SANITIZE:-}" ]; then
  echo "skip: out of memory under ulimit -v (a $KVTIER_SANITIZE build reserves more address space than the limit)"
else
  ( ulimit -v 1000000 && "$kvtier" replay --cache-only --synthetic 100000000000 \
      >"$work/out" 2>"$work/err" ); rc=$?
  if [ "$rc" -ne 1 ] || ! grep -q "out of memory" "$work/err"; then
    fail "out of memory is reported: exit $rc, $(tail -c 300 "$work/err")"
  else
    echo "ok: out of memory is reported"
  fi
  # A command that does not compute does not load OpenBLAS, whose start-up spun for ever under
  # a limit of about 150 MB; the timeout turns a hang into a failure.
  ( ulimit -v 150000 && timeout 20 "$kvtier" version >"$work/out" 2>"$work/err" ); rc=$?
  if [ "$rc" -ne 0 ] || ! grep -q "kvtier" "$work/out"; then
    fail "version under ulimit -v 150000: exit $rc, $(tail -c 300 "$work/err")"
  else
    echo "ok: version under ulimit -v 150000"
  fi
fi

# An unwritable --json is refused before the run, not after it (the demo takes seconds).
start=$(date +%s)
expect_error "demo refuses an unwritable --json first" "cannot write $work/no/such/dir/d.json" -- \
  "$kvtier" demo --model tiny --json "$work/no/such/dir/d.json"
if [ $(( $(date +%s) - start )) -gt 2 ]; then fail "demo ran before refusing its --json path"; fi

mkdir -p "$work/empty"
expect_error "disk verify of a directory without segments says so" "no segment files" -- \
  "$kvtier" disk verify "$work/empty"

# expect_ok_with NAME PATTERN -- COMMAND...: the command exits 0 and says PATTERN on stdout.
expect_ok_with() {
  local name=$1 pattern=$2
  shift 3
  if ! "$@" >"$work/out" 2>"$work/err"; then
    fail "$name: exit $? ($(tail -n 3 "$work/err"))"
    return
  fi
  if ! grep -q -- "$pattern" "$work/out"; then
    fail "$name: stdout lacks '$pattern': $(head -c 300 "$work/out")"
    return
  fi
  echo "ok: $name"
}
# expect_fail_with NAME PATTERN -- COMMAND...: the command exits non-zero, PATTERN on stdout.
expect_fail_with() {
  local name=$1 pattern=$2
  shift 3
  if "$@" >"$work/out" 2>"$work/err"; then
    fail "$name: exited 0 ($(tail -n 3 "$work/out"))"
    return
  fi
  if ! grep -q -- "$pattern" "$work/out"; then
    fail "$name: stdout lacks '$pattern': $(head -c 300 "$work/out")"
    return
  fi
  echo "ok: $name"
}

if [ -n "$disk_fixture" ]; then
  for kind in clean sealed-tail superseded; do
    "$disk_fixture" "$work/disk-$kind" "$kind" || fail "disk_fixture $kind: exit $?"
  done
  expect_ok_with "disk verify of a clean directory" "0 corrupt" -- \
    "$kvtier" disk verify "$work/disk-clean"
  # Only the newest segment can be torn by a crash; an unparsable end of a sealed one is damage.
  expect_fail_with "disk verify: the end of a sealed segment is not a torn tail" \
    "CORRUPT seg-00000001.kvs" -- "$kvtier" disk verify "$work/disk-sealed-tail"
  # A bad copy that a later one replaced is never served: a note, not corruption.
  expect_ok_with "disk verify: a superseded copy is not corruption" "superseded copy" -- \
    "$kvtier" disk verify "$work/disk-superseded"
  cp "$work/disk-clean/seg-00000001.kvs" "$work/disk-clean/seg-00000001.kvs.bak"
  expect_fail_with "disk verify names a file that is not a segment" \
    "STRAY   seg-00000001.kvs.bak" -- "$kvtier" disk verify "$work/disk-clean"
else
  echo "skip: disk verify fixtures (no disk_fixture binary given)"
fi

# The engine commands size their KV pool to the run when --pool-blocks is not given (with 16-token
# blocks, calibrate needs 65 and the default demo 49, more than their defaults of 64 and 16),
# and refuse a given one that is too small, naming the minimum.
expect_json "calibrate --block-tokens 16 sizes its pool" block_tokens prefill -- \
  sh -c "'$kvtier' calibrate --model tiny --block-tokens 16 --reps 1 --json '$work/profile.json' \
    >/dev/null && cat '$work/profile.json'"
expect_error "calibrate with too small a --pool-blocks names the minimum" \
  "pass --pool-blocks 65 or more" -- \
  "$kvtier" calibrate --model tiny --block-tokens 16 --reps 1 --pool-blocks 64
expect_json "demo --block-tokens 16 sizes its pool" turns bit_exact_turns -- \
  sh -c "'$kvtier' demo --model tiny --block-tokens 16 --json '$work/demo.json' >/dev/null \
    && cat '$work/demo.json'"
expect_json "engine run --block-tokens 16 sizes its pool" turns -- \
  sh -c "'$kvtier' engine run --model tiny --block-tokens 16 --turns 2 --json '$work/run.json' \
    >/dev/null && cat '$work/run.json'"
expect_error "engine run with too small a --pool-blocks names the minimum" \
  "pass --pool-blocks 49 or more" -- \
  "$kvtier" engine run --model tiny --block-tokens 16 --pool-blocks 48
expect_json "engine crossover --block-tokens 16 sizes its pool" points regret_pct -- \
  sh -c "'$kvtier' engine crossover --model tiny --block-tokens 16 --max 256 \
    --json '$work/crossover.json' >/dev/null && cat '$work/crossover.json'"

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all CLI checks passed"
