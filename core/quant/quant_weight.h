// Finds the tensors that make up one weight matrix ("module") of a checkpoint and says how it
// is stored, from the tensor inventory alone (docs/quant.md "Weights"):
//   MXFP4  M.weight_packed U8 [out, in/2] + M.weight_scale U8|F8_E8M0 [out, in/32]
//   NVFP4  M.weight_packed + M.weight_scale F8_E4M3 [out, in/16] + M.weight_global_scale F32 [1]
//          (+ M.input_global_scale F32 [1] for W4A4); the global is a divisor (compressed-tensors)
//   ModelOpt NVFP4  M.weight U8 [out, in/2] + M.weight_scale F8_E4M3 [out, in/16] +
//          M.weight_scale_2 F32 [] or [1] (+ M.input_scale F32 for W4A4); the global is a
//          multiplier (docs/formats.md §9). A U8 `M.weight` is never read as a plain weight.
//   X4T    M.weight_packed + M.weight_scale.exact_mxfp4_fixed U8 + ...exact_mxfp4_exceptions U32
//   plain  M.weight (BF16, F16 or F32 [out, in]), or M itself naming such a tensor.
#ifndef CKPT_CORE_QUANT_QUANT_WEIGHT_H_
#define CKPT_CORE_QUANT_QUANT_WEIGHT_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/quant/fp4_tensor.h"

namespace ckpt::quant {

enum class WeightKind { kMxfp4, kNvfp4, kX4T, kPlain };
std::string WeightKindName(WeightKind kind);

inline constexpr char kPackedSuffix[] = ".weight_packed";
inline constexpr char kScaleSuffix[] = ".weight_scale";
inline constexpr char kGlobalScaleSuffix[] = ".weight_global_scale";
inline constexpr char kInputGlobalScaleSuffix[] = ".input_global_scale";
inline constexpr char kModelOptWeightSuffix[] = ".weight";
inline constexpr char kModelOptGlobalSuffix[] = ".weight_scale_2";
inline constexpr char kModelOptInputScaleSuffix[] = ".input_scale";
inline constexpr char kX4TFixedSuffix[] = ".weight_scale.exact_mxfp4_fixed";
inline constexpr char kX4TExceptionsSuffix[] = ".weight_scale.exact_mxfp4_exceptions";
inline constexpr char kW2GroupMajorLayout[] = "group-major-32-channel-v1";

struct QuantWeight {
  std::string module;
  WeightKind kind = WeightKind::kPlain;
  uint64_t rows = 0, cols = 0;  // logical [out, in]
  TensorRef packed;             // FP4 kinds; for plain weights, the weight itself
  TensorRef scale;              // MXFP4/NVFP4 weight_scale
  // NVFP4: weight_global_scale / weight_scale_2 and input_global_scale / input_scale, and what
  // the weight global means (a divisor for compressed-tensors, a multiplier for ModelOpt).
  std::optional<TensorRef> global_scale, input_global_scale;
  GlobalRole global_role = GlobalRole::kDivisor;
  TensorRef x4t_fixed, x4t_exceptions;                        // X4T
  bool w2_group_major = false;  // X4T packed stored [in/32, out, 16]
};

// INVALID_ARGUMENT naming the module and tensor when the tensors exist but disagree in dtype
// or shape; NOT_FOUND when no tensor of the module exists.
absl::StatusOr<QuantWeight> ResolveWeight(const Checkpoint& ckpt, const std::string& module);

// The modules with a `.weight_packed` tensor or a U8 `.weight` (ModelOpt), sorted by tensor
// name.
std::vector<std::string> PackedModules(const Checkpoint& ckpt);
// The packed tensor's name of a module PackedModules lists: `.weight_packed`, else `.weight`.
std::string PackedTensorOf(const Checkpoint& ckpt, const std::string& module);
// The tensors present that belong to the quantized module's layout (packed, scales, globals,
// input scales, X4T streams), sorted.
std::vector<std::string> ModuleTensorNames(const Checkpoint& ckpt, const std::string& module);

// Views over the mapped bytes (MXFP4 and NVFP4 weights only).
absl::StatusOr<Mxfp4View> Mxfp4ViewOf(const QuantWeight& w);
absl::StatusOr<Nvfp4View> Nvfp4ViewOf(const QuantWeight& w);
// The F32 scalar of a [] or [1] shaped tensor (INVALID_ARGUMENT for any other shape).
absl::StatusOr<float> ReadScalarF32(const TensorRef& t);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_QUANT_WEIGHT_H_
