// `ckpt-audit export --format intoto-jsonl`: one logged statement and its companions as an in-toto
// bundle, i.e. JSON Lines with one DSSE envelope per line, the exact bytes stored in the log
// (docs/interop.md, "Export"). Companions of an evidence record are the test results and
// verification summaries in the log that name it ("<origin>#<id>") together with the SHA-256 of
// its exact envelope. Nothing is verified here: consumers verify what they read.
#ifndef CKPT_CORE_INTEROP_INTOTO_BUNDLE_H_
#define CKPT_CORE_INTEROP_INTOTO_BUNDLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/evidence_log.h"

namespace ckpt::interop {

struct ExportedBundle {
  std::vector<uint64_t> ids;  // ascending; the lines of `jsonl` in this order
  std::string jsonl;
};

// For an evidence record: it and its companions. For a test result: the record it names and that
// record's companions. For anything else: the entry alone. NOT_FOUND for an unknown id.
absl::StatusOr<ExportedBundle> ExportInTotoBundle(const storage::EvidenceLog& log, uint64_t id);

}  // namespace ckpt::interop

#endif  // CKPT_CORE_INTEROP_INTOTO_BUNDLE_H_
