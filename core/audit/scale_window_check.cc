#include "core/audit/scale_window_check.h"

#include <map>
#include <regex>

#include "absl/strings/str_cat.h"
#include "core/audit/findings.h"

namespace ckpt::audit {

absl::Status ScaleWindowCheck::Plan(const Checkpoints& trees, WorkPlan& plan) {
  if (trees.root == nullptr) return absl::OkStatus();
  ckpt_ = trees.root;
  auto units = policy_.Plan(*ckpt_);
  if (!units.ok()) return units.status();
  units_ = *std::move(units);
  parts_.resize(units_.size());
  ran_.assign(units_.size(), 0);
  for (size_t i = 0; i < units_.size(); ++i) {
    StreamWork w{absl::StrCat("scale_window ", units_[i].fused_group), {}, {}};
    WorkPlan::Need(*ckpt_, units_[i].tensors, &w);
    w.run = [this, i]() -> absl::Status {
      auto part = policy_.Scan(*ckpt_, units_[i]);
      if (!part.ok()) return part.status();
      parts_[i] = *std::move(part);
      ran_[i] = 1;
      return absl::OkStatus();
    };
    plan.Add(units_[i].members.front().name, std::move(w));
  }
  return absl::OkStatus();
}

quant::ScaleWindowResult ScaleWindowCheck::Result() && {
  return policy_.Finish(std::move(parts_));
}

evidence::ScaleWindowThresholds ThresholdsOf(const quant::ScaleWindowConfig& c) {
  return {c.name, c.version, c.max_span, c.marlin_span, c.marlin_min_scale_log2,
          static_cast<int64_t>(c.max_listed)};
}

namespace {

// "L12" for any tensor under "layers.12.", else the tensor name itself.
std::string LayerLabel(const std::string& tensor) {
  static const std::regex kLayer(R"(layers\.(\d+)\.)");
  std::smatch m;
  if (std::regex_search(tensor, m, kLayer)) return absl::StrCat("L", m[1].str());
  return tensor;
}

}  // namespace

evidence::CheckResult RecordOf(const quant::ScaleWindowResult& r) {
  evidence::CheckResult c;
  c.name = "scale_window";
  using V = quant::ScaleWindowVerdict;
  switch (r.verdict) {
    case V::kLosslessTranscodable: c.verdict = evidence::Verdict::kPass; break;
    case V::kOverSpan:
    case V::kNaNScale: c.verdict = evidence::Verdict::kFail; break;
    case V::kNotMxfp4:
    case V::kNoQuantizedTensors: c.verdict = evidence::Verdict::kSkipped; break;
  }
  c.counts["tensors"] = static_cast<int64_t>(r.tensors.size());
  c.counts["over_span_groups"] = static_cast<int64_t>(r.over_span.total());
  c.counts["nan_scales"] = static_cast<int64_t>(r.nan_scales.total());
  c.counts["hazards"] = static_cast<int64_t>(r.hazards.total());
  c.counts["zero_groups_out_of_window"] = static_cast<int64_t>(r.zero_groups_out_of_window);
  AddFindings(r.over_span, &c);
  AddFindings(r.nan_scales, &c);
  AddFindings(r.hazards, &c);
  c.findings_total = r.over_span.total() + r.nan_scales.total() + r.hazards.total();
  // Per layer: the widest exponent span of any tensor, against the policy's window.
  std::map<std::string, int> span_by_layer;
  std::vector<std::string> order;
  for (const quant::TensorScaleStats& t : r.tensors) {
    if (!t.k_min || !t.pair_k_max) continue;
    std::string label = LayerLabel(t.tensor);
    auto [it, fresh] = span_by_layer.emplace(label, t.span());
    if (fresh) order.push_back(label);
    else it->second = std::max(it->second, t.span());
  }
  if (!order.empty()) {
    evidence::Series s{"Scale exponent span per layer", "k_max - k_min (powers of two)",
                       r.config.max_span, r.config.marlin_span, {}};
    for (const std::string& l : order) s.points.push_back({l, span_by_layer[l]});
    c.series.push_back(std::move(s));
  }
  c.details.Set("verdict", quant::VerdictName(r.verdict));
  c.details.Set("policy", ThresholdsOf(r.config));
  return c;
}

}  // namespace ckpt::audit
