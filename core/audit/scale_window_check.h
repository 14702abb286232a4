// The scale-window check (docs/quant.md): one unit per fused group of the root checkpoint,
// scanned as its tensors stream past, finished into the policy's result.
#ifndef CKPT_CORE_AUDIT_SCALE_WINDOW_CHECK_H_
#define CKPT_CORE_AUDIT_SCALE_WINDOW_CHECK_H_

#include <vector>

#include "core/audit/engine.h"
#include "core/evidence/record.h"
#include "core/quant/scale_window.h"

namespace ckpt::audit {

class ScaleWindowCheck : public Check {
 public:
  explicit ScaleWindowCheck(quant::ScaleWindowConfig config) : policy_(std::move(config)) {}
  // Plans nothing when the root checkpoint is unreadable.
  absl::Status Plan(const Checkpoints& trees, WorkPlan& plan) override;
  // After Engine::Run.
  quant::ScaleWindowResult Result() &&;

  // A split audit (core/audit/parts.h): the units planned (by fused group), which of them this
  // process ran and what each gave; at the merge, what the part that ran unit `i` gave.
  size_t units() const { return units_.size(); }
  const std::string& unit_name(size_t i) const { return units_[i].fused_group; }
  bool ran(size_t i) const { return ran_[i] != 0; }
  const quant::ScaleWindowPartial& outcome(size_t i) const { return parts_[i]; }
  void SetOutcome(size_t i, quant::ScaleWindowPartial p) { parts_[i] = std::move(p); }

 private:
  const quant::ScaleWindowPolicy policy_;
  const Checkpoint* ckpt_ = nullptr;
  std::vector<quant::ScaleWindowUnit> units_;
  std::vector<quant::ScaleWindowPartial> parts_;  // parallel to units_
  std::vector<char> ran_;                         // parallel to units_
};

// The record's scale_window check, and the thresholds it names.
evidence::CheckResult RecordOf(const quant::ScaleWindowResult& r);
evidence::ScaleWindowThresholds ThresholdsOf(const quant::ScaleWindowConfig& c);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_SCALE_WINDOW_CHECK_H_
