// Full verification of an evidence log, independent of what the log says about itself.
//
// Recomputes every leaf hash from the stored envelope bytes and the whole Merkle tree in memory,
// then checks: entries are numbered 0..n-1 without gaps; stored leaf hashes, tree nodes, index
// columns and subject rows match the signed payloads; every DSSE signature verifies with a
// trusted key; every checkpoint is signed by a trusted key for this log's origin and matches the
// recomputed root at its size; consecutive checkpoints are consistent (RFC 6962 proof, verified);
// the newest checkpoint covers every entry; SQLite's integrity_check passes and the append-only
// triggers are present. Every problem found is reported, not just the first.
#ifndef CKPT_STORAGE_LOG_VERIFIER_H_
#define CKPT_STORAGE_LOG_VERIFIER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/trust_store.h"
#include "storage/evidence_log.h"

namespace ckpt::storage {

struct LogVerification {
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

// Opens `path` without creating it and verifies it; a file SQLite cannot read is a problem too.
LogVerification VerifyLogFile(const std::string& path, const evidence::TrustStore& trust);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_LOG_VERIFIER_H_
