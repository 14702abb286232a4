// SLSA Provenance v1 (https://slsa.dev/provenance/v1) for a transcode: what a derived checkpoint
// was made from, by which tool, under which policy (docs/interop.md, "Provenance").
//
//   subject                  the derived checkpoint's files and its OMS manifest ROOT
//   buildDefinition
//     buildType              https://ckpt-audit.dev/transcode/v1
//     externalParameters     target_format, layout (compressed-tensors | modelopt; absent in
//                            statements written before layouts), policy {name, version,
//                            thresholds}, source and output paths, source_ref (when given,
//                            e.g. a repo@revision)
//     resolvedDependencies   the source's files and OMS ROOT (by SHA-256); source_ref as a uri
//   runDetails
//     builder                id https://ckpt-audit.dev/cli, version {ckpt-audit: VERSION}
//     metadata               startedOn, finishedOn
//     byproducts             one descriptor named "environment" whose annotations are the
//                            environment block of evidence records (core/evidence/environment.h)
// Compact, float-free JSON, signed like every other statement (DSSE, core/evidence/dsse.h).
#ifndef CKPT_CORE_EVIDENCE_PROVENANCE_H_
#define CKPT_CORE_EVIDENCE_PROVENANCE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/environment.h"
#include "core/evidence/record.h"
#include "nlohmann/json.hpp"

namespace ckpt::evidence {

inline constexpr char kSlsaProvenanceType[] = "https://slsa.dev/provenance/v1";
inline constexpr char kTranscodeBuildType[] = "https://ckpt-audit.dev/transcode/v1";
inline constexpr char kCliBuilderId[] = "https://ckpt-audit.dev/cli";
inline constexpr char kSourceRefName[] = "source-ref";

struct TranscodeProvenance {
  std::vector<Subject> derived;  // files + kManifestRootSubject
  std::vector<Subject> source;   // files + kManifestRootSubject
  std::string source_ref;        // empty when not given
  std::string target_format;
  std::string layout;  // empty: not recorded (read back from an older statement)
  PolicyRef policy;
  std::string source_path;  // realpaths, informative: digests are what bind
  std::string output_path;
  Environment environment;
  std::string started_at, finished_at;
};

// INVALID_ARGUMENT for a malformed digest or a float in the policy thresholds.
absl::StatusOr<std::string> ProvenancePayload(const TranscodeProvenance& provenance);

// Reads back what ProvenancePayload wrote (duplicate keys, missing or mistyped fields, another
// predicate or build type: INVALID_ARGUMENT). Environment fields are not read back.
absl::StatusOr<TranscodeProvenance> ParseProvenance(const std::string& payload);

// Log index columns of a provenance predicate (used by IndexPayload): root = output path,
// policy, verdict "pass" (a provenance statement is only written for a finished transcode), time.
absl::Status IndexProvenance(const nlohmann::json& predicate, RecordIndex* index);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_PROVENANCE_H_
