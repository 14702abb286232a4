#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test through ctest. GPU tests skip (with the
# reason printed) where no CUDA device is present.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bash deploy/build.sh
cd build
ctest --output-on-failure -j"$(nproc)" --timeout 600
