# A private single-host Slurm cluster from Debian's packages, for deploy/slurm/demo.sh and the
# tests that need a real Slurm (docs/scale-out.md). Source it, then:
#   slurm_cluster_missing            prints the programs that are not installed, one a line
#   slurm_cluster_start WORK         starts munged, slurmctld and slurmd under WORK (an empty
#                                    directory, mode 0711) on free ports and waits, at most
#                                    $SLURM_CLUSTER_WAIT_S (default 240) seconds, until the node is
#                                    idle; exports SLURM_CONF; sets SLURM_CLUSTER_NODE
#   slurm_cluster_alive              fails if one of the daemons exited
#   slurm_cluster_logs               every job's state and each daemon's log tail, for failures
#   slurm_cluster_stop               scancels every job of this cluster, waits for them, stops
#                                    the daemons started here
# SLURM_CLUSTER_JOBS: job ids whose state slurm_cluster_logs shows (add yours).
# Nothing outside WORK is touched: its own munge key and socket, slurm.conf, state, spool and
# logs; an existing cluster, munged or /etc/slurm are never used. Root runs both daemons as root
# (as on a real cluster); anyone else runs them as themselves, which starts only their own jobs.
# Settings of an outer cluster (SLURM_*, SBATCH_*, ...) are cleared so they cannot redirect the
# commands to another cluster.
PATH=$PATH:/usr/sbin:/sbin  # munged, slurmctld and slurmd live there
unset "${!SLURM_@}" "${!SBATCH_@}" "${!SQUEUE_@}" "${!SINFO_@}" "${!SCANCEL_@}"
SLURM_CLUSTER_PROGRAMS="munged mungekey slurmctld slurmd sbatch squeue sinfo scontrol scancel
  python3"
SLURM_CLUSTER_PIDS=()
SLURM_CLUSTER_JOBS=()
SLURM_CLUSTER_WORK=""

slurm_cluster_missing() {
  local p
  for p in $SLURM_CLUSTER_PROGRAMS; do command -v "$p" >/dev/null || echo "$p"; done
}

slurm_cluster_fail() { echo "slurm cluster: $*" >&2; return 1; }

slurm_cluster_alive() {
  local p
  for p in "${SLURM_CLUSTER_PIDS[@]}"; do
    kill -0 "$p" 2>/dev/null || { slurm_cluster_fail "a daemon exited (pid $p)"; return 1; }
  done
}

slurm_cluster_start() {
  local work=$1 ctld_port slurmd_port cpus user_name state="" deadline
  SLURM_CLUSTER_WORK=$work
  mkdir -p "$work"/{munge,state,spool,log}
  export SLURM_CONF=$work/slurm.conf
  mungekey --create --keyfile="$work/munge/munge.key"
  munged --foreground --socket="$work/munge/socket" --key-file="$work/munge/munge.key" \
    --pid-file="$work/munge/munged.pid" --seed-file="$work/munge/seed" --origin=127.0.0.1 \
    --log-file="$work/log/munged.log" >"$work/log/munged.out" 2>&1 &
  SLURM_CLUSTER_PIDS+=($!)
  # Two ports nothing listens on now (the kernel picks them; released just before use).
  read -r ctld_port slurmd_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("", 0))
print(*(s.getsockname()[1] for s in socks))')
  SLURM_CLUSTER_NODE=$(uname -n)
  SLURM_CLUSTER_NODE=${SLURM_CLUSTER_NODE%%.*}
  cpus=$(nproc)
  if [ "$cpus" -gt 2 ]; then cpus=2; fi
  user_name=$(id -un)
  cat >"$SLURM_CONF" <<CONF
ClusterName=ckptdemo
SlurmctldHost=$SLURM_CLUSTER_NODE(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=$user_name
SlurmdUser=$user_name
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$work/munge/socket
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/log/slurmctld.log
SlurmdLogFile=$work/log/slurmd.log
PlugStackConfig=$work/plugstack.conf
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
NodeName=$SLURM_CLUSTER_NODE NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=256 State=UNKNOWN
PartitionName=audit Nodes=$SLURM_CLUSTER_NODE Default=YES MaxTime=30 State=UP
CONF
  : >"$work/plugstack.conf"
  echo "slurmctld :$ctld_port, slurmd :$slurmd_port, node $SLURM_CLUSTER_NODE ($cpus CPUs)," \
       "SLURM_CONF=$SLURM_CONF"
  for _ in $(seq 50); do
    [ -S "$work/munge/socket" ] && break
    slurm_cluster_alive || return 1
    sleep 0.1
  done
  slurmctld -D -c -f "$SLURM_CONF" >"$work/log/slurmctld.out" 2>&1 &
  SLURM_CLUSTER_PIDS+=($!)
  slurmd -D -f "$SLURM_CONF" -N "$SLURM_CLUSTER_NODE" >"$work/log/slurmd.out" 2>&1 &
  SLURM_CLUSTER_PIDS+=($!)
  deadline=$((SECONDS + ${SLURM_CLUSTER_WAIT_S:-240}))
  until [ "$state" = idle ]; do
    slurm_cluster_alive || return 1
    if [ "$SECONDS" -ge "$deadline" ]; then
      slurm_cluster_fail "node $SLURM_CLUSTER_NODE not idle in time (state: $state)"
      return 1
    fi
    sleep 0.5
    state=$(sinfo -h -N -n "$SLURM_CLUSTER_NODE" -o %t 2>/dev/null || true)
  done
  echo "node $SLURM_CLUSTER_NODE is idle"
}

slurm_cluster_logs() {
  local f j
  [ "${#SLURM_CLUSTER_JOBS[@]}" = 0 ] || echo "---- jobs"
  for j in "${SLURM_CLUSTER_JOBS[@]}"; do
    scontrol show job "$j" -o 2>/dev/null | awk '{
      for (i = 1; i <= NF; i++)
        if ($i ~ /^(JobId|ArrayTaskId|JobState|Reason|ExitCode)=/) printf "%s ", $i
      print "" }'
  done
  for f in munged slurmctld slurmd; do
    if [ -s "$SLURM_CLUSTER_WORK/log/$f.log" ]; then
      f=$SLURM_CLUSTER_WORK/log/$f.log
    else
      f=$SLURM_CLUSTER_WORK/log/$f.out
    fi
    [ -f "$f" ] && { echo "---- ${f#"$SLURM_CLUSTER_WORK"/} (last 30 lines)"; tail -n 30 "$f"; }
  done
}

# Never stops early: no errexit here, and a closed output is no reason to leave daemons behind.
slurm_cluster_stop() {
  local i
  set +e
  trap '' PIPE
  # Cancel jobs first: their slurmstepd processes outlive slurmd otherwise. SLURM_CONF names
  # this cluster, so these are its jobs only.
  if [ "${#SLURM_CLUSTER_PIDS[@]}" != 0 ]; then
    # shellcheck disable=SC2046  # job ids are words
    scancel --full --quiet $(squeue -h -o %A 2>/dev/null) 2>/dev/null || true
    for _ in $(seq 20); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.5
    done
  fi
  for ((i = ${#SLURM_CLUSTER_PIDS[@]} - 1; i >= 0; i--)); do
    kill "${SLURM_CLUSTER_PIDS[i]}" 2>/dev/null || true
  done
  for i in "${SLURM_CLUSTER_PIDS[@]}"; do wait "$i" 2>/dev/null || true; done
  SLURM_CLUSTER_PIDS=()
}
