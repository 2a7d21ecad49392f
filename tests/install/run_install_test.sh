#!/usr/bin/env bash
# usage: run_install_test.sh BUILD_DIR SRC_DIR CXX CC
# Installs kvtier into a temporary prefix, builds a tiny C++ engine (find_package(kvtier), the
# static library) and a C11 one (the C API in libkvtier.so) against it, and runs both, the C one
# in process and through the installed `kvtier serve` on a private socket; checks that
# libkvtier.so exports nothing but kvtier_* symbols.
set -euo pipefail
build=$1 src=$2 cxx=$3 cc=$4
work=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-install-XXXXXX")
daemon=""
trap '[ -n "$daemon" ] && kill "$daemon" 2>/dev/null; rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src/consumer" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$work/build" -j2 >/dev/null
"$work/build/consumer"

lib=$(ls "$work"/prefix/lib*/libkvtier.so.2)
soname=$(objdump -p "$lib" | awk '/SONAME/ {print $2}')
[ "$soname" = "libkvtier.so.2" ] || { echo "libkvtier.so: SONAME is '$soname'" >&2; exit 1; }
foreign=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ && $3 !~ /^kvtier_/ {print $3}')
[ -z "$foreign" ] || { echo "libkvtier.so exports non-kvtier_ symbols: $foreign" >&2; exit 1; }

cmake -S "$src/c_consumer" -B "$work/cbuild" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_C_COMPILER="$cc" >/dev/null
cmake --build "$work/cbuild" -j2 >/dev/null
LD_LIBRARY_PATH="$(dirname "$lib")" "$work/cbuild/c_consumer"

# Through the daemon: its layout is the C program's.
cat >"$work/serve.yaml" <<YAML
model_id: c-consumer
layout: {num_layers: 2, num_kv_heads: 2, head_dim: 16, dtype: fp16, block_tokens: 16}
tiers: [{kind: host, capacity: 1MiB}]
serve: {events_addr: "tcp://127.0.0.1:*"}
YAML
"$work/prefix/bin/kvtier" serve --config "$work/serve.yaml" --socket "$work/kv.sock" \
  >"$work/serve.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$work/kv.sock" ] && break; sleep 0.1; done
[ -S "$work/kv.sock" ] || { echo "kvtier serve did not start:" >&2; cat "$work/serve.log" >&2; exit 1; }
LD_LIBRARY_PATH="$(dirname "$lib")" "$work/cbuild/c_consumer" --daemon "$work/kv.sock"
kill -TERM "$daemon"
wait "$daemon" || { echo "kvtier serve did not exit 0 on SIGTERM:" >&2; cat "$work/serve.log" >&2; exit 1; }
daemon=""

# A grouped layout (doc/config.md), declared by the C program through layout_yaml.
cat >"$work/grouped.yaml" <<YAML
model_id: c-consumer
layout:
  block_tokens: 16
  groups:
    - {kind: sliding_window, num_layers: 2, num_kv_heads: 2, head_dim: 16, dtype: fp16, window: 8, page_tokens: 4}
    - {kind: full, num_layers: 2, num_kv_heads: 2, head_dim: 16, dtype: fp16}
tiers: [{kind: host, capacity: 1MiB}]
YAML
"$work/prefix/bin/kvtier" serve --config "$work/grouped.yaml" --socket "$work/kvg.sock" \
  >"$work/grouped.log" 2>&1 &
daemon=$!
for _ in $(seq 100); do [ -S "$work/kvg.sock" ] && break; sleep 0.1; done
[ -S "$work/kvg.sock" ] || { echo "kvtier serve did not start:" >&2; cat "$work/grouped.log" >&2; exit 1; }
LD_LIBRARY_PATH="$(dirname "$lib")" "$work/cbuild/c_consumer" --grouped-daemon "$work/kvg.sock"
kill -TERM "$daemon"
wait "$daemon" || { echo "kvtier serve did not exit 0 on SIGTERM:" >&2; cat "$work/grouped.log" >&2; exit 1; }
daemon=""
