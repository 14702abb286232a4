#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang + ASan/UBSan into ./build-fuzz and runs
# each for FUZZ_SECONDS (default 300) on one core, seeded from tests/data. See docs/FUZZING.md.
# New corpus entries go to build-fuzz/corpus/<target>; crashes to build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH="${FUZZ_SECONDS:-300}"
SAN="-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer"
cmake -S . -B build-fuzz -G Ninja -DCKPT_FUZZ=ON -DCKPT_CUDA=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_CXX_FLAGS="$SAN" >/dev/null
ninja -C build-fuzz -j"${FUZZ_BUILD_JOBS:-2}" fuzz_safetensors_header fuzz_checkpoint_open

mkdir -p build-fuzz/corpus/header build-fuzz/corpus/checkpoint build-fuzz/artifacts
seeds=build-fuzz/seeds
rm -rf "$seeds" && mkdir -p "$seeds/header" "$seeds/checkpoint"
cp tests/data/malformed/*.safetensors "$seeds/header/"
# Checkpoint seeds: selector byte (0 index, 1 config, 2 X4T manifest, 3 X4T contract) + JSON.
i=0
for pair in "0:tests/data/mini-kimi-mxfp4/model.safetensors.index.json" \
            "1:tests/data/mini-kimi-mxfp4/config.json" \
            "1:tests/data/mini-kimi-nvfp4/config.json" \
            "2:tests/data/mini-kimi-x4t/manifest.json" \
            "3:tests/data/mini-kimi-x4t/build-contract.json"; do
  sel="${pair%%:*}"; file="${pair#*:}"
  { printf "\\x0$sel"; cat "$file"; } > "$seeds/checkpoint/seed-$i"
  i=$((i + 1))
done

run() {  # run TARGET CORPUS SEEDS
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1 \
    "build-fuzz/tests/fuzz/$1" -max_total_time="$SECONDS_EACH" \
    -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix=build-fuzz/artifacts/"$1"- "$2" "$3"
}
run fuzz_safetensors_header build-fuzz/corpus/header "$seeds/header"
run fuzz_checkpoint_open build-fuzz/corpus/checkpoint "$seeds/checkpoint"
