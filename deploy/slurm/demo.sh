#!/usr/bin/env bash
# A single-host Slurm cluster from Debian's packages runs an audit of the fixture pair split in
# 4 parts: a job array of audit-parts.sbatch, then audit-merge.sbatch submitted with
# --dependency=afterok on the array, which appends one signed record (docs/scale-out.md).
#   bash deploy/slurm/demo.sh [CKPT_AUDIT]
# CKPT_AUDIT (the argument or the environment) is the ckpt-audit binary; without one the script
# installs the packages when a program is missing and builds ckpt-audit into ./build, as
# deploy/demo.sh does.
# Everything lives under one temporary directory: its own munge key and socket, slurm.conf, state,
# spool and logs; slurmctld and slurmd listen on free ports. An existing cluster or munged, and
# /etc/slurm, are never touched. The daemons started here are stopped on exit, also on failure.
# Prints the merged record's id and verdict; exit 0 when it passes and its log verifies.
# CKPT_SLURM_PARTS (default 4) sets the number of parts, CKPT_SLURM_TIMEOUT (default 240) the
# seconds allowed for the node to come up and the jobs to finish.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=deploy/slurm/cluster.sh
source "$HERE/cluster.sh"
PARTS=${CKPT_SLURM_PARTS:-4}
WAIT_S=${CKPT_SLURM_TIMEOUT:-240}
SLURM_CLUSTER_WAIT_S=$WAIT_S
missing() { slurm_cluster_missing; }
CLI=${1:-${CKPT_AUDIT:-}}
if [ -z "$CLI" ]; then
  if [ -n "$(missing)" ]; then bash "$REPO/deploy/install-deps.sh"; fi
  bash "$REPO/deploy/build.sh" -DCKPT_TESTS=OFF -- ckpt-audit
  CLI=$REPO/build/services/cli/ckpt-audit
fi
if [ -n "$(missing)" ]; then
  echo "missing programs: $(missing | tr '\n' ' ')(deploy/install-deps.sh installs the Debian" \
       "packages munge slurmctld slurmd slurm-client python3)" >&2
  exit 1
fi
CLI=$(realpath "$CLI")
[ -x "$CLI" ] || { echo "not an executable: $CLI" >&2; exit 1; }
TARGET=$REPO/tests/data/mini-kimi-nvfp4
SOURCE=$REPO/tests/data/mini-kimi-mxfp4

# munged insists that every directory above its socket is searchable by all.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-slurm.XXXXXX")
chmod 0711 "$WORK"
mkdir -p "$WORK"/{parts,keys}

# On failure: every job's state, each daemon's log (its stderr when it never opened one) and
# every job's output.
stop_all() {
  local rc=$? f
  trap - EXIT INT TERM
  set +e
  trap '' PIPE
  if [ "$rc" != 0 ]; then
    {
      slurm_cluster_logs
      for f in "$WORK"/parts/*.out; do
        [ -f "$f" ] && { echo "---- ${f#"$WORK"/}"; tail -n 30 "$f"; }
      done
    } >&2
  fi
  slurm_cluster_stop
  rm -rf "$WORK"
  exit "$rc"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() { echo "demo failed: $*" >&2; exit 1; }
alive() { slurm_cluster_alive || exit 1; }

echo "== single-host Slurm cluster under $WORK"
slurm_cluster_start "$WORK" || exit 1
NODE=$SLURM_CLUSTER_NODE
DEADLINE=$((SECONDS + WAIT_S))

echo "== $PARTS-part audit of the fixture pair (${TARGET#"$REPO"/} against ${SOURCE#"$REPO"/})"
# The node's part-signing key, trusted by the merge for parts only, and the record signing key.
"$CLI" keys generate --out "$WORK/keys/node.pem" --trust "$WORK/keys/part-trust" \
  --name "slurm-node-$NODE" >/dev/null
"$CLI" keys generate --out "$WORK/keys/signing.pem" --trust "$WORK/keys/trusted" \
  --name ckpt-slurm-demo >/dev/null
export CKPT_AUDIT=$CLI CKPT_ROOT=$TARGET CKPT_SOURCE=$SOURCE CKPT_PARTS_DIR=$WORK/parts \
  CKPT_NODE_KEY=$WORK/keys/node.pem CKPT_DB=$WORK/evidence.db CKPT_KEY=$WORK/keys/signing.pem \
  CKPT_PART_TRUST=$WORK/keys/part-trust
ARRAY_JOB=$(sbatch --parsable --array="0-$((PARTS - 1))" --chdir="$WORK/parts" \
  --output="$WORK/parts/part-%a.out" "$HERE/audit-parts.sbatch")
ARRAY_JOB=${ARRAY_JOB%%;*}
SLURM_CLUSTER_JOBS+=("$ARRAY_JOB")
MERGE_JOB=$(sbatch --parsable --dependency="afterok:$ARRAY_JOB" --kill-on-invalid-dep=yes \
  --chdir="$WORK/parts" --output="$WORK/parts/merge.out" "$HERE/audit-merge.sbatch")
MERGE_JOB=${MERGE_JOB%%;*}
SLURM_CLUSTER_JOBS+=("$MERGE_JOB")
echo "parts: array job $ARRAY_JOB; merge: job $MERGE_JOB (afterok:$ARRAY_JOB)"

# Finished jobs stay visible to scontrol for MinJobAge (300 s); an empty answer is a slurmctld
# that did not reply this time.
job_state() {
  scontrol show job "$1" -o 2>/dev/null | tr ' ' '\n' | sed -n 's/^JobState=//p' | head -n 1
}
while :; do
  merge_state=$(job_state "$MERGE_JOB")
  case "$merge_state" in
    "" | PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUE* | RESIZING) ;;
    *) break ;;
  esac
  alive
  [ "$SECONDS" -lt "$DEADLINE" ] || { squeue >&2; fail "merge job not done after ${WAIT_S}s"; }
  sleep 1
done
echo "merge job $MERGE_JOB: $merge_state"
[ -s "$WORK/parts/merged.json" ] || fail "the merge wrote no result"

echo "== merged record"
"$CLI" verify-log --db "$WORK/evidence.db" --trust "$WORK/keys/trusted"
python3 - "$WORK/parts/merged.json" "$PARTS" <<'EOF'
import json, sys
merged = json.load(open(sys.argv[1]))
print(f"record {merged['record_id']}: verdict {merged['verdict']} "
      f"({merged['parts']} parts; checks: "
      + ", ".join(f"{c['name']} {c['verdict']}" for c in merged["checks"]) + ")")
if merged["parts"] != int(sys.argv[2]):
    sys.exit(f"the record merges {merged['parts']} parts, not {sys.argv[2]}")
if merged["verdict"] != "pass":
    sys.exit("the merged audit did not pass")
EOF
[ "$merge_state" = COMPLETED ] || fail "merge job $MERGE_JOB ended $merge_state"
