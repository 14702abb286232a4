#!/usr/bin/env bash
# A single-host Slurm cluster from Debian's packages runs an audit of the fixture pair split in
# 4 parts: a job array of audit-parts.sbatch, then audit-merge.sbatch submitted with
# --dependency=afterok on the array, which appends one signed record (docs/scale-out.md).
#   bash deploy/slurm/demo.sh [CKPT_AUDIT]
# CKPT_AUDIT (the argument or the environment) is the ckpt-audit binary; without one the script
# installs the packages when a program is missing and builds ./build like deploy/demo.sh.
# Everything lives under one temporary directory: its own munge key and socket, slurm.conf, state,
# spool and logs; slurmctld and slurmd listen on free ports. An existing cluster or munged, and
# /etc/slurm, are never touched. The daemons started here are stopped on exit, also on failure.
# Prints the merged record's id and verdict; exit 0 when it passes and its log verifies.
# CKPT_SLURM_PARTS (default 4) sets the number of parts, CKPT_SLURM_TIMEOUT (default 240) the
# seconds allowed for the node to come up and the jobs to finish.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PATH=$PATH:/usr/sbin:/sbin  # munged, slurmctld and slurmd live there
# Run inside another cluster's job or shell, its settings must not reach this one's commands.
unset "${!SLURM_@}" "${!SBATCH_@}" "${!SQUEUE_@}" "${!SINFO_@}" "${!SCANCEL_@}"
PARTS=${CKPT_SLURM_PARTS:-4}
WAIT_S=${CKPT_SLURM_TIMEOUT:-240}
PROGRAMS="munged mungekey slurmctld slurmd sbatch squeue sinfo scontrol scancel python3"

missing() {
  local p
  for p in $PROGRAMS; do command -v "$p" >/dev/null || echo "$p"; done
}
CLI=${1:-${CKPT_AUDIT:-}}
if [ -z "$CLI" ]; then
  if [ -n "$(missing)" ]; then bash "$REPO/deploy/install-deps.sh"; fi
  bash "$REPO/deploy/build.sh"
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
mkdir -p "$WORK"/{munge,state,spool,log,parts,keys}
PIDS=()
JOBS=()
export SLURM_CONF=$WORK/slurm.conf

# On failure: every job's state, then each daemon's log (its stderr when it never opened one) and
# every job's output.
show_logs() {
  local f j
  [ "${#JOBS[@]}" = 0 ] || echo "---- jobs"
  for j in "${JOBS[@]}"; do
    scontrol show job "$j" -o 2>/dev/null | awk '{
      for (i = 1; i <= NF; i++)
        if ($i ~ /^(JobId|ArrayTaskId|JobState|Reason|ExitCode)=/) printf "%s ", $i
      print "" }'
  done
  for f in munged slurmctld slurmd; do
    if [ -s "$WORK/log/$f.log" ]; then f=$WORK/log/$f.log; else f=$WORK/log/$f.out; fi
    [ -f "$f" ] && { echo "---- ${f#"$WORK"/} (last 30 lines)"; tail -n 30 "$f"; }
  done
  for f in "$WORK"/parts/*.out; do
    [ -f "$f" ] && { echo "---- ${f#"$WORK"/}"; tail -n 30 "$f"; }
  done
}
stop_all() {
  local rc=$? i
  trap - EXIT INT TERM
  # Nothing may keep the daemons alive: no errexit here, and a closed output is no reason to stop.
  set +e
  trap '' PIPE
  if [ "$rc" != 0 ]; then show_logs >&2; fi
  # Cancel jobs first: their slurmstepd processes outlive slurmd otherwise.
  if [ "${#JOBS[@]}" != 0 ]; then
    scancel --full --quiet "${JOBS[@]}" 2>/dev/null || true
    for _ in $(seq 20); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do kill "${PIDS[i]}" 2>/dev/null || true; done
  for i in "${PIDS[@]}"; do wait "$i" 2>/dev/null || true; done
  rm -rf "$WORK"
  exit "$rc"
}
trap stop_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fail() { echo "demo failed: $*" >&2; exit 1; }
alive() {
  local p
  for p in "${PIDS[@]}"; do kill -0 "$p" 2>/dev/null || fail "a daemon exited (pid $p)"; done
}

echo "== single-host Slurm cluster under $WORK"
mungekey --create --keyfile="$WORK/munge/munge.key"
munged --foreground --socket="$WORK/munge/socket" --key-file="$WORK/munge/munge.key" \
  --pid-file="$WORK/munge/munged.pid" --seed-file="$WORK/munge/seed" --origin=127.0.0.1 \
  --log-file="$WORK/log/munged.log" >"$WORK/log/munged.out" 2>&1 &
PIDS+=($!)

# Two ports nothing listens on now (the kernel picks them; released just before use).
read -r CTLD_PORT SLURMD_PORT < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("", 0))
print(*(s.getsockname()[1] for s in socks))')
NODE=$(uname -n)
NODE=${NODE%%.*}
CPUS=$(nproc)
if [ "$CPUS" -gt 2 ]; then CPUS=2; fi
USER_NAME=$(id -un)
# Root runs both daemons as root (as on a real cluster); anyone else runs them as themselves,
# which can only start jobs of that same user.
cat >"$SLURM_CONF" <<EOF
ClusterName=ckptdemo
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$WORK/munge/socket
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
PlugStackConfig=$WORK/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=256 State=UNKNOWN
PartitionName=audit Nodes=$NODE Default=YES MaxTime=30 State=UP
EOF
: >"$WORK/plugstack.conf"
echo "slurmctld :$CTLD_PORT, slurmd :$SLURMD_PORT, node $NODE ($CPUS CPUs), SLURM_CONF=$SLURM_CONF"

for _ in $(seq 50); do [ -S "$WORK/munge/socket" ] && break; alive; sleep 0.1; done
slurmctld -D -c -f "$SLURM_CONF" >"$WORK/log/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" -N "$NODE" >"$WORK/log/slurmd.out" 2>&1 &
PIDS+=($!)

DEADLINE=$((SECONDS + WAIT_S))
state=""
until [ "$state" = idle ]; do
  alive
  [ "$SECONDS" -lt "$DEADLINE" ] || fail "node $NODE not idle after ${WAIT_S}s (state: $state)"
  sleep 0.5
  state=$(sinfo -h -N -n "$NODE" -o %t 2>/dev/null || true)
done
echo "node $NODE is idle"

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
JOBS+=("$ARRAY_JOB")
MERGE_JOB=$(sbatch --parsable --dependency="afterok:$ARRAY_JOB" --kill-on-invalid-dep=yes \
  --chdir="$WORK/parts" --output="$WORK/parts/merge.out" "$HERE/audit-merge.sbatch")
MERGE_JOB=${MERGE_JOB%%;*}
JOBS+=("$MERGE_JOB")
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
