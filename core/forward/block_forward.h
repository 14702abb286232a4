// The CPU reference forward of one MoE block (docs/formats.md §7, docs/forward.md).
//
// Three precisions, each with a fixed evaluation order so that equal weights give equal bits:
//   kF64   every operation in double (the oracle's arithmetic).
//   kF32   every operation in float; every dot product accumulates sequentially over the
//          reduction index in ascending order, starting from +0.0f.
//   kBF16  kF32 plus rounding to BF16 (nearest-even) where the CUDA kernels store BF16
//          activations: latent input z, the expert and shared GLU outputs, the normed latent.
// Results are held as double; in kF32/kBF16 each value is exactly the float computed.
#ifndef CKPT_CORE_FORWARD_BLOCK_FORWARD_H_
#define CKPT_CORE_FORWARD_BLOCK_FORWARD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/forward/block_config.h"
#include "core/forward/block_weights.h"

namespace ckpt::forward {

enum class Precision { kF64, kF32, kBF16 };
std::string PrecisionName(Precision p);
absl::StatusOr<Precision> ParsePrecision(const std::string& s);

// Block input [tokens, hidden]; values are BF16 numbers held as float.
struct BlockInput {
  int64_t tokens = 0;
  std::vector<float> values;
};

// Output and intermediates, named as in tests/data/oracle/mini-kimi-block-L1.safetensors.
// latent_* are empty for families without latent projections, shared_out is zero without a
// shared expert.
struct BlockResult {
  int64_t tokens = 0;
  std::vector<double> router_logits;      // [T, experts]
  std::vector<int32_t> topk_ids;          // [T, top_k], in descending score order
  std::vector<double> topk_weights;       // [T, top_k]
  std::vector<double> latent_in;          // [T, latent]
  std::vector<double> latent_out_normed;  // [T, latent]
  std::vector<double> routed_out;         // [T, hidden]
  std::vector<double> shared_out;         // [T, hidden]
  std::vector<double> output;             // [T, hidden]
};

// Runs the block. INVALID_ARGUMENT if the input or weights do not fit `config`.
absl::StatusOr<BlockResult> RunBlockCpu(const BlockConfig& config, const BlockWeights& weights,
                                        const BlockInput& input, Precision precision);

// The expert selection of grouped top-k (noaux_tc, formats.md §7 step 2) on one token's
// selection scores `b` [experts]: `config.top_k` ids in descending score order, ties to the
// lower index. With n_group = topk_group = 1 it is plain top-k (gpt-oss).
void SelectTopK(const BlockConfig& config, const double* b, int32_t* ids);

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_BLOCK_FORWARD_H_
