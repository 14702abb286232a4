// Full verification of an evidence log, independent of what the log says about itself.
//
// Recomputes every leaf hash from the stored envelope bytes and the whole Merkle tree in memory,
// then checks: entries are numbered 0..n-1 without gaps; stored leaf hashes, tree nodes, index
// columns and subject rows match the signed payloads; every DSSE signature verifies with a
// trusted key; every checkpoint is signed by a trusted key for this log's origin and matches the
// recomputed root at its size; consecutive checkpoints are consistent (RFC 6962 proof, verified);
// the newest checkpoint covers every entry; SQLite's integrity_check passes and the append-only
// triggers are present. Every problem found is reported, not just the first. The whole run reads
// one snapshot of the log (one read transaction), so concurrent appends do not disturb it.
//
// Incremental mode starts from a state a previous clean run returned (the recomputed tree of the
// entries it verified and the signed root at that size): it checks the log's own consistency
// proof from that size to the newest checkpoint against both signed roots, then verifies only
// the newer entries, subjects, tree nodes and checkpoints as above. It trusts that entries it
// verified before were not rewritten since (a full run checks that) and skips SQLite's
// integrity_check, whose cost is the whole file.
#ifndef CKPT_STORAGE_LOG_VERIFIER_H_
#define CKPT_STORAGE_LOG_VERIFIER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/trust_store.h"
#include "storage/evidence_log.h"

namespace ckpt::storage {

// What a clean verification established: the recomputed tree of entries [0, size) and the root
// the log signed at that size (the empty root for an empty log), with that signed checkpoint
// (empty for an empty log).
struct VerifiedLogState {
  MemoryTree tree;
  uint64_t size = 0;
  Hash root{};
  std::string note;
};

struct LogVerification {
  std::string origin;
  uint64_t verified_from = 0;  // entries before this were verified by an earlier run
  uint64_t entries = 0;
  uint64_t checkpoints = 0;
  uint64_t signatures_verified = 0;
  std::string root_hex;  // recomputed root over all entries
  std::vector<std::string> problems;
  bool ok() const { return problems.empty(); }
};

// Errors only when the log cannot be read at all (DATA_LOSS for a corrupt file); anything
// wrong with its contents is a problem in the result.
absl::StatusOr<LogVerification> VerifyLog(const EvidenceLog& log,
                                          const evidence::TrustStore& trust);

// Verifies entries from `from.size` on (a full run when `from` is empty). When the result has no
// problems, `state` (if given) receives the state to continue from next time.
absl::StatusOr<LogVerification> VerifyLogFrom(const EvidenceLog& log,
                                              const evidence::TrustStore& trust,
                                              VerifiedLogState from, VerifiedLogState* state);

// Opens `path` without creating it and verifies it; a file SQLite cannot read is a problem too.
// When the result has no problems, `state` (if given) receives what the run established.
LogVerification VerifyLogFile(const std::string& path, const evidence::TrustStore& trust,
                              VerifiedLogState* state = nullptr);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_LOG_VERIFIER_H_
