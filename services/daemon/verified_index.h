// What Gate may rely on: facts read only from log entries whose DSSE signature verified against
// the trust store and whose bytes are leaves of a Merkle tree this index recomputed itself and
// checked against the log's newest signed checkpoint (docs/daemon.md "Gate policies").
//
// The SQL index columns and subject rows are never read here: an attacker who can write the
// database file can insert rows, but cannot make an unsigned statement verify or change an
// entry without breaking the signed tree. The daemon is the log's only writer (the writer lock),
// so after the initial scan it extends the index with each entry it appends itself.
//
// Load runs once, typically on a background thread; Appended calls made before it finishes are
// applied after it. Thread-safe.
#ifndef CKPT_SERVICES_DAEMON_VERIFIED_INDEX_H_
#define CKPT_SERVICES_DAEMON_VERIFIED_INDEX_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/record.h"
#include "core/evidence/trust_store.h"
#include "core/progress.h"
#include "core/sha256.h"
#include "storage/evidence_log.h"
#include "storage/merkle.h"

namespace ckpt::daemon {

// SHA-256 over a subject list in a canonical order: equal keys mean the same file names with
// the same digests and the same OMS ROOT.
using ContentKey = Digest;
ContentKey ContentKeyOf(const std::vector<evidence::Subject>& subjects);

// Facts read from one verified evidence record.
struct AuditFacts {
  uint64_t seq = 0;
  std::string envelope_sha256;  // of the exact envelope bytes, as a decision cites it
  std::string policy;   // predicate.policy.name
  std::string verdict;  // predicate.verdict
  std::map<std::string, std::string> checks;  // check name -> "pass" | "fail" | "skipped"
  // The scale_window check's own verdict (details.verdict: "over-span", "rejected-nan-scale",
  // ...): what a failure of it is about (gate_policy.h).
  std::string scale_window_result;
  std::string source_manifest_root;  // predicate.source.manifest_root; empty when none is bound
  std::string time;                  // predicate.finished_at
  // Where the content came from, as the record states it (docs/hf-layouts.md): the Hugging Face
  // layout of the audited tree and of the source (hf_layout / source_hf_layout checks' details,
  // e.g. "hf-cache-snapshot"; empty when the record has no such check), and predicate.refs.
  std::string layout, source_layout;
  std::string model_ref, source_ref;
};

// Facts read from one verified gate decision (a verification summary by this daemon).
struct DecisionFacts {
  uint64_t seq = 0;
  bool pass = false;
  int64_t input_seq = -1;  // the record it rests on; -1 for none
  std::string time;        // timeVerified (RFC 3339)
  std::string source_manifest_root;  // predicate.source.manifest_root: the source it rests on
};

struct EntryProof {
  uint64_t leaf_index = 0;
  uint64_t tree_size = 0;
  std::vector<storage::Hash> hashes;
  storage::Hash root{};
  std::string checkpoint;  // the signed note for tree_size
};

class VerifiedLogIndex {
 public:
  // `verifier_id`: decisions by this verifier are indexed for reuse.
  VerifiedLogIndex(evidence::TrustStore trust, std::string origin, std::string verifier_id)
      : trust_(std::move(trust)), origin_(std::move(origin)), verifier_id_(std::move(verifier_id)) {}

  // Reads one snapshot of `log`: recomputes the tree from every entry's bytes, checks it against
  // the newest signed checkpoint, and indexes every entry whose signature verifies.
  void Load(const storage::EvidenceLog& log);

  // Extends the index with an entry this process appended, and the checkpoint signed with it
  // (empty when another entry follows in the same publication and its checkpoint comes next;
  // proofs stay against the last checked checkpoint until then).
  void Appended(uint64_t seq, const std::string& envelope, const std::string& checkpoint);

  // Waits for Load (polling `progress.Cancelled()`); then OK, or why gates cannot rely on the
  // log (it does not match its signed checkpoint).
  absl::Status WaitReady(const Progress& progress) const;
  // Like WaitReady without waiting: UNAVAILABLE while loading.
  absl::Status status() const;

  std::vector<AuditFacts> Audits(const ContentKey& key) const;  // oldest first
  // The facts of the verified evidence record at `seq`; nullopt when there is none (not an
  // audit record, not verified, or not indexed yet).
  std::optional<AuditFacts> AuditAt(uint64_t seq) const;
  std::optional<DecisionFacts> LatestDecision(const ContentKey& key, const std::string& policy_uri,
                                              const std::string& resource_uri) const;
  // OK when `envelope` is exactly the verified entry `seq`.
  absl::Status CheckEntry(uint64_t seq, const std::string& envelope) const;
  // Inclusion proof of entry `seq` against the newest verified checkpoint.
  absl::StatusOr<EntryProof> Prove(uint64_t seq) const;
  const std::string& origin() const { return origin_; }

 private:
  struct Facts {
    storage::MemoryTree tree;
    std::map<ContentKey, std::vector<AuditFacts>> audits;
    std::map<uint64_t, ContentKey> audit_keys;  // seq of each indexed audit -> its key
    std::map<std::string, DecisionFacts> decisions;  // by DecisionKey
    uint64_t checkpoint_size = 0;
    std::string checkpoint;
    absl::Status broken;  // set when the tree and the signed checkpoint disagree
  };
  static std::string DecisionKey(const ContentKey& key, const std::string& policy_uri,
                                 const std::string& resource_uri);
  void Index(uint64_t seq, const std::string& envelope, Facts& facts) const;
  void AddEntry(uint64_t seq, const std::string& envelope, Facts& facts) const;
  void CheckCheckpoint(const std::string& note, Facts& facts) const;
  void AppendedLocked(uint64_t seq, const std::string& envelope, const std::string& checkpoint);

  const evidence::TrustStore trust_;
  const std::string origin_;
  const std::string verifier_id_;
  mutable std::mutex mu_;
  mutable std::condition_variable loaded_;
  bool ready_ = false;  // guarded by mu_
  Facts facts_;         // guarded by mu_
  std::vector<std::pair<uint64_t, std::pair<std::string, std::string>>> pending_;  // guarded
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_VERIFIED_INDEX_H_
