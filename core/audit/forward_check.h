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
  // `layers`: a forward::ResolveLayers spec, or empty for options.layer alone (a one-layer
  // report; options.output_path is written); `options`' root and source are not used.
  ForwardCheck(std::string layers, forward::ForwardAuditOptions options,
               forward::ForwardDevice device)
      : layers_(std::move(layers)), options_(std::move(options)), device_(std::move(device)) {}
  // Plans nothing when the root checkpoint is unreadable. Errors: INVALID_ARGUMENT for a
  // layer spec the root's config does not have.
  absl::Status Plan(const Checkpoints& trees, WorkPlan& plan) override;
  bool planned() const { return forward_ != nullptr; }
  // After Engine::Run, when planned(): the report (StreamedForward::Finish).
  absl::StatusOr<forward::ForwardAuditResult> Result() &&;

 private:
  const std::string layers_;
  const forward::ForwardAuditOptions options_;
  const forward::ForwardDevice device_;
  std::unique_ptr<forward::StreamedForward> forward_;
};

// The record's block_forward check.
evidence::CheckResult RecordOf(const forward::ForwardAuditResult& r);

// `ckpt-audit forward`: the forward check alone, run by the engine on options.root (and
// options.source) in options.memory_window, both trees' headers included. `layers` as for
// ForwardCheck (a spec: schema ckpt-audit.model-forward/1; then options.output_path must be
// empty). Errors: those of Engine::Open and Run (RESOURCE_EXHAUSTED when one unit of the
// forward does not fit the window), a root that is not a readable checkpoint, a layer spec or
// block it cannot use; a difference is a result with passed = false. `stats`, when given, gets
// the read's bytes and peak bytes held.
absl::StatusOr<forward::ForwardAuditResult> RunForward(const std::string& layers,
                                                       const forward::ForwardAuditOptions& options,
                                                       const forward::ForwardDevice& device,
                                                       forward::ForwardReadStats* stats = nullptr);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_FORWARD_CHECK_H_
