// The evidence record: what one audit proved about one checkpoint (schema: docs/evidence.md).
//
// A record is an in-toto Statement v1 whose subjects are the checkpoint's files and its OMS
// manifest ROOT, with a predicate (type kEvidencePredicateType) holding the policy, every check
// with its verdict, counts and first findings, optional pair-audit and block-forward results,
// the environment and the start/finish times. Each check contributes one typed CheckResult
// (check_result.h); the rest of the pipeline does not need to know what a check does. The
// Statement's JSON is written here, in check_result.cc and in block_forward.cc
// (docs/evidence.md "Where JSON is produced"). Payloads are float-free (see json_guard.h) and are signed as exact bytes in a DSSE
// envelope. Roots are recorded in the name encoding (core/text/name_encoding.h); subject names
// arrive encoded from the fingerprint.
#ifndef CKPT_CORE_EVIDENCE_RECORD_H_
#define CKPT_CORE_EVIDENCE_RECORD_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/block_forward.h"
#include "core/evidence/check_result.h"
#include "core/evidence/environment.h"
#include "nlohmann/json.hpp"

namespace ckpt::evidence {

inline constexpr char kEvidencePredicateType[] = "https://ckpt-audit.dev/evidence/v1";
inline constexpr int kEvidenceSchemaVersion = 2;
inline constexpr char kVerificationSummaryType[] = "https://slsa.dev/verification_summary/v1";
// The subject name that carries the OMS manifest ROOT digest.
inline constexpr char kManifestRootSubject[] = "oms-manifest-root";
// The subject name that carries the digest of the OCI manifest a tree was read from, beside the
// typed `oci_manifest` field that alone binds a record to it (docs/interop.md, "How digests
// bind").
inline constexpr char kOciManifestSubject[] = "oci-manifest";
struct Subject {
  std::string name;    // POSIX path relative to the root, or kManifestRootSubject
  std::string sha256;  // lowercase hex
};

// The subject names above name no file, so no file may carry one: INVALID_ARGUMENT naming
// `root`/`name` when `name`, a file's recorded name, is one of them (docs/evidence.md,
// "Reserved names"). Called wherever a tree's files become subjects.
absl::Status CheckFileSubjectName(const std::string& root, const std::string& name);

// A policy as statements name it. `thresholds` stays JSON: provenance statements read it back
// and carry it on unchanged (provenance.h); records make it with ScaleWindowPolicyRef.
struct PolicyRef {
  std::string name;
  std::string version;
  nlohmann::ordered_json thresholds = nlohmann::ordered_json::object();
  std::string uri{};  // a verification summary's policy URI; empty: ckpt-audit:policy/NAME@VERSION
};

// The scale-window policy's entry: its name, version and thresholds.
PolicyRef ScaleWindowPolicyRef(const ScaleWindowThresholds& thresholds);

// The source of a pair audit, bound by content: what the derived checkpoint was proved
// lossless against (in-toto resolvedDependencies style; docs/evidence.md "Source binding").
struct SourceBinding {
  std::string root;           // real path of the source directory as opened
  std::string manifest_root;  // its OMS manifest ROOT (hex)
  std::vector<Subject> files;  // every file's SHA-256, as in subjects
  std::string oci_manifest;    // as EvidenceRecord::oci_manifest, for the source
};

// Strings the caller vouches for, recorded exactly as given (empty: not recorded).
struct ExternalRefs {
  std::string model_ref;     // e.g. a Hugging Face repo@revision of the audited checkpoint
  std::string source_ref;    // the same for the source
  std::string image_digest;  // the container image the audit ran in
};

// One part of an audit split across machines and merged into one record
// (docs/audit-parts.md): who signed it, where it ran, and the SHA-256 of its signed envelope.
struct PartRef {
  std::string signer;  // key id of the node key
  std::string host;
  std::string digest;  // lowercase hex
};

struct EvidenceRecord {
  std::string root;  // real path of the audited checkpoint directory as opened
  // "sha256:HEX" of the OCI manifest the root was read from, set only by the audit engine from a
  // registry read (core/audit ReadBinding); empty for a root on a file system. attach binds a
  // record to a manifest by this field alone: no file of a tree can set it.
  std::string oci_manifest;
  std::optional<SourceBinding> source;  // pair audits only
  ExternalRefs refs;
  std::string invoker;  // who caused the audit (the daemon's authenticated caller), if known
  std::vector<Subject> subjects;
  PolicyRef policy;
  std::vector<CheckResult> checks;
  std::optional<PairAudit> pair_audit;   // a pair audit's full result
  std::optional<BlockForward> block_forward;  // the block forward's report, when one ran
  std::vector<PartRef> parts;  // a merged split audit's parts, by index; empty otherwise
  Environment environment;
  std::string started_at;  // RFC 3339 UTC
  std::string finished_at;

  // fail if any check failed; otherwise pass (skipped checks do not count either way).
  Verdict OverallVerdict() const;
};

// The Statement's exact bytes. INVALID_ARGUMENT when a float slipped in or a subject digest is
// not 64 hex characters.
absl::StatusOr<std::string> RecordPayload(const EvidenceRecord& record);

// A gate decision as an SLSA verification summary Statement over the same subjects.
// `input_uri` names the log entry holding the full record; `input_sha256` is the digest of its
// exact envelope bytes. With an empty `input_uri` the decision rests on no record and
// inputAttestations is empty. With `record.source`, predicate.source.manifest_root names the
// source OMS ROOT the decision rests on (docs/evidence.md).
absl::StatusOr<std::string> VerificationSummaryPayload(const EvidenceRecord& record,
                                                       const std::string& verifier_id,
                                                       const std::string& input_uri,
                                                       const std::string& input_sha256);

// The fields a log indexes, read back from a signed payload (either predicate type).
struct RecordIndex {
  std::string predicate_type;
  std::string root;
  std::string policy;
  std::string verdict;  // "pass" / "fail"
  std::string time;     // finished_at (or timeVerified)
  std::string oci_manifest;  // an evidence record's EvidenceRecord::oci_manifest
  std::vector<Subject> subjects;
  // A pair audit's bound source: its files and, under kManifestRootSubject, its OMS ROOT.
  std::vector<Subject> source_subjects;
};
// INVALID_ARGUMENT if the payload is not a Statement v1 with one of our predicate types
// (evidence, verification summary, test result: core/evidence/test_result.h, provenance:
// core/evidence/provenance.h).
absl::StatusOr<RecordIndex> IndexPayload(const std::string& payload);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_RECORD_H_
