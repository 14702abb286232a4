// Lossless MXFP4 -> NVFP4A16 transcoding (docs/formats.md §5, docs/quant.md "Transcode").
//
// Packed nibbles are copied unchanged; per fused group (w1/w3 share it) the global scale is
// 2^(8 - k_max) and each 16-block of an active group j gets the E4M3 scale 2^(k_j - k_max + 8);
// all-zero groups get +0. Nothing is ever requantized: an over-span or NaN-scale source fails
// with FAILED_PRECONDITION naming tensor, row and group. Output goes to a temporary directory
// beside DST that is renamed to DST only when complete, so a failure leaves nothing behind.
#ifndef CKPT_CORE_QUANT_TRANSCODE_H_
#define CKPT_CORE_QUANT_TRANSCODE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/scale_window.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant {

struct TranscodeOptions {
  ScaleWindowConfig policy;
  unsigned threads = 0;  // 0 = all cores
};

struct TranscodeResult {
  ScaleWindowResult policy;
  std::vector<std::string> files;  // written, relative to DST
  uint64_t tensors_written = 0, modules_transcoded = 0, bytes_written = 0;
  uint64_t zero_groups_canonicalized = 0;
  nlohmann::json ToJson() const;
};

// The NVFP4 form of a compressed-tensors MXFP4 quantization_config (group 16, tensor_group).
nlohmann::json Nvfp4QuantizationConfig(const nlohmann::json& mxfp4_config);

// DST must not exist. Errors: INVALID_ARGUMENT (source not compressed-tensors MXFP4, DST
// exists), FAILED_PRECONDITION (policy: over-span or NaN scale), DATA_LOSS (I/O).
absl::StatusOr<TranscodeResult> TranscodeToNvfp4(const Checkpoint& src, const std::string& dst,
                                                 const TranscodeOptions& options,
                                                 Progress& progress);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_TRANSCODE_H_
