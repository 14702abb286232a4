// Attaching an audit record to the OCI manifest it was audited from (docs/interop.md,
// "Attaching verdicts"): what `ckpt-audit attach` and `ckpt-auditd --attach` both do.
//
// The record's verification summary and its logged in-toto test result are re-stated with the
// model manifest digest as their only subject (what cosign and Kyverno match on), signed with
// the evidence key as DSSE envelopes, and pushed as Sigstore bundle v0.3 referrers of the
// manifest (core/oci/referrers.h). Nothing is written to the log.
#ifndef CKPT_CORE_OCI_ATTACH_RECORD_H_
#define CKPT_CORE_OCI_ATTACH_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"
#include "core/oci/reference.h"
#include "core/oci/referrers.h"
#include "storage/evidence_log.h"

namespace ckpt::oci {

struct AttachedStatement {
  std::string predicate_type;  // of the statement the referrer holds
  Attached referrer;
};

// Pushes the summary (verifier `verifier_id`), then the test result, of the evidence record
// `id` of `log` as referrers of the manifest `manifest` names by digest. Errors, before
// anything is pushed: INVALID_ARGUMENT for a `manifest` without a digest or an entry that is no
// evidence record; FAILED_PRECONDITION for a record not signed by `key` and, starting
// "not-audited-from-manifest", for one whose typed `oci_manifest` is not that digest or whose
// root is not a reference by it (a subject named oci-manifest never counts); NOT_FOUND for a
// record with no test result in the log. Then the registry's (core/oci/registry.h) and
// AttachBundle's; a summary already pushed stays when the test result's push fails.
absl::StatusOr<std::vector<AttachedStatement>> AttachRecord(const storage::EvidenceLog& log,
                                                            uint64_t id,
                                                            const Reference& manifest,
                                                            const evidence::SigningKey& key,
                                                            const std::string& verifier_id);

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_ATTACH_RECORD_H_
