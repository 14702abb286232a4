// What the CLI remembers about the evidence logs it reads (docs/evidence.md "Rollback and fork
// detection"): per user, the newest tree head verified for each log, as Go's sumdb client keeps
// the latest note of each log. The head of the log with origin O is a signed checkpoint in
// $XDG_STATE_HOME/ckpt-audit/heads/<hex SHA-256 of O> (default ~/.local/state/ckpt-audit/...),
// written by storage/head_state.h. Every command that opens a log goes through here, so a log
// rolled back or forked since this user last saw it is refused with both heads named.
#ifndef CKPT_SERVICES_CLI_LOG_HEADS_H_
#define CKPT_SERVICES_CLI_LOG_HEADS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "storage/evidence_log.h"
#include "storage/head_state.h"
#include "storage/merkle.h"

namespace ckpt::cli {

// The file remembering the head of the log with this origin (its directory created 0700).
absl::StatusOr<std::string> RememberedHeadFile(const std::string& origin);

// Opens `db` read-only and checks that the tree it stores extends the head remembered for it
// (no signature is checked: query, report, proof, export). FAILED_PRECONDITION names both heads.
absl::StatusOr<std::unique_ptr<storage::EvidenceLog>> OpenLogReader(const std::string& db);

// Opens `db` (created if missing) as its writer, refused the same way; every append then
// remembers its own checkpoint (storage::EvidenceLog::KeepHeadIn), so record ids continue from
// the newest head this user saw.
absl::StatusOr<std::unique_ptr<storage::EvidenceLog>> OpenLogWriter(const std::string& db);

// For commands that verified `newest` (its signature and, with `tree`, the entries under it):
// checks that it extends the remembered head, with the consistency proof built from `tree`, and
// remembers it when it is newer. FAILED_PRECONDITION names both heads.
absl::Status RememberVerifiedHead(const storage::NodeReader& tree,
                                  const storage::SignedHead& newest);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_LOG_HEADS_H_
