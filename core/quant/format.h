// Quantization format detection and contract checks from config.json and the tensor inventory
// (docs/formats.md §4, §6; docs/quant.md "Formats"). Recognised:
//   gpt-oss native MXFP4      quant_method "mxfp4", `*_blocks` / `*_scales` tensors
//   compressed-tensors MXFP4  format "mxfp4-pack-quantized"
//   compressed-tensors NVFP4  format "nvfp4-pack-quantized", A16 or W4A4 (input_activations)
//   X4T container B           quant_method "kimi_x4t" | "exact_mxfp4", format_version 1
//   X4T container A           `x4t-layer-*.safetensors` sidecars in the root (any format)
//   ModelOpt NVFP4            config.json quant_method "modelopt"|"modelopt_mixed" and/or
//                             hf_quant_config.json producer "modelopt"; quant_algo NVFP4,
//                             W4A16_NVFP4 or MIXED_PRECISION (docs/formats.md §9)
// Every disagreement between config and tensors is a named Finding, never an error: the
// caller decides what fails. Geometry checks read dimensions from the config.
#ifndef CKPT_CORE_QUANT_FORMAT_H_
#define CKPT_CORE_QUANT_FORMAT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/quant/finding.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant {

enum class QuantFormat {
  kNone, kGptOssMxfp4, kCompressedTensorsMxfp4, kCompressedTensorsNvfp4, kX4TContainerB,
  kModelOptNvfp4, kUnknown,
};
std::string QuantFormatName(QuantFormat f);

// X4T configs carry the absolute path the container was mounted at when built; a caller that
// mounts it elsewhere maps the declared prefix to the actual path.
struct RootMapping {
  std::string declared;  // e.g. "/x4t"
  std::string actual;    // e.g. "/data/kimi-x4t"
};
// Parses "DECLARED=ACTUAL" (both absolute). INVALID_ARGUMENT otherwise.
absl::StatusOr<RootMapping> ParseRootMapping(const std::string& spec);

struct FormatOptions {
  std::vector<RootMapping> root_map;
  size_t max_findings = 100;
};

struct FormatReport {
  QuantFormat format = QuantFormat::kNone;
  std::string activations;  // NVFP4: "A16" | "W4A4" ("mixed": ModelOpt MIXED_PRECISION)
  int group_size = 0;
  uint64_t quantized_modules = 0;
  uint64_t x4t_sidecars = 0;  // container A files `x4t-layer-*.safetensors` in the root
  FindingList findings;
  FindingList warnings;  // codes whose rule is a warning (rules.h): reported, never failing

  std::string Describe() const;  // "compressed-tensors nvfp4-pack-quantized (W4A16)"
  nlohmann::json ToJson() const;
};

FormatReport DetectFormat(const Checkpoint& ckpt, const FormatOptions& options = {});

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_FORMAT_H_
