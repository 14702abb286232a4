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

 private:
  const quant::ScaleWindowPolicy policy_;
  const Checkpoint* ckpt_ = nullptr;
  std::vector<quant::ScaleWindowUnit> units_;
  std::vector<quant::ScaleWindowPartial> parts_;  // parallel to units_
};

// The record's scale_window check, and the thresholds it names.
evidence::CheckResult RecordOf(const quant::ScaleWindowResult& r);
evidence::ScaleWindowThresholds ThresholdsOf(const quant::ScaleWindowConfig& c);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_SCALE_WINDOW_CHECK_H_
