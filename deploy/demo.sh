#!/usr/bin/env bash
# The main job on real data: installs what the two binaries need, builds only them, and audits
# the bundled example checkpoints (tests/data: an MXFP4 source, its NVFP4 transcode and its X4T
# container). Evidence goes to a fresh demo log under build/demo/; the last lines are the signed
# audit's report. deploy/test.sh installs and builds everything else.
set -euo pipefail
cd "$(dirname "$0")/.."
bash deploy/install-deps.sh --demo
bash deploy/build.sh -DCKPT_TESTS=OFF -- ckpt-audit ckpt-auditd
CLI=build/services/cli/ckpt-audit
DATA=tests/data
DEMO=build/demo
rm -rf "$DEMO" && mkdir -p "$DEMO"

step() { printf '\n== %s\n' "$*"; }
step "what the source checkpoint holds"
"$CLI" inspect "$DATA/mini-kimi-mxfp4"
step "is the NVFP4 transcode lossless? is the X4T container?"
"$CLI" verify-pair --source "$DATA/mini-kimi-mxfp4" --derived "$DATA/mini-kimi-nvfp4"
"$CLI" verify-pair --source "$DATA/mini-kimi-mxfp4" --derived "$DATA/mini-kimi-x4t" \
  --map-root "/x4t=$PWD/$DATA/mini-kimi-x4t"
step "do source and transcode compute the same bits? (layer 1 block, CPU reference)"
"$CLI" forward --root "$DATA/mini-kimi-nvfp4" --source "$DATA/mini-kimi-mxfp4" --layer 1 --tokens 8
step "signed audit of the transcode against its source"
"$CLI" keys generate --out "$DEMO/key.pem" --trust "$DEMO/trusted" >/dev/null
"$CLI" audit "$DATA/mini-kimi-nvfp4" --source "$DATA/mini-kimi-mxfp4" --forward-layer 1 \
  --db "$DEMO/evidence.db" --key "$DEMO/key.pem"
"$CLI" verify-log --db "$DEMO/evidence.db" --trust "$DEMO/trusted"
step "report"
"$CLI" report 0 --db "$DEMO/evidence.db" --trust "$DEMO/trusted" --format text
"$CLI" report 0 --db "$DEMO/evidence.db" --trust "$DEMO/trusted" --format html -o "$DEMO/report.html"
echo "HTML report: $DEMO/report.html"
