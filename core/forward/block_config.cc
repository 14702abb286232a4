#include "core/forward/block_config.h"

#include "absl/strings/str_cat.h"

namespace ckpt::forward {
namespace {

absl::StatusOr<int> IntKey(const nlohmann::json& c, const char* key) {
  auto it = c.find(key);
  if (it == c.end() || !it->is_number_integer() || it->get<long long>() < 0 ||
      it->get<long long>() > (1 << 24)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: missing or invalid integer '", key, "'"));
  }
  return it->get<int>();
}

double NumberOr(const nlohmann::json& c, const char* key, double fallback) {
  auto it = c.find(key);
  return it != c.end() && it->is_number() ? it->get<double>() : fallback;
}

}  // namespace

std::string FamilyName(BlockFamily f) {
  switch (f) {
    case BlockFamily::kKimiLatent: return "kimi_latent_moe";
    case BlockFamily::kDeepSeekV3: return "deepseek_v3_moe";
    case BlockFamily::kGptOss: return "gpt_oss_moe";
  }
  return "?";
}

absl::StatusOr<BlockConfig> ParseBlockConfig(const nlohmann::json& c, int layer) {
  BlockConfig b;
  const std::string model_type = c.value("model_type", "");
  auto hidden = IntKey(c, "hidden_size");
  if (!hidden.ok()) return hidden.status();
  b.hidden = *hidden;
  if (model_type == "gpt_oss") {
    b.family = BlockFamily::kGptOss;
    b.activation = Activation::kClampedSwiGlu;
    auto e = IntKey(c, "num_local_experts");
    auto k = IntKey(c, "num_experts_per_tok");
    auto i = IntKey(c, "intermediate_size");
    for (auto* s : {&e, &k, &i}) if (!s->ok()) return s->status();
    b.experts = *e;
    b.top_k = *k;
    b.expert_intermediate = *i;
    b.swiglu_limit = NumberOr(c, "swiglu_limit", 7.0);
  } else {
    const bool kimi = model_type.rfind("kimi", 0) == 0;
    b.family = kimi ? BlockFamily::kKimiLatent : BlockFamily::kDeepSeekV3;
    b.activation = kimi ? Activation::kSiTUGlu : Activation::kSiluGlu;
    auto e = IntKey(c, "n_routed_experts");
    auto k = IntKey(c, "num_experts_per_tok");
    auto i = IntKey(c, "moe_intermediate_size");
    auto g = IntKey(c, "n_group");
    auto tg = IntKey(c, "topk_group");
    for (auto* s : {&e, &k, &i, &g, &tg}) if (!s->ok()) return s->status();
    b.experts = *e;
    b.top_k = *k;
    b.expert_intermediate = *i;
    b.n_group = *g;
    b.topk_group = *tg;
    b.norm_topk_prob = c.value("norm_topk_prob", true);
    b.routed_scaling_factor = NumberOr(c, "routed_scaling_factor", 1.0);
    b.rms_eps = NumberOr(c, "rms_norm_eps", 1e-6);
    const int dense = c.value("first_k_dense_replace", 0);
    if (layer < dense) {
      return absl::InvalidArgumentError(absl::StrCat(
          "config.json: layer ", layer, " is dense (first_k_dense_replace = ", dense, ")"));
    }
    const int shared = c.value("n_shared_experts", 0);
    if (shared > 0) {
      b.shared_intermediate =
          c.contains("shared_expert_intermediate_size")
              ? c.value("shared_expert_intermediate_size", 0)
              : shared * b.expert_intermediate;
    }
    if (kimi) {
      auto l = IntKey(c, "moe_latent_size");
      if (!l.ok()) return l.status();
      b.latent = *l;
      b.latent_norm = c.value("latent_moe_use_norm", false);
      b.situ_beta = NumberOr(c, "situ_beta", 4.0);
      b.situ_linear_beta = NumberOr(c, "situ_linear_beta", 25.0);
    }
  }
  const int layers = c.value("num_hidden_layers", 0);
  if (layer < 0 || (layers > 0 && layer >= layers)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: layer ", layer, " out of range [0, ", layers, ")"));
  }
  if (b.hidden == 0 || b.experts == 0 || b.top_k == 0 || b.top_k > b.experts ||
      b.expert_intermediate == 0 || b.n_group < 1 || b.experts % b.n_group != 0 ||
      b.topk_group < 1 || b.topk_group > b.n_group ||
      b.top_k > b.topk_group * (b.experts / b.n_group)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config.json: inconsistent MoE dimensions for layer ", layer));
  }
  return b;
}

}  // namespace ckpt::forward
