#!/usr/bin/env bash
# Installs the Debian 12 packages ckpt-audit needs. Idempotent: apt-get skips what is installed.
#   deploy/install-deps.sh          everything: build, test and benchmark
#   deploy/install-deps.sh --demo   only what building and running ckpt-audit and ckpt-auditd
#                                   needs (deploy/demo.sh)
# ccache caches compiles across clones and mold links (CMakeLists.txt). Test parts: munge, slurmctld, slurmd and
# slurm-client run the single-host Slurm cluster of deploy/slurm/demo.sh (docs/scale-out.md);
# python3-yaml parses deploy/k8s/*.yaml in its test; docker-registry and skopeo are the real
# registry the OCI tests start on loopback; softhsm2 is the PKCS#11 token of the HSM key tests
# and opensc's pkcs11-tool their independent reader of it (docs/evidence.md). libcurl and libzstd
# read OCI registries and their tar+zstd layers; libp11-kit-dev has the PKCS#11 header.
set -euo pipefail
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
export DEBIAN_FRONTEND=noninteractive
build=(build-essential cmake ninja-build pkg-config git ca-certificates ccache mold
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libcli11-dev nlohmann-json3-dev libssl-dev openssl libsqlite3-dev sqlite3
  zlib1g-dev prometheus-cpp-dev libcurl4-openssl-dev libzstd-dev libp11-kit-dev)
tests=(libgtest-dev libgmock-dev libbenchmark-dev clang libclang-rt-14-dev
  golang-go golang-golang-x-mod-dev chromium fonts-dejavu-core python3 python3-yaml
  munge slurmctld slurmd slurm-client docker-registry skopeo softhsm2 opensc)
$SUDO apt-get update -qq
if [ "${1:-}" = --demo ]; then
  $SUDO apt-get install -y -qq --no-install-recommends "${build[@]}"
  exit 0
fi
$SUDO apt-get install -y -qq --no-install-recommends "${build[@]}" "${tests[@]}"
# The independent Node client test (tests/node): Debian's nodejs and npm unless a node with npm
# is already installed, then the packages pinned by tests/node/package-lock.json.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm
fi
(cd "$(dirname "$0")/../tests/node" && npm ci --no-audit --no-fund --loglevel=error)
