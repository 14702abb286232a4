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
#include <functional>
#include <string>
#include <utility>
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

// The block in stages, for weights that arrive piece by piece (docs/forward.md, "Streamed"):
//   route    router logits, top-k ids and weights, expert input (latent_in); reads the routing
//            weights: router, router_bias, correction_bias, latent_down.
//   experts  each listed expert (ascending ids) on the (token, slot) pairs that chose it: rows
//            (token * top_k + slot) of h [tokens * top_k, D], D = latent or hidden; h is sized
//            by the caller, and every row is written by exactly one expert.
//   shared   shared_out (zero without a shared expert); reads shared_gate/up/down.
//   finish   combine (each token adds its rows of h in top-k slot order, as RunBlockCpu),
//            latent norm and up-projection, output = routed + shared; reads latent_up and
//            latent_norm, and takes `r` with route and shared done.
// Each stage reads only the BlockWeights fields it names. Run in that order (shared anywhere
// before finish) they give the whole block's bits: the values passed between stages are held
// as double, which holds every float exactly. INVALID_ARGUMENT for shapes that do not fit.
using ExpertSet = std::vector<std::pair<int32_t, const ExpertWeights*>>;
struct BlockStages {
  std::function<absl::Status(const BlockConfig&, const BlockWeights&, const BlockInput&,
                             Precision, BlockResult*)>
      route;
  std::function<absl::Status(const BlockConfig&, const ExpertSet&, const BlockInput&,
                             const BlockResult& routed, Precision, std::vector<double>* h)>
      experts;
  std::function<absl::Status(const BlockConfig&, const BlockWeights&, const BlockInput&,
                             Precision, BlockResult*)>
      shared;
  std::function<absl::Status(const BlockConfig&, const BlockWeights&, const std::vector<double>& h,
                             Precision, BlockResult*)>
      finish;
};
BlockStages CpuStages();

// Every stage of a block whose weights are all in memory: RunBlockCpu is RunStages(CpuStages()).
absl::StatusOr<BlockResult> RunStages(const BlockStages& stages, const BlockConfig& config,
                                      const BlockWeights& weights, const BlockInput& input,
                                      Precision precision);

// The expert selection of grouped top-k (noaux_tc, formats.md §7 step 2) on one token's
// selection scores `b` [experts]: `config.top_k` ids in descending score order, ties to the
// lower index. With n_group = topk_group = 1 it is plain top-k (gpt-oss).
void SelectTopK(const BlockConfig& config, const double* b, int32_t* ids);

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_BLOCK_FORWARD_H_
