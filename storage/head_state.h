// Remembered tree heads: the newest signed checkpoint of an evidence log that a process has
// verified, kept in a file of its own, so that a log rolled back (entries removed from its end) or
// forked (another tree under the same origin) is noticed the next time it is read, as Go's sumdb
// client keeps the latest note of each log it uses (docs/evidence.md "Rollback and fork
// detection").
//
// The file holds one signed checkpoint note, verbatim (storage/tlog_checkpoint.h): two remembered
// notes of one size with different roots are a signed proof of a fork. It is replaced atomically
// and durably: a new file (0600) in the same directory, written and fsynced, renamed over the old
// one, then the directory fsynced. It is read only when it is a regular file of at most 64 KiB,
// owned by this process's user, that neither group nor others can write.
#ifndef CKPT_STORAGE_HEAD_STATE_H_
#define CKPT_STORAGE_HEAD_STATE_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/trust_store.h"
#include "storage/evidence_log.h"
#include "storage/merkle.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::storage {

struct SignedHead {
  TreeHead head;
  std::string note;  // the signed checkpoint of `head`; empty for an empty log
};

// "size N root <hex>" for messages.
std::string DescribeHead(const TreeHead& head);

// The head remembered in `path`; nullopt when no file is there. FAILED_PRECONDITION for a file of
// another owner or one that group or others can write, DATA_LOSS for contents that are not a
// checkpoint note, both naming the path.
absl::StatusOr<std::optional<SignedHead>> ReadHeadFile(const std::string& path);

// Replaces the file at `path` with `note`, as the file comment describes. Errors name the path.
absl::Status WriteHeadFile(const std::string& path, const std::string& note);

// OK when `newer` extends `older`: the same origin, at least as many entries, and the RFC 6962
// consistency proof from `older` to `newer`, built from `tree` (which must hold the newer tree),
// verifies against both roots. Otherwise FAILED_PRECONDITION naming both heads: the log was
// rolled back (fewer entries), forked (same size, another root) or is not consistent.
absl::Status CheckExtends(const NodeReader& tree, const TreeHead& older, const TreeHead& newer);

// The log's newest checkpoint, its signature verified by a key in `trust` under the log's origin;
// FAILED_PRECONDITION unless it covers every entry. An empty log gives size 0 and the empty root.
absl::StatusOr<SignedHead> NewestSignedHead(const EvidenceLog& log,
                                            const evidence::TrustStore& trust);

// The tree the log stores, its size counted from its entries and its root from its stored nodes;
// no signature is checked (for readers without a trust store, and a writer about to append).
absl::StatusOr<TreeHead> StoredHead(const EvidenceLog& log);

// What ckpt-auditd does at start with its log and the head it remembers (docs/daemon.md):
// without a remembered head it verifies the whole log and remembers its newest head; with one it
// checks that the log's newest signed head extends it (FAILED_PRECONDITION naming both heads
// otherwise, or when a head is remembered but the database is gone) and remembers a longer one.
// `adopted` says whether the head file was (re)written, `message` what happened, for the daemon's
// log; `warning` is set when a log without a remembered head did not verify (nothing is
// remembered then) or when the head file could not be written.
struct HeadAtStart {
  std::string message;
  bool adopted = false;
  bool warning = false;
};
absl::StatusOr<HeadAtStart> CheckHeadAtStart(const std::string& db_path,
                                             const std::string& head_path,
                                             const evidence::TrustStore& trust);

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_HEAD_STATE_H_
