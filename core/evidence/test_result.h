// The in-toto Test Result statement (predicate https://in-toto.io/attestation/test-result/v0.1)
// that accompanies every audit record, so policy engines that know only the standard predicates
// can consume a verdict (docs/interop.md, "Test results").
//
// Subject: the checkpoint's OMS manifest ROOT (the `oms-manifest-root` subject of the record).
// Predicate: result PASSED / FAILED (the record's overall verdict), passedTests / failedTests =
// the names of the checks that passed / failed (skipped checks are in neither list; warnedTests
// is always empty), configuration = the policy (name, `ckpt-audit:policy/NAME@VERSION`,
// thresholds as annotations) and the detailed record it summarizes (its log position and the
// SHA-256 of its exact envelope bytes), url = that log position. Float-free compact JSON.
#ifndef CKPT_CORE_EVIDENCE_TEST_RESULT_H_
#define CKPT_CORE_EVIDENCE_TEST_RESULT_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/record.h"
#include "nlohmann/json.hpp"

namespace ckpt::evidence {

inline constexpr char kTestResultPredicateType[] =
    "https://in-toto.io/attestation/test-result/v0.1";
// The configuration entry that names the detailed record.
inline constexpr char kRecordLinkName[] = "ckpt-audit-evidence-record";

// Where the detailed record is: "<log origin>#<record id>" and hex SHA-256 of its envelope.
struct RecordLink {
  std::string uri;
  std::string envelope_sha256;
};

// INVALID_ARGUMENT when the record has no OMS ROOT subject or a digest is malformed.
absl::StatusOr<std::string> TestResultPayload(const EvidenceRecord& record,
                                              const RecordLink& link);

// The detailed record a test-result payload links to; INVALID_ARGUMENT if it names none.
absl::StatusOr<RecordLink> TestResultRecordLink(const std::string& payload);

// Log index columns of a test-result predicate (used by IndexPayload): policy, verdict.
absl::Status IndexTestResult(const nlohmann::json& predicate, RecordIndex* index);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_TEST_RESULT_H_
