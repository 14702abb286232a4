#include "storage/log_verifier.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "storage/merkle.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::storage {
namespace {

constexpr size_t kMaxProblems = 100;  // enough to diagnose; a wrecked log would list millions

class Verifier {
 public:
  Verifier(const EvidenceLog& log, const evidence::TrustStore& trust, VerifiedLogState from)
      : log_(log), trust_(trust), tree_(std::move(from.tree)), from_(from.size) {
    out_.origin = log.origin();
    out_.verified_from = from_;
    if (from_ > 0) {
      have_last_ = true;
      last_size_ = from_;
      last_root_ = from.root;
      last_note_ = std::move(from.note);
    }
  }

  absl::StatusOr<LogVerification> Run() {
    if (from_ == 0) {
      // A damaged file is a finding, not the end of the run: the walks below still read what
      // they can.
      auto integrity = log_.IntegrityCheck();
      if (!integrity.ok()) {
        Problem(absl::StrCat("sqlite integrity_check: ", integrity.status().message()));
      } else if (*integrity != "ok") {
        Problem(absl::StrCat("sqlite integrity_check: ", *integrity));
      }
    } else if (auto s = CheckConsistencyFromVerified(); !s.ok()) {
      return s;
    }
    if (auto s = CheckTriggers(); !s.ok()) return s;
    if (auto s = log_.ForEachEntry([&](const LogEntry& e) { return Entry(e); }, from_);
        !s.ok()) {
      return s;
    }
    out_.entries = tree_.size();
    out_.root_hex = ToHex(tree_.Root());
    if (auto s = CheckSubjects(); !s.ok()) return s;
    if (auto s = CheckNodes(); !s.ok()) return s;
    if (auto s = log_.ForEachCheckpoint(
            [&](uint64_t size, const std::string& note) { return Checkpoint(size, note); },
            from_ + (from_ > 0 ? 1 : 0));
        !s.ok()) {
      return s;
    }
    if (!have_last_ && tree_.size() > 0) {
      Problem("no signed checkpoint covers the entries");
    } else if (last_size_ != tree_.size()) {
      Problem(absl::StrCat("newest checkpoint is for size ", last_size_, " but the log holds ",
                           tree_.size(), " entries"));
    }
    return out_;
  }

  VerifiedLogState State() {
    VerifiedLogState state;
    state.size = last_size_;
    state.root = last_root_;
    state.note = std::move(last_note_);
    state.tree = std::move(tree_);
    return state;
  }

 private:
  void Problem(std::string p) {
    if (out_.problems.size() < kMaxProblems) out_.problems.push_back(std::move(p));
  }

  // The log's own proof that its newest signed tree extends the one verified last time.
  absl::Status CheckConsistencyFromVerified() {
    auto size = log_.Size();
    if (!size.ok()) return size.status();
    if (*size < from_) {
      Problem(absl::StrCat("the log holds ", *size, " entries, fewer than the ", from_,
                           " verified before; entries were removed"));
      return absl::OkStatus();
    }
    auto latest = log_.LatestCheckpoint();
    if (!latest.ok()) return latest.status();
    auto head = VerifyCheckpoint(latest->second, log_.origin(), trust_);
    if (!head.ok() || head->size != latest->first) {
      Problem(absl::StrCat("checkpoint ", latest->first, ": does not verify"));
      return absl::OkStatus();
    }
    auto proof = log_.ConsistencyProof(from_, head->size);
    if (!proof.ok() ||
        !VerifyConsistency(from_, head->size, *proof, last_root_, head->root).ok()) {
      Problem(absl::StrCat("checkpoint ", head->size,
                           ": the log's consistency proof from the verified checkpoint ", from_,
                           " does not verify"));
    }
    return absl::OkStatus();
  }

  absl::Status CheckTriggers() {
    auto names = log_.TriggerNames();
    if (!names.ok()) return names.status();
    std::vector<std::string> wanted;
    for (const char* t : {"meta", "entries", "subjects", "tree_nodes", "checkpoints"}) {
      for (const char* op : {"UPDATE", "DELETE"}) wanted.push_back(absl::StrCat(t, "_no_", op));
    }
    if (log_.schema_version() >= 2) {
      for (const char* t : {"entries_in_order", "subjects_of_newest", "tree_nodes_of_newest",
                            "checkpoints_of_size", "jobs_no_DELETE", "jobs_request_fixed"}) {
        wanted.push_back(t);
      }
    }
    for (const std::string& want : wanted) {
      if (std::find(names->begin(), names->end(), want) == names->end()) {
        Problem(absl::StrCat("append-only trigger ", want, " is missing"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Entry(const LogEntry& e) {
    uint64_t expect = tree_.size();
    if (e.seq != expect) {
      Problem(absl::StrCat("entry ", expect, " is missing (next stored entry is ", e.seq, ")"));
    }
    Hash leaf = LeafHash(evidence::AsBytes(e.envelope));
    tree_.Append(leaf);
    std::string where = absl::StrCat("entry ", e.seq);
    if (leaf != e.leaf_hash) Problem(absl::StrCat(where, ": stored leaf hash does not match"));
    auto env = evidence::ParseEnvelope(e.envelope);
    if (!env.ok()) {
      Problem(absl::StrCat(where, ": ", env.status().message()));
      return absl::OkStatus();
    }
    if (auto keyid = evidence::VerifyEnvelope(*env, trust_); !keyid.ok()) {
      Problem(absl::StrCat(where, ": ", keyid.status().message()));
    } else {
      ++out_.signatures_verified;
    }
    auto idx = evidence::IndexPayload(env->payload);
    if (!idx.ok()) {
      Problem(absl::StrCat(where, ": ", idx.status().message()));
      return absl::OkStatus();
    }
    if (idx->root != e.root || idx->policy != e.policy || idx->verdict != e.verdict ||
        idx->time != e.time || idx->predicate_type != e.predicate_type ||
        env->signatures.empty() || env->signatures[0].keyid != e.keyid) {
      Problem(absl::StrCat(where, ": index columns differ from the signed payload"));
    }
    for (const evidence::Subject& s : idx->subjects) {
      expected_subjects_[e.seq].push_back(absl::StrCat(s.name, "\n", s.sha256));
    }
    return absl::OkStatus();
  }

  absl::Status CheckSubjects() {
    std::map<uint64_t, std::vector<std::string>> stored;
    auto s = log_.ForEachSubject(
        [&](uint64_t seq, const std::string& name, const std::string& sha) {
          stored[seq].push_back(absl::StrCat(name, "\n", sha));
          return absl::OkStatus();
        },
        from_);
    if (!s.ok()) return s;
    if (stored != expected_subjects_) {
      Problem("subject index rows differ from the signed payloads' subjects");
    }
    return absl::OkStatus();
  }

  absl::Status CheckNodes() {
    // Complete subtrees at level L that cover a leaf >= from_: indexes [from_ >> L, n >> L).
    uint64_t stored = 0, expected = 0;
    for (int level = 0; (tree_.size() >> level) > 0; ++level) {
      expected += (tree_.size() >> level) - (from_ >> level);
    }
    auto s = log_.ForEachNode(
        [&](int level, uint64_t idx, const Hash& h) {
          ++stored;
          auto want = tree_.Node(level, idx);
          if (!want.ok() || *want != h) {
            Problem(absl::StrCat("tree node level ", level, " index ", idx,
                                 " differs from the recomputed tree"));
          }
          return absl::OkStatus();
        },
        from_);
    if (!s.ok()) return s;
    if (stored != expected) {
      Problem(absl::StrCat("log stores ", stored, " tree nodes; ", expected, " expected"));
    }
    return absl::OkStatus();
  }

  absl::Status Checkpoint(uint64_t size, const std::string& note) {
    ++out_.checkpoints;
    std::string where = absl::StrCat("checkpoint ", size);
    auto head = VerifyCheckpoint(note, log_.origin(), trust_);
    if (!head.ok()) {
      Problem(absl::StrCat(where, ": ", head.status().message()));
      return absl::OkStatus();
    }
    if (head->size != size) {
      Problem(absl::StrCat(where, ": signed size is ", head->size));
      return absl::OkStatus();
    }
    if (size > tree_.size()) {
      Problem(absl::StrCat(where, ": covers more entries than the log holds (", tree_.size(),
                           "); entries were removed"));
      return absl::OkStatus();
    }
    auto root = RootAt(tree_, size);
    if (!root.ok() || *root != head->root) {
      Problem(absl::StrCat(where, ": signed root differs from the recomputed root"));
      return absl::OkStatus();
    }
    if (have_last_) {
      auto proof = ConsistencyProof(tree_, last_size_, size);
      if (!proof.ok() ||
          !VerifyConsistency(last_size_, size, *proof, last_root_, head->root).ok()) {
        Problem(absl::StrCat(where, ": not consistent with checkpoint ", last_size_));
      }
    }
    have_last_ = true;
    last_size_ = size;
    last_root_ = head->root;
    last_note_ = note;
    return absl::OkStatus();
  }

  const EvidenceLog& log_;
  const evidence::TrustStore& trust_;
  MemoryTree tree_;
  const uint64_t from_;
  std::map<uint64_t, std::vector<std::string>> expected_subjects_;
  bool have_last_ = false;
  uint64_t last_size_ = 0;
  Hash last_root_ = EmptyRoot();
  std::string last_note_;
  LogVerification out_;
};

}  // namespace

absl::StatusOr<LogVerification> VerifyLog(const EvidenceLog& log,
                                          const evidence::TrustStore& trust) {
  return VerifyLogFrom(log, trust, {}, nullptr);
}

absl::StatusOr<LogVerification> VerifyLogFrom(const EvidenceLog& log,
                                              const evidence::TrustStore& trust,
                                              VerifiedLogState from, VerifiedLogState* state) {
  if (from.size != from.tree.size()) {
    return absl::InvalidArgumentError("verified state: tree size differs from its size");
  }
  Verifier verifier(log, trust, std::move(from));
  absl::StatusOr<LogVerification> result;
  absl::Status s = log.InReadTransaction([&] {
    result = verifier.Run();
    return result.status();
  });
  if (!s.ok()) return s;
  if (state && result->ok()) *state = verifier.State();
  return result;
}

LogVerification VerifyLogFile(const std::string& path, const evidence::TrustStore& trust,
                              VerifiedLogState* state) {
  absl::StatusOr<LogVerification> result;
  auto log = EvidenceLog::OpenReadOnly(path);
  if (log.ok()) result = VerifyLogFrom(**log, trust, {}, state);
  if (log.ok() && result.ok()) return *result;
  LogVerification failed;
  failed.problems.push_back(absl::StrCat(
      "cannot read the log: ", (log.ok() ? result.status() : log.status()).ToString()));
  return failed;
}

}  // namespace ckpt::storage
