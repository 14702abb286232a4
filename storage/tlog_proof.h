// Portable proofs that an evidence record is in the log: C2SP tlog-proof@v1 (docs/interop.md).
//
//   c2sp.org/tlog-proof@v1
//   extra <base64 of the entry's exact DSSE envelope bytes>
//   index <leaf index>
//   <base64 sibling hash>            (RFC 6962 inclusion path, leaf side first; zero or more)
//
//   <the log's signed checkpoint, verbatim (storage/tlog_checkpoint.h)>
//
// The spec leaves `extra` opaque and unauthenticated; here it carries the entry itself, so the
// proof is self-contained: the verifier hashes it as an RFC 6962 leaf and checks the path up to
// the checkpoint's root. Nothing in `extra` is trusted before that check succeeds.
#ifndef CKPT_STORAGE_TLOG_PROOF_H_
#define CKPT_STORAGE_TLOG_PROOF_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "storage/evidence_log.h"
#include "storage/merkle.h"
#include "storage/note_key.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::storage {

inline constexpr char kTlogProofHeader[] = "c2sp.org/tlog-proof@v1";

struct TlogProof {
  std::optional<std::string> extra;  // decoded bytes
  uint64_t index = 0;
  std::vector<Hash> path;
  std::string checkpoint;  // signed note text
};

std::string FormatTlogProof(const TlogProof& proof);
// INVALID_ARGUMENT naming the line for anything that is not a well-formed proof.
absl::StatusOr<TlogProof> ParseTlogProof(const std::string& text);

// The proof for entry `seq` under the log's newest checkpoint, with the entry as `extra`.
absl::StatusOr<TlogProof> ProveEntry(const EvidenceLog& log, uint64_t seq);

struct VerifiedTlogProof {
  TreeHead head;
  uint64_t index = 0;
  std::string entry;  // the bytes the proof shows are logged
};

// Checks the checkpoint's signature by `vkey` (its name must be the checkpoint's origin), that
// index < size, and the inclusion path from the leaf of `entry` (or of `extra` when `entry` is
// absent) to the checkpoint's root. FAILED_PRECONDITION when something does not verify,
// INVALID_ARGUMENT when there is nothing to hash (no extra and no entry).
absl::StatusOr<VerifiedTlogProof> VerifyTlogProof(const TlogProof& proof,
                                                  const NoteVerifierKey& vkey,
                                                  const std::optional<std::string>& entry = {});

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_TLOG_PROOF_H_
