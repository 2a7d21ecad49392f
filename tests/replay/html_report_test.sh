#!/usr/bin/env bash
# The sweep's HTML page as a person sees it: headless Chromium opens it, takes a screenshot
# (kept at OUT_PNG for a look) and the test fails on any console message (the page has no
# scripts, so any is an error: a parse problem, a missing resource). Also checks the page holds
# its plain-language answer, the knee and the definitions.
# Usage: html_report_test.sh KVTIER_BINARY TRACES_DIR OUT_PNG
set -u
kvtier=$1
traces=$2
out_png=$3
chromium=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chromium" ]; then
  echo "skip: chromium not installed (Debian package 'chromium'; scripts/bootstrap installs it)"
  exit 77
fi
if [ ! -d "$traces/agentx-weka" ]; then
  echo "skip: no traces at $traces/agentx-weka"
  exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# shot PAGE PNG: screenshot PAGE into PNG; Chromium's log (with console messages) in $work/log.
shot() {
  timeout 120 "$chromium" --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --user-data-dir="$work/profile" --window-size=840,2800 --screenshot="$2" \
    --enable-logging=stderr --v=0 "file://$1" >"$work/log" 2>&1
}

# The detector must see a console error when there is one, or a clean run proves nothing.
printf '<!DOCTYPE html><html><body><script>undefinedFunction();</script></body></html>\n' \
  >"$work/broken.html"
shot "$work/broken.html" "$work/broken.png"
if ! grep -q "CONSOLE.*undefinedFunction" "$work/log"; then
  echo "FAIL: chromium did not report the console error of a broken page:"
  cat "$work/log"
  exit 1
fi

"$kvtier" sweep "$traces/agentx-weka" --gpu h200 --model llama-3.1-70b \
  --concurrency-sweep 4,8 --pool 0,1,2,3 --html "$work/sweep.html" >"$work/sweep.out" 2>&1 || {
  echo "FAIL: kvtier sweep"
  cat "$work/sweep.out"
  exit 1
}
failures=0
shot "$work/sweep.html" "$out_png" || {
  echo "FAIL: chromium exited $?"
  cat "$work/log"
  failures=$((failures + 1))
}
if grep "CONSOLE" "$work/log"; then
  echo "FAIL: console messages above"
  failures=$((failures + 1))
fi
size=$(stat -c %s "$out_png" 2>/dev/null || echo 0)
if [ "$size" -lt 20000 ]; then
  echo "FAIL: screenshot $out_png is $size bytes (blank page?)"
  failures=$((failures + 1))
fi
for want in "At C=4 on" "each step adds less than a point" "knee C=" "Pareto frontier" \
  "Definitions" "interactivity_tokens_per_s"; do
  grep -q "$want" "$work/sweep.html" || {
    echo "FAIL: the page lacks '$want'"
    failures=$((failures + 1))
  }
done
[ "$failures" -eq 0 ] || exit 1
echo "html report ok: screenshot at $out_png ($size bytes)"
