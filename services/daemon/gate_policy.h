// Gate policies: which checks a gate decision needs, by the format of the content, and the
// decision itself from the verified records of exactly that content (docs/daemon.md
// "Gate policies" and "Revocation").
//
//   derived-lossless  NVFP4 (compressed-tensors) and X4T checkpoints: a record whose
//                     `checkpoint_structure` and `pair_verify` checks ran, optionally against a
//                     pinned source (its bound OMS ROOT, predicate.source.manifest_root); the
//                     pass rests on that record's source
//   mxfp4-original    MXFP4 checkpoints (gpt-oss, compressed-tensors): `checkpoint_structure`
//                     and `scale_window` ran (a skipped check did not run); the pass rests on
//                     no source
//   none              anything else: no record can make it pass
//
// A pass comes from a record under the requested scale-window policy that ran and passed every
// required check (and, when pinned, is bound to that source). It stands unless that record or a
// newer one of the same content has a failing check that is about what the pass rests on:
//
//   the content itself  any check that depends on neither policy nor source (structure,
//                       layout, NaN scales, ...; also any check this daemon does not know)
//                       revokes passes under every policy and pin
//   the source          pair_verify, source_hf_layout and (in a pair audit) block_forward revoke
//                       only passes that rest on the same source ROOT
//   the policy          scale_window over-span revokes only passes under the same policy
//
// So another source's failure is no lever to block a release, and a content failure cannot be
// dodged by asking for another policy. The newest unrevoked pass decides; without one, the
// newest revoking record (or the newest failing record in scope) decides the failure.
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

// What a failing check of a record is about (see above).
enum class FailureScope { kContent, kSource, kPolicy };
FailureScope ScopeOf(const AuditFacts& record, const std::string& check);

struct GateOutcome {
  bool pass = false;
  std::optional<AuditFacts> record;  // the record that decided, if one did
  // The source OMS ROOT a pass rests on (the deciding record's, for derived-lossless); empty
  // for a failure and for a pass that rests on no source.
  std::string source_manifest_root;
  std::vector<std::string> reasons;
};

// `audits`: every verified record of exactly the content, oldest first.
GateOutcome Decide(const GatePolicy& policy, const std::vector<AuditFacts>& audits);

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_GATE_POLICY_H_
