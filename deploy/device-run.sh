#!/usr/bin/env bash
# GPU tests and the block-forward benchmark on the device machine (docs/forward.md).
#
#   bash deploy/device-run.sh --pack   # here: build, collect binaries + their shared libraries
#                                      # into .device-bin/ (ignored; carried to the device)
#   bash deploy/device-run.sh          # on the device: run everything, logs into $OUT
#   bash deploy/device-run.sh --audit-bench  # on the device: GPU tests, then bench_audit
#                                            # instead of the forward benchmarks
#   bash deploy/device-run.sh --model-audit  # on the device: GPU tests, every-layer forwards,
#                                            # the signed audit on the GPU, the benchmarks
#
# The device has no Debian packages, so the Abseil/OpenSSL/libstdc++ libraries the binaries
# were linked against travel in .device-bin/lib; the CUDA runtime is linked statically.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--pack" ]; then
  build=${BUILD_DIR:-build-fwd}
  ninja -C "$build" -j2 gpu_test moe_bench bench_audit daemon_slow_test || exit 2
  ninja -C "$build" -j2 ckpt-audit || echo "ckpt-audit did not build; packing without it"
  rm -rf .device-bin && mkdir -p .device-bin/lib
  for b in tests/gpu/gpu_test bench/forward/moe_bench bench/audit/bench_audit \
           services/cli/ckpt-audit tests/daemon/daemon_slow_test; do
    [ -x "$build/$b" ] && strip -o ".device-bin/$(basename "$b")" "$build/$b"
  done
  for b in .device-bin/*; do [ -f "$b" ] && ldd "$b"; done | awk '/=> \// {print $3}' | sort -u |
    grep -v -E '/(libc|libm|libgcc_s|ld-linux[^/]*)\.so' | xargs -r -I{} cp -L {} .device-bin/lib/
  du -sh .device-bin
  exit 0
fi

OUT=${OUT:-/tmp/device-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/.device-bin/lib"
# The test binary reads fixtures from the path it was built at (BUILT_AT/tests/data).
built_at=${BUILT_AT:-/work/main}
if [ ! -e "$built_at" ]; then mkdir -p "$(dirname "$built_at")" && ln -s "$PWD" "$built_at"; fi

{ date -u; nvidia-smi; } > "$OUT/nvidia-smi.txt" 2>&1
.device-bin/gpu_test 2>&1 | tee "$OUT/gpu_test.log"
if [ -x .device-bin/ckpt-audit ]; then
  for d in nvfp4 x4t; do
    echo "== ckpt-audit forward --root tests/data/mini-kimi-$d --source tests/data/mini-kimi-mxfp4 --layer 1 --tokens 8 --seed 3 --device cuda --json"
    .device-bin/ckpt-audit forward --root "tests/data/mini-kimi-$d" --source tests/data/mini-kimi-mxfp4 \
      --layer 1 --tokens 8 --seed 3 --device cuda --json
    echo "exit code $?"
  done > "$OUT/forward_cuda.log" 2>&1
fi
if [ "${1:-}" = "--model-audit" ]; then  # issue 11: whole-model forwards and the GPU audit
  cli=.device-bin/ckpt-audit
  src=tests/data/mini-kimi-mxfp4
  for d in nvfp4 x4t; do
    echo "== ckpt-audit forward --root tests/data/mini-kimi-$d --source $src --layers all --tokens 8 --seed 3 --device cuda --emulate vllm-w13-collapse"
    $cli forward --root "tests/data/mini-kimi-$d" --source $src --layers all --tokens 8 --seed 3 \
      --device cuda --emulate vllm-w13-collapse
    echo "exit code $?"
  done > "$OUT/forward_layers.log" 2>&1
  ev=/tmp/evidence && rm -rf $ev && mkdir -p $ev
  {
    $cli keys generate --out $ev/key.pem --trust $ev/trusted
    for d in nvfp4 x4t; do
      map=""  # the X4T fixture declares checkpoint_root /x4t
      [ $d = x4t ] && map="--map-root /x4t=$(realpath tests/data/mini-kimi-x4t)"
      echo "== ckpt-audit audit tests/data/mini-kimi-$d --source $src --forward-layers all --device cuda $map --db $ev/log.db --key $ev/key.pem --json"
      $cli audit "tests/data/mini-kimi-$d" --source $src --forward-layers all --device cuda $map \
        --db $ev/log.db --key $ev/key.pem --json
      echo "exit code $?"
    done
    echo "== ckpt-audit verify-log --db $ev/log.db --trust $ev/trusted"
    $cli verify-log --db $ev/log.db --trust $ev/trusted
    echo "== ckpt-audit report --db $ev/log.db 0 --format json --trust $ev/trusted"
    $cli report --db $ev/log.db 0 --format json --trust $ev/trusted
  } > "$OUT/gpu_audit.log" 2>&1
  $cli report --db $ev/log.db 0 --format html --trust $ev/trusted > "$OUT/report.html" 2>&1
  # StartAudit with device "cuda" through the daemon's GPU worker (tests/daemon).
  .device-bin/daemon_slow_test --gtest_filter='DaemonTest.ForwardLayers*' > "$OUT/daemon_gpu.log" 2>&1
  .device-bin/moe_bench --iters 20 > "$OUT/bench.json" 2> "$OUT/bench.err"
  echo "moe_bench exit code $?" >> "$OUT/bench.err"
  cat "$OUT/bench.err" >> "$OUT/forward_layers.log" && rm "$OUT/bench.err" "$OUT/forward_cuda.log"
  exit 0
fi
if [ "${1:-}" = "--audit-bench" ]; then  # only the pair-audit benchmark (docs/PERFORMANCE.md)
  .device-bin/bench_audit --size-gib 2 --threads "$(nproc)" --dir /tmp/bench-audit 2>&1 | tee "$OUT/bench_audit.log"
  exit 0
fi
.device-bin/moe_bench --iters 20 > "$OUT/bench.json" 2> "$OUT/bench.err"
echo "moe_bench exit code $?" >> "$OUT/bench.err"
PYTHONUNBUFFERED=1 python3 bench/forward/torch_reference.py --ours "$OUT/bench.json" --iters 5 \
  2>&1 | tee "$OUT/torch_compare.json"
