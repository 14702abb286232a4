// One audit between opening its trees and signing its record (core/audit/audit_checks.h): the
// engine on both trees, the checks the options ask for, and the record assembled from the
// completed images. RunAudit does it all on one machine; an audit split across machines
// (core/audit/parts.h, docs/audit-parts.md) streams a share of the checks' units on each node and
// assembles the record at the merge, from images completed with the digests the parts took.
#ifndef CKPT_CORE_AUDIT_AUDIT_RUN_H_
#define CKPT_CORE_AUDIT_AUDIT_RUN_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/audit/audit_checks.h"
#include "core/audit/engine.h"
#include "core/audit/forward_check.h"
#include "core/audit/pair_check.h"
#include "core/audit/scale_window_check.h"

namespace ckpt::audit {

class AuditRun {
 public:
  // Errors: an unknown policy (INVALID_ARGUMENT) and Engine::Open's. `tensor_digests`: every
  // tensor's SHA-256 from the one read too (EngineOptions).
  static absl::StatusOr<std::unique_ptr<AuditRun>> Open(const AuditOptions& options,
                                                        Progress& progress,
                                                        bool tensor_digests = false);

  const Engine& engine() const { return *engine_; }
  // The checks the options ask for, in planning order.
  std::vector<Check*> checks();
  ScaleWindowCheck& window() { return window_; }
  PairCheck& pair() { return pair_; }

  // The record, from `images` (root first) with every file's digests and the checks' results
  // complete; `bytes_read` is the fingerprint's count. DATA_LOSS when a name no longer leads to
  // what was read. Once.
  absl::StatusOr<evidence::EvidenceRecord> Record(
      const std::vector<std::shared_ptr<const TreeImage>>& images, uint64_t bytes_read) &&;

 private:
  AuditRun(const AuditOptions& options, const quant::ScaleWindowConfig& policy);
  const AuditOptions options_;
  evidence::EvidenceRecord rec_;  // started_at, environment, policy, refs, invoker
  std::unique_ptr<Engine> engine_;
  ScaleWindowCheck window_;
  PairCheck pair_;
  ForwardCheck forward_;
};

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_AUDIT_RUN_H_
