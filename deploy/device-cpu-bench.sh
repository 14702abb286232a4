#!/usr/bin/env bash
# CPU benchmarks on the device machine's idle 16-core host (docs/PERFORMANCE.md): the
# fingerprint engine, the pair audit, and the daemon under load pinned to 2 cores (the issue's
# "otherwise idle 2-core VM", which the shared development VM never is).
#
#   bash deploy/device-cpu-bench.sh --pack   # here, after `deploy/device-run.sh --pack`: build,
#                                            # collect binaries + the shared libraries that
#                                            # .device-bin/lib lacks into .device-cpu/ (ignored)
#   bash deploy/device-cpu-bench.sh          # on the device (carry .device-bin and .device-cpu):
#                                            # run them, one log $OUT/cpu_bench.log
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--pack" ]; then
  build=${BUILD_DIR:-build}
  ninja -C "$build" -j2 bench_fingerprint bench_audit bench_daemon_load ckpt-audit ckpt-auditd || exit 2
  rm -rf .device-cpu && mkdir -p .device-cpu/lib
  for b in bench/fingerprint/bench_fingerprint bench/audit/bench_audit \
           bench/daemon/bench_daemon_load services/cli/ckpt-audit services/daemon/ckpt-auditd; do
    strip -o ".device-cpu/$(basename "$b")" "$build/$b"
  done
  cp "$(command -v openssl)" .device-cpu/  # the fingerprint bench's baseline
  for b in .device-cpu/*; do [ -f "$b" ] && ldd "$b"; done | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libgcc_s|ld-linux[^/]*)\.so' | while read -r lib; do
      [ -e ".device-bin/lib/$(basename "$lib")" ] || cp -L "$lib" .device-cpu/lib/
    done
  # The load bench starts the daemon and the CLI from the build tree it was compiled in.
  grep -a -o '/work/[a-z-]*/build' .device-cpu/bench_daemon_load | head -1 > .device-cpu/build-dir
  du -sh .device-cpu
  exit 0
fi

OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.device-cpu/lib:$PWD/.device-bin/lib" PATH="$PWD/.device-cpu:$PATH"
build_dir=$(cat .device-cpu/build-dir)
mkdir -p "$build_dir/services/cli" "$build_dir/services/daemon" "$(dirname "$build_dir")/tests"
cp .device-cpu/ckpt-audit "$build_dir/services/cli/"
cp .device-cpu/ckpt-auditd "$build_dir/services/daemon/"
[ -e "$(dirname "$build_dir")/tests/data" ] || ln -s "$PWD/tests/data" "$(dirname "$build_dir")/tests/data"

log="$OUT/cpu_bench.log"
{ date -u; lscpu | grep -E 'Model name|^CPU\(s\)'; uptime; } > "$log" 2>&1
{
  echo "== taskset -c 0,1 bench_daemon_load --clients 64 --calls 200 --seconds 60"
  taskset -c 0,1 .device-cpu/bench_daemon_load --clients 64 --calls 200 --seconds 60
  echo "== ... --methods QueryAudits,GetRecord,GetInclusionProof,GetJob"
  taskset -c 0,1 .device-cpu/bench_daemon_load --clients 64 --calls 200 --seconds 60 \
    --methods QueryAudits,GetRecord,GetInclusionProof,GetJob
  echo "== ... --calls 40 --methods Gate"
  taskset -c 0,1 .device-cpu/bench_daemon_load --clients 64 --calls 40 --seconds 60 --methods Gate
} >> "$log" 2>&1
echo "== bench_audit --size-gib 2 --threads $(nproc) --dir /tmp/bench-audit" >> "$log"
.device-cpu/bench_audit --size-gib 2 --threads "$(nproc)" --dir /tmp/bench-audit --keep >> "$log" 2>&1
# The transcoder's dtype-ordered shards in a window far smaller than a shard (read-ahead of
# small partner tensors, docs/audit-engine.md "Memory").
echo "== bench_audit --size-gib 2 --threads $(nproc) --memory-window 67108864" >> "$log"
.device-cpu/bench_audit --size-gib 2 --threads "$(nproc)" --memory-window 67108864 \
  --dir /tmp/bench-audit >> "$log" 2>&1
rm -rf /tmp/bench-audit
for t in 16 4; do
  echo "== bench_fingerprint --size-gib 4 --threads $t --dir /tmp/fpbench"
  .device-cpu/bench_fingerprint --size-gib 4 --threads "$t" --dir /tmp/fpbench
done >> "$log" 2>&1
