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

  // A split audit (core/audit/parts.h): the units planned, which of them this process ran and
  // what each gave; at the merge, what the part that ran unit `i` gave. A unit compared by
  // digest runs in no part: the merge gives it the digests the parts that hashed its files took.
  size_t units() const { return plan_ ? plan_->units.size() : 0; }
  const std::string& unit_name(size_t i) const { return plan_->units[i].name; }
  bool ran(size_t i) const { return ran_[i] != 0; }
  // The tensor compared by digest in unit `i`, or null when the unit reads its tensors.
  const std::string* hashed_tensor(size_t i) const;
  const quant::PairUnitOutcome& outcome(size_t i) const { return outcomes_[i]; }
  void SetOutcome(size_t i, quant::PairUnitOutcome o) { outcomes_[i] = std::move(o); }
  void SetDigests(size_t i, const Digest& source, const Digest& derived);

 private:
  const quant::PairVerifyOptions options_;
  Checkpoints trees_;
  std::optional<quant::PairPlan> plan_;
  std::vector<quant::PairUnitOutcome> outcomes_;  // parallel to plan_->units
  std::vector<char> ran_;                         // parallel to plan_->units
  // A non-quantized unit whose tensors are streamed is compared by the SHA-256 of each side,
  // taken as the cursor passes (never held: an embedding or head larger than the window).
  struct Hashed {
    size_t unit = 0;
    Sha256 source, derived;
    bool given = false;  // SetDigests: outcomes_[unit] is set
  };
  std::vector<std::unique_ptr<Hashed>> hashed_;
};

// The record's pair_verify check, and its pair_audit (also `verify-pair --json`).
evidence::CheckResult RecordOf(const quant::PairVerifyResult& r);
evidence::PairAudit PairAuditOf(const quant::PairVerifyResult& r);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_PAIR_CHECK_H_
