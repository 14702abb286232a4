// The block forward check (docs/forward.md): the requested MoE layers of the root, and of the
// source when there is one, on the caller's device, as the units of core/forward/
// forward_stream.h: each layer's router first, then only the experts its tokens route to.
#ifndef CKPT_CORE_AUDIT_FORWARD_CHECK_H_
#define CKPT_CORE_AUDIT_FORWARD_CHECK_H_

#include <memory>
#include <string>

#include "core/audit/engine.h"
#include "core/evidence/record.h"
#include "core/forward/forward_audit.h"
#include "core/forward/forward_stream.h"

namespace ckpt::audit {

class ForwardCheck : public Check {
 public:
  // `layers`: a forward::ResolveLayers spec; `options`' root, source and layer are not used.
  ForwardCheck(std::string layers, forward::ForwardAuditOptions options,
               forward::ForwardDevice device)
      : layers_(std::move(layers)), options_(std::move(options)), device_(std::move(device)) {}
  // Plans nothing when the root checkpoint is unreadable. Errors: INVALID_ARGUMENT for a
  // layer spec the root's config does not have.
  absl::Status Plan(const Checkpoints& trees, WorkPlan& plan) override;
  bool planned() const { return forward_ != nullptr; }
  // After Engine::Run, when planned(): the report of every layer (forward::RunModelForward's).
  absl::StatusOr<forward::ForwardAuditResult> Result() &&;

 private:
  const std::string layers_;
  const forward::ForwardAuditOptions options_;
  const forward::ForwardDevice device_;
  std::unique_ptr<forward::StreamedForward> forward_;
};

// The record's block_forward check.
evidence::CheckResult RecordOf(const forward::ForwardAuditResult& r);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_FORWARD_CHECK_H_
