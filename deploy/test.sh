#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through ctest. GPU tests skip (with the
# reason printed) where no CUDA device is present.
#   deploy/test.sh           everything (what CI runs)
#   deploy/test.sh --quick   no install; builds, then runs only the tests labelled quick (unit
#                            tests that start no daemon or registry; docs/testing.md)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --quick ]; then
  bash deploy/build.sh
  cd build
  exec ctest --output-on-failure -j"$(nproc)" --timeout 600 -L quick
fi
bash deploy/install-deps.sh
bash deploy/build.sh
cd build
# Two tests per core: most of them wait on processes, sockets and disks (docs/testing.md).
ctest --output-on-failure -j"$(( $(nproc) * 2 ))" --timeout 600
