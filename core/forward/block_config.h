// Which MoE block a checkpoint layer is, and its dimensions, read from config.json
// (docs/forward.md has the per-family table; docs/formats.md §7 the arithmetic).
//
// Three families share one block skeleton (router -> top-k -> experts -> combine -> shared):
//   kKimiLatent  Kimi-K3 LatentMoE: sigmoid router with correction bias, grouped top-k
//                (noaux_tc), latent down/up projections with RMSNorm, SiTU-GLU experts.
//   kDeepSeekV3  the same routing without latent projections, SiLU-GLU experts.
//   kGptOss      router with bias, softmax over the top-k logits, clamped SwiGLU, biases.
#ifndef CKPT_CORE_FORWARD_BLOCK_CONFIG_H_
#define CKPT_CORE_FORWARD_BLOCK_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ckpt::forward {

enum class BlockFamily { kKimiLatent, kDeepSeekV3, kGptOss };
std::string FamilyName(BlockFamily f);

enum class Activation { kSiTUGlu, kSiluGlu, kClampedSwiGlu };

struct BlockConfig {
  BlockFamily family = BlockFamily::kKimiLatent;
  Activation activation = Activation::kSiTUGlu;
  int hidden = 0;
  int latent = 0;               // 0: experts work on the hidden state directly
  int expert_intermediate = 0;
  int shared_intermediate = 0;  // 0: no shared expert
  int experts = 0;
  int top_k = 0;
  int n_group = 1;              // grouped top-k (noaux_tc); 1 group = plain top-k
  int topk_group = 1;
  bool norm_topk_prob = true;
  double routed_scaling_factor = 1.0;
  bool latent_norm = false;
  double rms_eps = 1e-6;
  double situ_beta = 4.0;
  double situ_linear_beta = 25.0;
  double swiglu_limit = 7.0;    // gpt-oss
  double swiglu_alpha = 1.702;  // gpt-oss
};

// Reads the block of `layer` from a config (its text_config when nested). INVALID_ARGUMENT when
// a needed key is missing or inconsistent, or the layer is not an MoE layer.
absl::StatusOr<BlockConfig> ParseBlockConfig(const nlohmann::json& text_config, int layer);

}  // namespace ckpt::forward

#endif  // CKPT_CORE_FORWARD_BLOCK_CONFIG_H_
