// Real-geometry synthetic checkpoints for the scale rig (docs/PERFORMANCE.md, "Real-geometry
// scale rig"). A Geometry names a model family's MoE layer; WriteScaleCheckpoint writes N such
// layers (plus embeddings, final norm and head) as a sharded safetensors tree, either the MXFP4
// source or its lossless NVFP4A16 derivative, at disk speed: every byte is a pure function of
// (seed, tensor name, position), so tensors are cut into row ranges filled and pwrite'n by all
// threads, and the output is the same whatever the thread count.
//
// Scales stay inside the lossless window (docs/quant.md, "Transcoding MXFP4 -> NVFP4A16"):
// each fused group (w1/w3, gate/up) has a top exponent T, every active 32-group of it an
// exponent in [T-11, T] and its first group exactly T, so k_max = T is known without reading
// the tensors, and the derived tree is written directly with core/quant's codecs. It is
// byte-identical to what `ckpt-audit transcode` makes of the source
// (tests/scale/scale_gen_test.cc checks it). 1/1024 of the groups are all-zero with an
// out-of-window scale byte, as in real checkpoints.
#ifndef CKPT_BENCH_SCALE_SCALE_CHECKPOINT_H_
#define CKPT_BENCH_SCALE_SCALE_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace ckpt::bench {

enum class ScaleFamily { kKimiK3, kDeepSeekV3, kGptOss };

struct Geometry {
  ScaleFamily family = ScaleFamily::kKimiK3;
  uint64_t hidden = 0;
  uint64_t latent = 0;        // Kimi-K3 latent MoE: experts run in this width (0: none)
  uint64_t intermediate = 0;  // per routed expert
  uint64_t experts = 0;
  uint64_t top_k = 0;
  uint64_t n_group = 1, topk_group = 1;
  uint64_t shared_intermediate = 0;  // 0: no shared expert
  uint64_t vocab = 0;                // embeddings and head; 0: none
};

// "kimi-k3", "deepseek-v3", "gpt-oss-120b" (docs/PERFORMANCE.md lists the dimensions).
// INVALID_ARGUMENT for another name.
absl::StatusOr<Geometry> GeometryNamed(const std::string& name);

// Dimensions that the writer's layouts need (multiples of 32, top_k within the groups).
absl::Status CheckGeometry(const Geometry& g);

enum class ScaleFormat { kMxfp4, kNvfp4 };

// Where tensors lie in the shards (docs/PERFORMANCE.md, "Tensor orders"):
//  - kSorted: the reference writer's order in each shard (by dtype, then name);
//  - kModel: model order (norms and router, then per expert w1, w3, w2, each packed weight
//    before its scale), as many exporters write;
//  - kReverse: model order reversed in each shard (scales before their packed weights);
//  - kShuffle: a permutation drawn from the seed, across the shards before they are cut (an
//    expert's tensors, even a packed weight and its scale, can lie in different shards) and
//    within each shard.
// The sharding and the bytes of every tensor are the same in both trees whatever the order.
enum class TensorOrder { kSorted, kModel, kReverse, kShuffle };
// "sorted", "model", "reverse", "shuffle"; INVALID_ARGUMENT for another name.
absl::StatusOr<TensorOrder> TensorOrderNamed(const std::string& name);

struct ScaleOptions {
  Geometry geometry;
  int layers = 1;                       // MoE layers
  uint64_t shard_bytes = 18'000'000'000;  // source tensor bytes per shard (greedy, whole tensors)
  uint64_t seed = 0;
  ScaleFormat format = ScaleFormat::kMxfp4;
  unsigned threads = 0;  // 0: all cores
  TensorOrder order = TensorOrder::kSorted;
};

struct ScaleResult {
  uint64_t files = 0, tensors = 0, bytes = 0;  // bytes: of all files written
  double seconds = 0;
};

// Writes config.json, model.safetensors.index.json and the shards into `dir`, which must not
// exist (its parent must). NVFP4 needs a compressed-tensors family (not gpt-oss).
absl::StatusOr<ScaleResult> WriteScaleCheckpoint(const std::string& dir,
                                                 const ScaleOptions& options);

}  // namespace ckpt::bench

#endif  // CKPT_BENCH_SCALE_SCALE_CHECKPOINT_H_
