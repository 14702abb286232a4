// Gate policies: which checks a gate decision needs, by the format of the content, and the
// decision itself from the verified records of exactly that content (docs/daemon.md
// "Gate policies").
//
//   derived-lossless  NVFP4 (compressed-tensors) and X4T checkpoints: a record whose
//                     `checkpoint_structure` and `pair_verify` checks ran, optionally against a
//                     pinned source (its bound OMS ROOT, predicate.source.manifest_root)
//   mxfp4-original    MXFP4 checkpoints (gpt-oss, compressed-tensors): `checkpoint_structure`
//                     and `scale_window` ran (a skipped check did not run)
//   none              anything else: no record can make it pass
//
// Records under another scale-window policy, records that did not run every required check,
// and (when pinned) records against another source are outside the policy's scope and never
// decide. Of those in scope the newest decides: it passes only when every required check passed
// and its overall verdict is pass, so a newer failing record revokes an older pass.
#ifndef CKPT_SERVICES_DAEMON_GATE_POLICY_H_
#define CKPT_SERVICES_DAEMON_GATE_POLICY_H_

#include <optional>
#include <string>
#include <vector>

#include "core/quant/format.h"
#include "services/daemon/verified_index.h"

namespace ckpt::daemon {

enum class GateRequirement { kDerivedLossless, kMxfp4Original, kNone };

struct GatePolicy {
  GateRequirement requirement = GateRequirement::kNone;
  std::string format;        // what the content was detected as, for reasons
  std::string scale_policy;  // the audit policy name records must carry
  std::string source_manifest_root;  // pinned source OMS ROOT (lower-case hex), or empty

  std::string Name() const;  // "gate-derived-lossless", "gate-mxfp4-original", "gate-none"
  // "ckpt-audit:gate/derived-lossless@1?policy=scale-window[&source=HEX]": what the signed
  // decision states as its policy.
  std::string Uri() const;
  std::vector<std::string> RequiredChecks() const;
};

GateRequirement RequirementOf(quant::QuantFormat format, uint64_t x4t_sidecars);

struct GateOutcome {
  bool pass = false;
  std::optional<AuditFacts> record;  // the record that decided, if one did
  std::vector<std::string> reasons;
};

// `audits`: every verified record of exactly the content, oldest first.
GateOutcome Decide(const GatePolicy& policy, const std::vector<AuditFacts>& audits);

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_GATE_POLICY_H_
