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
  Verifier(const EvidenceLog& log, const evidence::TrustStore& trust) : log_(log), trust_(trust) {}

  absl::StatusOr<LogVerification> Run() {
    auto integrity = log_.IntegrityCheck();
    if (!integrity.ok()) return integrity.status();
    if (*integrity != "ok") Problem(absl::StrCat("sqlite integrity_check: ", *integrity));
    if (auto s = CheckTriggers(); !s.ok()) return s;
    if (auto s = log_.ForEachEntry([&](const LogEntry& e) { return Entry(e); }); !s.ok()) {
      return s;
    }
    out_.entries = tree_.size();
    out_.root_hex = ToHex(tree_.Root());
    if (auto s = CheckSubjects(); !s.ok()) return s;
    if (auto s = CheckNodes(); !s.ok()) return s;
    if (auto s = log_.ForEachCheckpoint(
            [&](uint64_t size, const std::string& note) { return Checkpoint(size, note); });
        !s.ok()) {
      return s;
    }
    if (out_.checkpoints == 0 && tree_.size() > 0) {
      Problem("no signed checkpoint covers the entries");
    } else if (last_size_ != tree_.size()) {
      Problem(absl::StrCat("newest checkpoint is for size ", last_size_, " but the log holds ",
                           tree_.size(), " entries"));
    }
    return out_;
  }

 private:
  void Problem(std::string p) {
    if (out_.problems.size() < kMaxProblems) out_.problems.push_back(std::move(p));
  }

  absl::Status CheckTriggers() {
    auto names = log_.TriggerNames();
    if (!names.ok()) return names.status();
    for (const char* t : {"meta", "entries", "subjects", "tree_nodes", "checkpoints"}) {
      for (const char* op : {"UPDATE", "DELETE"}) {
        std::string want = absl::StrCat(t, "_no_", op);
        if (std::find(names->begin(), names->end(), want) == names->end()) {
          Problem(absl::StrCat("append-only trigger ", want, " is missing"));
        }
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
    auto s = log_.ForEachSubject([&](uint64_t seq, const std::string& name,
                                     const std::string& sha) {
      stored[seq].push_back(absl::StrCat(name, "\n", sha));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    if (stored != expected_subjects_) {
      Problem("subject index rows differ from the signed payloads' subjects");
    }
    return absl::OkStatus();
  }

  absl::Status CheckNodes() {
    uint64_t stored = 0, expected = 0;
    for (uint64_t n = tree_.size(); n > 0; n >>= 1) expected += n;
    auto s = log_.ForEachNode([&](int level, uint64_t idx, const Hash& h) {
      ++stored;
      auto want = tree_.Node(level, idx);
      if (!want.ok() || *want != h) {
        Problem(absl::StrCat("tree node level ", level, " index ", idx,
                             " differs from the recomputed tree"));
      }
      return absl::OkStatus();
    });
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
    return absl::OkStatus();
  }

  const EvidenceLog& log_;
  const evidence::TrustStore& trust_;
  MemoryTree tree_;
  std::map<uint64_t, std::vector<std::string>> expected_subjects_;
  bool have_last_ = false;
  uint64_t last_size_ = 0;
  Hash last_root_{};
  LogVerification out_;
};

}  // namespace

absl::StatusOr<LogVerification> VerifyLog(const EvidenceLog& log,
                                          const evidence::TrustStore& trust) {
  return Verifier(log, trust).Run();
}

LogVerification VerifyLogFile(const std::string& path, const evidence::TrustStore& trust) {
  absl::StatusOr<LogVerification> result;
  auto log = EvidenceLog::Open(path, /*create=*/false);
  if (log.ok()) result = VerifyLog(**log, trust);
  if (log.ok() && result.ok()) return *result;
  LogVerification failed;
  failed.problems.push_back(absl::StrCat(
      "cannot read the log: ", (log.ok() ? result.status() : log.status()).ToString()));
  return failed;
}

}  // namespace ckpt::storage
