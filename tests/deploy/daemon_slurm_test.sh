#!/usr/bin/env bash
# Starts the private single-host Slurm cluster (deploy/slurm/cluster.sh) and runs the gtest
# binary daemon_slurm_test against it (docs/daemon.md "Slurm executor"); stops the cluster on
# exit, showing its logs when the tests failed.
#   bash tests/deploy/daemon_slurm_test.sh BUILD/tests/deploy/daemon_slurm_test [GTEST_ARGS...]
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=deploy/slurm/cluster.sh
source "$HERE/../../deploy/slurm/cluster.sh"
TEST=$(realpath "$1")
shift
if [ -n "$(slurm_cluster_missing)" ]; then
  echo "missing programs: $(slurm_cluster_missing | tr '\n' ' ')" >&2
  exit 1
fi
# munged insists that every directory above its socket is searchable by all.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/ckpt-slurm-daemon.XXXXXX")
chmod 0711 "$WORK"
finish() {
  local rc=$?
  trap - EXIT INT TERM
  set +e
  if [ "$rc" != 0 ]; then slurm_cluster_logs >&2; fi
  slurm_cluster_stop
  rm -rf "$WORK"
  exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
SLURM_CLUSTER_WAIT_S=120 slurm_cluster_start "$WORK/cluster"
mkdir "$WORK/tmp"
chmod 0755 "$WORK/tmp"
TMPDIR=$WORK/tmp "$TEST" "$@"
