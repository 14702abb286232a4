// Pair verification of a gpt-oss MXFP4 source (transformers' layout) against its ModelOpt NVFP4
// export (docs/quant.md "gpt-oss layouts" and "Pair verification"). The pair verifier
// (pair_verify.h) plans one unit per stacked expert tensor (`...experts.gate_up_proj`,
// `...experts.down_proj`) and hands it here; everything else is compared as in any pair.
//
// Per unit: the derived tensors' dtypes and shapes ([E, C/2, R] U8, [E, C/16, R] F8_E4M3, F32
// 0-d or [1] weight_scale_2 and input_scale); every packed byte through the layout maps of
// gpt_oss_layout.h; every reconstructed value (e2m1 x block scale x weight_scale_2 must equal
// e2m1 x 2^k_j exactly); and the source's scale bytes by group activity, from which the pair
// verifier counts the tensor's scale window two ways (PairWindowCount, pair_verify.h) as for
// any MXFP4 source tensor.
#ifndef CKPT_CORE_QUANT_GPT_OSS_PAIR_H_
#define CKPT_CORE_QUANT_GPT_OSS_PAIR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"

namespace ckpt::quant {

struct PairUnit;
struct PairUnitOutcome;

// The tensor names of a stacked expert tensor `base` (e.g. "model.layers.0.mlp.experts.down_proj")
// on each side, those present only for the derived side.
std::vector<std::string> GptOssSourceTensors(const std::string& base);
std::vector<std::string> GptOssDerivedTensors(const Checkpoint& derived, const std::string& base);
// The stacked expert bases of a gpt-oss MXFP4 checkpoint (names of `*_blocks` without it), sorted.
std::vector<std::string> GptOssExpertBases(const Checkpoint& source);
// Whether `derived` declares a ModelOpt export (config.json quant_method "modelopt*", or an
// hf_quant_config.json whose producer is "modelopt").
bool DeclaresModelOpt(const Checkpoint& derived);

// Compares one stacked expert tensor; mismatches go into o->found as the pair verifier's codes,
// the source's scale bytes into o->active_bytes / o->zero_bytes. INVALID_ARGUMENT when the source's own tensors do not fit its
// config (the derived side's are findings).
absl::Status CompareGptOssUnit(const Checkpoint& source, const Checkpoint& derived,
                               const PairUnit& unit, PairUnitOutcome* o);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_GPT_OSS_PAIR_H_
