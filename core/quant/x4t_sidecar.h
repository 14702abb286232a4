// X4T container A: per-layer sidecar files `x4t-layer-000LL.safetensors` beside a checkpoint
// (docs/formats.md §6, docs/quant.md "X4T"). One file holds every routed expert of one layer:
// `expert_ids` I32 [E]; per matrix m in w1, w3, w2: `m.packed` U8 [E, out, in/2] (w2 group-major
// [E, in/32, out, 16]), `m.scale_fixed` U8 [E, fixed], `m.scale_exceptions` U8 [4 * count] and
// `m.scale_exception_offsets` I64 [E + 1] (prefix sums, in exceptions).
#ifndef CKPT_CORE_QUANT_X4T_SIDECAR_H_
#define CKPT_CORE_QUANT_X4T_SIDECAR_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/quant/finding.h"
#include "core/quant/x4t_container.h"
#include "core/safetensors.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant {

inline constexpr char kX4TSidecarSchema[] = "kquant_x4t_layer_v1";

// The expert in slot `slot` of matrix `matrix` ("w1", "w3" or "w2") as source MXFP4 tensors.
// INVALID_ARGUMENT for a mis-shaped file, DATA_LOSS for a non-canonical scale stream.
absl::StatusOr<X4TExpertMatrix> ReadX4TSidecarMatrix(const SafetensorsFile& f,
                                                     const std::string& matrix, uint64_t slot);

// Checks the metadata contract (schema, version 2, layer, experts, expert_capacity,
// matrix_order w1,w3,w2, scale_codec, w2_packed_layout, exact_mxfp4_reconstruction) and the
// tensors against the text config (n_routed_experts, moe_intermediate_size, moe_latent_size),
// then decodes every scale plane. Findings are named `sidecar-*` with the file as tensor.
void CheckX4TSidecar(const SafetensorsFile& f, const nlohmann::json& text_config,
                     FindingList* findings);

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_X4T_SIDECAR_H_
