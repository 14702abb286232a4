// Publishing an audit: the one function the CLI and the daemon both call once an audit has
// produced its record. It signs the detailed evidence record, appends it, then signs the in-toto
// Test Result that summarizes it (core/evidence/test_result.h, linked to the record by log
// position and envelope digest) and appends that too (docs/interop.md, "Test results").
//
// The caller must hold whatever lock guards `log` (one EvidenceLog per thread). The two appends
// are separate transactions: if the process dies between them the record stays (nothing stored
// is ever lost) and simply has no test result.
#ifndef CKPT_CORE_INTEROP_PUBLISH_H_
#define CKPT_CORE_INTEROP_PUBLISH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/record.h"
#include "storage/evidence_log.h"

namespace ckpt::interop {

struct PublishedAudit {
  uint64_t record_id = 0;
  uint64_t test_result_id = 0;
  std::string record_envelope;
  std::string test_result_envelope;
  storage::AppendResult last;  // the tree after both appends
};

absl::StatusOr<PublishedAudit> PublishAudit(const evidence::EvidenceRecord& record,
                                            const evidence::SigningKey& key,
                                            storage::EvidenceLog& log);

// "<log origin>#<id>": how statements name a log entry.
std::string EntryUri(const storage::EvidenceLog& log, uint64_t id);

}  // namespace ckpt::interop

#endif  // CKPT_CORE_INTEROP_PUBLISH_H_
