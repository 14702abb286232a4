// The pair check (docs/quant.md, "Pair verification"): is the root a lossless re-encoding of
// the source? One unit per quantized module or other tensor, compared when both sides' tensors
// are in, finished into the pair verification's result.
#ifndef CKPT_CORE_AUDIT_PAIR_CHECK_H_
#define CKPT_CORE_AUDIT_PAIR_CHECK_H_

#include <memory>
#include <optional>
#include <vector>

#include "core/audit/engine.h"
#include "core/evidence/record.h"
#include "core/quant/pair_verify.h"

namespace ckpt::audit {

class PairCheck : public Check {
 public:
  explicit PairCheck(quant::PairVerifyOptions options) : options_(std::move(options)) {}
  // Plans nothing unless both checkpoints are readable. Errors: PlanPair's (a source or derived
  // format it cannot compare).
  absl::Status Plan(const Checkpoints& trees, WorkPlan& plan) override;
  bool planned() const { return plan_.has_value(); }
  // After Engine::Run, when planned().
  quant::PairVerifyResult Result() &&;

 private:
  const quant::PairVerifyOptions options_;
  Checkpoints trees_;
  std::optional<quant::PairPlan> plan_;
  std::vector<quant::PairUnitOutcome> outcomes_;  // parallel to plan_->units
  // A non-quantized unit whose tensors are streamed is compared by the SHA-256 of each side,
  // taken as the cursor passes (never held: an embedding or head larger than the window).
  struct Hashed {
    size_t unit = 0;
    Sha256 source, derived;
  };
  std::vector<std::unique_ptr<Hashed>> hashed_;
};

// The record's pair_verify check, and its pair_audit (also `verify-pair --json`).
evidence::CheckResult RecordOf(const quant::PairVerifyResult& r);
evidence::PairAudit PairAuditOf(const quant::PairVerifyResult& r);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_PAIR_CHECK_H_
