#!/usr/bin/env bash
# usage: run_install_test.sh BUILD_DIR CONSUMER_SRC CXX
set -euo pipefail
build=$1 src=$2 cxx=$3
work=$(mktemp -d "${TMPDIR:-/tmp}/kvtier-install-XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/build" -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_COMPILER="$cxx" >/dev/null
cmake --build "$work/build" -j2 >/dev/null
"$work/build/consumer"
