// The file a part of a split audit writes (core/audit/parts.h, docs/audit-parts.md): its
// AuditPart as JSON, signed by the node's key in a DSSE envelope (core/evidence/dsse.h). The
// merge trusts only parts signed by a key of its part trust file, never the record trust store.
#ifndef CKPT_CORE_AUDIT_PART_FILE_H_
#define CKPT_CORE_AUDIT_PART_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/audit/parts.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/trust_store.h"

namespace ckpt::audit {

inline constexpr char kAuditPartPayloadType[] = "application/vnd.ckpt-audit.part+json";

// The envelope's text. INVALID_ARGUMENT when a digest-free value cannot be written (a policy or
// ref that is not valid UTF-8).
absl::StatusOr<std::string> SignAuditPart(const AuditPart& part, const evidence::SigningKey& key);

// The part in `envelope` (the exact bytes of a part file; `label` names it in errors), with the
// key id that signed it and the SHA-256 of those bytes. FAILED_PRECONDITION when no key of
// `trust` signed it or its signature does not verify (an edited file); INVALID_ARGUMENT for
// anything that is not a part envelope.
absl::StatusOr<SignedPart> OpenAuditPart(const std::string& envelope,
                                         const evidence::TrustStore& trust,
                                         const std::string& label);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_PART_FILE_H_
