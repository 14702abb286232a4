// A synthetic MXFP4 checkpoint for benchmarks: Kimi-K3 expert geometry (w1/w3 [3072, 3584],
// w2 [3584, 3072], 16 experts per layer, one shard per layer, a small BF16 dense tensor per
// layer), random nibbles, per-row scales within an 8-binade span, 0.1% all-zero groups with an
// out-of-window scale. Deterministic (fixed seed), so runs are comparable.
#ifndef CKPT_BENCH_COMMON_SYNTHETIC_CHECKPOINT_H_
#define CKPT_BENCH_COMMON_SYNTHETIC_CHECKPOINT_H_

#include <filesystem>

#include "absl/status/status.h"

namespace ckpt::bench {

// Whole 16-expert layers closest to `size_gib` of source tensors (at least one).
int LayersFor(double size_gib);

// Writes config.json, the index and one shard per layer under `dir` (created).
absl::Status WriteSyntheticSource(const std::filesystem::path& dir, int layers);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_COMMON_SYNTHETIC_CHECKPOINT_H_
