#!/usr/bin/env bash
# The main job on real data: installs, builds, and audits the bundled example checkpoints.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh
bash deploy/build.sh
CLI=build/services/cli/ckpt-audit
for root in tests/data/mini-kimi-mxfp4 tests/data/mini-kimi-nvfp4 tests/data/mini-kimi-x4t; do
  "$CLI" inspect "$root"
  echo
done
