#!/usr/bin/env bash
# Configures and builds ckpt-audit into ./build (Release with debug info, Ninja).
#   deploy/build.sh [CMAKE_ARGS...] [-- TARGETS...]
# With no targets, everything (tests and benchmarks included unless -DCKPT_TESTS=OFF).
set -euo pipefail
cd "$(dirname "$0")/.."
args=() targets=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then shift; targets=("$@"); break; fi
  args+=("$1"); shift
done
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCKPT_TESTS=ON "${args[@]}" >/dev/null
cmake --build build -j"$(nproc)" ${targets[@]:+--target "${targets[@]}"}
