// A test-only writer: converts a compressed-tensors NVFP4 checkpoint (tests/data
// mini-kimi-nvfp4) into ModelOpt's NVFP4 layout (docs/formats.md §9), so that the reader can be
// checked against a tree whose every byte is known. Per quantized module M:
//   M.weight_packed        -> M.weight            (U8, bytes unchanged: both low nibble first)
//   M.weight_scale         -> M.weight_scale      (F8_E4M3, unchanged)
//   M.weight_global_scale  -> M.weight_scale_2    (F32 0-d, 1/g: the divisor becomes a multiplier;
//                                                  refused unless g is a power of two, where the
//                                                  reciprocal is exact)
//   (W4A4 only)            -> M.input_scale       (F32 0-d, 1.0, as the Kimi-K3 cast pins it)
// Every other tensor is copied byte for byte; config.json's quantization_config and
// hf_quant_config.json are written in the shapes ModelOpt's exporter writes them.
#ifndef CKPT_TESTS_QUANT_MODELOPT_FIXTURE_H_
#define CKPT_TESTS_QUANT_MODELOPT_FIXTURE_H_

#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant::testing {

struct ModelOptFixtureOptions {
  std::string quant_algo = "NVFP4";  // "NVFP4" (W4A4) or "W4A16_NVFP4"
  bool write_hf_quant_config = true;
  bool write_config_json = true;     // config.json quantization_config (quant_method "modelopt")
  bool scalars_as_1 = false;         // [1] instead of 0-d for weight_scale_2 / input_scale
  // Hazard fixtures: tensors (by their ModelOpt name) left out, one module whose
  // weight_scale_2 gets this shape, and a module (not quantized) given a stray weight_scale_2.
  std::set<std::string> drop;
  std::string odd_global_module;
  std::vector<uint64_t> odd_global_shape;
  std::string stray_global_on;
};

// The exclude list the writer declares: ModelOpt wildcards, each matching some module of the
// mini-Kimi tree and none of its routed experts.
std::vector<std::string> MiniKimiExcludeModules();

// Writes the ModelOpt tree for compressed-tensors NVFP4 `src` into `dst` (created, must not
// exist). INVALID_ARGUMENT when `src` is not compressed-tensors NVFP4 or a global scale is not a
// power of two.
absl::Status WriteModelOptFixture(const std::filesystem::path& src,
                                  const std::filesystem::path& dst,
                                  const ModelOptFixtureOptions& options = {});

// A ModelOpt-style closed-form cast of compressed-tensors MXFP4 `src` (docs/formats.md §9):
// per tensor k_max over every group whose scale byte is > 0 (all-zero groups included),
// weight_scale_2 = 2^(k_max - 8), block scale 2^(k - k_max + 8) with nibbles copied where E4M3
// holds it, else a data-derived scale clamped to E4M3's range and the nibbles requantized: the
// lossy path a large byte on an all-zero group forces on every real block.
absl::Status WriteModelOptCastOfMxfp4(const std::filesystem::path& src,
                                      const std::filesystem::path& dst);

// Reads, edits and writes back a JSON file of a tree (for the bad-config tests).
void EditJson(const std::filesystem::path& file, const std::function<void(nlohmann::json&)>& edit);

}  // namespace ckpt::quant::testing

#endif  // CKPT_TESTS_QUANT_MODELOPT_FIXTURE_H_
