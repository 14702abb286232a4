// The weights of one MoE block, as the CPU reference and the CUDA kernels both take them.
//
// Routed-expert matrices stay FP4-packed (`Fp4Matrix`: the checkpoint's bytes, not decoded) so
// that the GPU path can copy only the selected experts' packed bytes and scales; dense tensors
// (router, latent projections, norm, shared expert, biases) are held as float, which represents
// BF16 and F32 exactly. `LoadBlockWeights` maps tensor names to roles per family (the table is
// in docs/forward.md and in kTensorNames in block_weights.cc).
#ifndef CKPT_CORE_FORWARD_BLOCK_WEIGHTS_H_
#define CKPT_CORE_FORWARD_BLOCK_WEIGHTS_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/forward/block_config.h"
#include "core/quant/fp4_tensor.h"

namespace ckpt::forward {

// A row-major matrix [rows, cols] of BF16 or F32 values as stored: `bytes` points into a
// checkpoint mapping, a buffer the stream lent, or `keepalive`, and values are decoded as they
// are read, never copied whole (docs/forward.md, "Memory": at Kimi-K3 geometry the shared
// expert alone would take 528 MB as float, outside the memory window). BF16 and F32 both
// decode to float exactly.
struct DenseMatrix {
  std::string name;  // tensor name, for messages
  int64_t rows = 0;
  int64_t cols = 0;
  DType dtype = DType::kF32;  // kBF16 or kF32 (the loader refuses others)
  std::span<const uint8_t> bytes;  // rows * cols values, little-endian, any alignment
  std::shared_ptr<const void> keepalive;

  // A matrix owning `values` (tests and synthetic blocks).
  static DenseMatrix Of(std::string name, int64_t rows, int64_t cols, std::vector<float> values);
  float At(int64_t i) const;
  // Row r decoded into out[0, cols).
  void Row(int64_t r, float* out) const;
  // Every value decoded (small matrices: the router).
  std::vector<float> Floats() const;
};

// How an FP4 matrix's group scales are encoded (docs/formats.md §3, §4).
enum class Fp4Scale {
  kE8M0Group32,  // MXFP4: value = e2m1 * 2^(scale - 127)
  kE4M3Group16,  // NVFP4: value = e2m1 * e4m3(scale) with the global applied in its role
};

// An FP4 matrix [rows, cols] as stored: packed [rows, cols/2] (low nibble = even column) and
// scales [rows, cols/group]. The spans point into a checkpoint mapping or into `keepalive`.
struct Fp4Matrix {
  std::string name;
  Fp4Scale scale_kind = Fp4Scale::kE8M0Group32;
  int64_t rows = 0;
  int64_t cols = 0;
  std::span<const uint8_t> packed;
  std::span<const uint8_t> scales;
  // NVFP4 only: the global scale and whether it divides (compressed-tensors) or multiplies
  // (ModelOpt) the block scales (docs/formats.md §4, §9).
  quant::Nvfp4Global global;
  std::shared_ptr<const void> keepalive;

  int group() const { return scale_kind == Fp4Scale::kE8M0Group32 ? 32 : 16; }
  // Sizes consistent, an NVFP4 global scale finite and nonzero (INVALID_ARGUMENT), and no NaN
  // scale (E8M0 0xFF, E4M3 0x7F/0xFF) on a group holding a nonzero nibble (DATA_LOSS naming
  // the tensor, row and group).
  absl::Status Validate() const;
  // Decoded values of row r: exact for MXFP4, and for NVFP4 whenever the global scale is a
  // power of two (as in lossless transcodes); otherwise the double nearest e2m1 * s / global.
  // Requires Validate() to have passed.
  void DequantizeRow(int64_t r, double* out) const;
};

struct ExpertWeights {
  Fp4Matrix gate;  // [intermediate, in]  (w1)
  Fp4Matrix up;    // [intermediate, in]  (w3)
  Fp4Matrix down;  // [in, intermediate]  (w2)
  std::vector<float> gate_bias, up_bias, down_bias;  // gpt-oss only
};

struct BlockWeights {
  DenseMatrix router;                   // [experts, hidden]
  std::vector<float> router_bias;       // gpt-oss
  std::vector<float> correction_bias;   // noaux_tc e_score_correction_bias
  DenseMatrix latent_down;              // [latent, hidden]
  DenseMatrix latent_up;                // [hidden, latent]
  std::vector<float> latent_norm;       // [latent]
  std::vector<ExpertWeights> experts;   // indexed by expert id
  DenseMatrix shared_gate, shared_up;   // [shared, hidden]
  DenseMatrix shared_down;              // [hidden, shared]
};

// Checks every shape against `config`. INVALID_ARGUMENT naming the tensor. The parts are
// what each stage of block_forward.h reads.
absl::Status CheckBlockWeights(const BlockConfig& config, const BlockWeights& w);
absl::Status CheckRoutingWeights(const BlockConfig& config, const BlockWeights& w);
absl::Status CheckExpertWeights(const BlockConfig& config, const ExpertWeights& e);
absl::Status CheckSharedWeights(const BlockConfig& config, const BlockWeights& w);
absl::Status CheckLatentOutWeights(const BlockConfig& config, const BlockWeights& w);

// The streamed forward reads a block in parts, each when its tensors have arrived
// (docs/forward.md, "Streamed"): the routing weights (router, its biases, the latent down
// projection), one expert, the shared expert, the latent output weights (up projection, norm).
enum class BlockPart { kRouting, kExpert, kShared, kLatentOut };

// The tensors part `part` of layer `layer` reads (kExpert: of expert `expert`; gpt-oss stores
// its experts stacked, so each of its experts reads the stacked tensors of both fused
// projections in the layout stored: transformers' MXFP4 or ModelOpt's NVFP4 export,
// docs/forward.md). NOT_FOUND or INVALID_ARGUMENT as LoadBlockWeights.
absl::StatusOr<std::vector<TensorRef>> BlockPartTensors(const Checkpoint& ckpt,
                                                        const BlockConfig& config, int layer,
                                                        BlockPart part, int expert = -1);

// Loads part `part` into `w`: the fields its stage (block_forward.h BlockStages) reads; for
// kExpert, w->experts[e] for each e of `experts` (w->experts is sized to the block's experts).
// Errors as LoadBlockWeights.
absl::Status LoadBlockPart(const Checkpoint& ckpt, const BlockConfig& config, int layer,
                           BlockPart part, const std::vector<int>& experts, BlockWeights* w);

// The (w1, w3) weight_global_scale tensors of every expert of the layer whose w1 and w3 are
// both NVFP4: what the vLLM w1/w3 collapse (forward_audit.h) looks at on every expert.
struct ExpertGlobalScale {
  int expert = 0;
  TensorRef w1, w3;
};
std::vector<ExpertGlobalScale> ExpertGlobalScales(const Checkpoint& ckpt,
                                                  const BlockConfig& config, int layer);

// Loads layer `layer`'s block. Expert spans point into `ckpt`, which must outlive the result.
// Errors name the tensor: NOT_FOUND (missing), INVALID_ARGUMENT (dtype/shape), DATA_LOSS.
absl::StatusOr<BlockWeights> LoadBlockWeights(const Checkpoint& ckpt, const BlockConfig& config,
                                              int layer);

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_BLOCK_WEIGHTS_H_
