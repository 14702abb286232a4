// Verdicts attached to a model's manifest as OCI 1.1 referrers, each holding one Sigstore bundle
// v0.3 (docs/interop.md, "Attaching verdicts"): pushing them (through the referrers API when the
// registry has one, else the referrers tag schema), listing them, and checking one.
//
// A referrer is an OCI image manifest with artifactType kSigstoreBundleV03MediaType, the OCI
// empty config, one layer of that media type holding the bundle JSON, and a `subject` descriptor
// of the model manifest. Without the API the referrers are listed in an image index at the tag
// "sha256-HEX" of the model digest, updated read-merge-write until two reads in a row list every
// referrer any read showed (a registry that ignores If-Match leaves a race; docs/interop.md,
// "The race", says what concurrent attaches meet and what remains).
#ifndef CKPT_CORE_OCI_REFERRERS_H_
#define CKPT_CORE_OCI_REFERRERS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/trust_store.h"
#include "core/oci/manifest.h"
#include "core/oci/registry.h"

namespace ckpt::oci {

inline constexpr char kEmptyMediaType[] = "application/vnd.oci.empty.v1+json";
// The annotation naming the in-toto predicate type of a bundle (cosign's bundle layout).
inline constexpr char kPredicateTypeAnnotation[] = "dev.sigstore.bundle.predicateType";
inline constexpr uint64_t kMaxBundleBytes = 4u << 20;

// "sha256-HEX": the referrers tag schema's tag for `digest`.
std::string ReferrersTag(const std::string& digest);

struct Attached {
  std::string digest;          // the referrer manifest's digest
  bool referrers_api = false;  // the registry answered OCI-Subject; no tag index was written
  int index_writes = 0;        // tag index writes (retries after a lost update included)
};

// Pushes `bundle_json` (whose statement has predicate type `predicate_type`) as a referrer of the
// manifest `subject`. Steps that meet a concurrent writer (ABORTED or UNAVAILABLE answers, a
// tag index that lost an entry) are tried again, 12 attempts each: then ABORTED or the
// registry's last answer. INVALID_ARGUMENT when the tag holds something that is not an image
// index (never overwritten).
absl::StatusOr<Attached> AttachBundle(const Registry& reg, const Descriptor& subject,
                                      const std::string& bundle_json,
                                      const std::string& predicate_type);

struct ReferrerList {
  // Referrers of artifactType kSigstoreBundleV03MediaType, each digest once however often the
  // registry lists it.
  std::vector<Descriptor> bundles;
  bool referrers_api = false;       // listed by the API (else the tag index, maybe absent)
};
absl::StatusOr<ReferrerList> ListReferrers(const Registry& reg, const std::string& digest);

// Why a referrer did not verify. Names are stable: verify-oci prints them, tests assert them.
enum class ReferrerReason {
  kOk,
  kMissingReferrer,   // listed, but its manifest or bundle blob is gone
  kMalformed,         // not a referrer manifest of one bundle layer, or not a bundle
  kSignatureInvalid,  // the DSSE signature is not by a trusted key, or does not verify
  kSubjectMismatch,   // the manifest's or the statement's subject is not the model digest
};
std::string ReferrerReasonName(ReferrerReason reason);

struct CheckedReferrer {
  std::string digest;  // the referrer manifest
  ReferrerReason reason = ReferrerReason::kOk;
  std::string detail;
  std::string keyid;           // the trusted key that signed (kOk only)
  std::string predicate_type;  // of the statement (kOk only)
  bool passed = false;         // verificationResult / result PASSED (kOk only)
};

// Fetches the referrer `referrer` of `digest`, checks its layout, the bundle's DSSE signature
// against `trust`, and that the statement's only subject is `digest`.
CheckedReferrer CheckReferrer(const Registry& reg, const Descriptor& referrer,
                              const std::string& digest, const evidence::TrustStore& trust);

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_REFERRERS_H_
