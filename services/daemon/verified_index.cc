#include "services/daemon/verified_index.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/text/json_parse.h"
#include "nlohmann/json.hpp"
#include "storage/tlog_checkpoint.h"

namespace ckpt::daemon {
namespace {

// predicate.source.manifest_root of a signed statement: the source OMS ROOT an audit record is
// bound to, or a decision rests on; empty when it names none.
std::string SourceRootOf(const nlohmann::json& predicate) {
  if (predicate.contains("source") && predicate["source"].is_object() &&
      predicate["source"].contains("manifest_root") &&
      predicate["source"]["manifest_root"].is_string()) {
    return predicate["source"]["manifest_root"].get<std::string>();
  }
  return "";
}

}  // namespace

ContentKey ContentKeyOf(const std::vector<evidence::Subject>& subjects) {
  std::vector<std::pair<std::string, std::string>> sorted;
  sorted.reserve(subjects.size());
  for (const evidence::Subject& s : subjects) sorted.emplace_back(s.name, s.sha256);
  std::sort(sorted.begin(), sorted.end());
  Sha256 h;
  for (const auto& [name, sha] : sorted) {
    std::string line = absl::StrCat(name.size(), ":", name, " ", sha, "\n");
    h.Update({reinterpret_cast<const uint8_t*>(line.data()), line.size()});
  }
  return h.Finish();
}

std::string VerifiedLogIndex::DecisionKey(const ContentKey& key, const std::string& policy_uri,
                                          const std::string& resource_uri) {
  return absl::StrCat(ToHex(key), "\n", policy_uri, "\n", resource_uri);
}

void VerifiedLogIndex::Index(uint64_t seq, const std::string& envelope, Facts& facts) const {
  auto env = evidence::ParseEnvelope(envelope);
  if (!env.ok() || !evidence::VerifyEnvelope(*env, trust_).ok()) return;  // not evidence to us
  auto parsed = ParseBoundedJson(env->payload, "statement");
  if (!parsed.ok() || !parsed->is_object()) return;
  const nlohmann::json& j = *parsed;
  try {
    std::vector<evidence::Subject> subjects;
    for (const auto& s : j.at("subject")) {
      subjects.push_back({s.at("name").get<std::string>(),
                          s.at("digest").at("sha256").get<std::string>()});
    }
    const ContentKey key = ContentKeyOf(subjects);
    const std::string type = j.at("predicateType").get<std::string>();
    const auto& p = j.at("predicate");
    if (type == evidence::kEvidencePredicateType) {
      AuditFacts a;
      a.seq = seq;
      a.envelope_sha256 = ToHex(Sha256Of(evidence::AsBytes(envelope)));
      a.policy = p.at("policy").at("name").get<std::string>();
      a.verdict = p.at("verdict").get<std::string>();
      for (const auto& c : p.at("checks")) {
        a.checks[c.at("name").get<std::string>()] = c.at("verdict").get<std::string>();
        if (c.at("name") == "scale_window" && c.contains("details") &&
            c["details"].is_object() && c["details"].contains("verdict") &&
            c["details"]["verdict"].is_string()) {
          a.scale_window_result = c["details"]["verdict"].get<std::string>();
        }
      }
      a.source_manifest_root = SourceRootOf(p);
      a.time = p.at("finished_at").get<std::string>();
      for (const auto& c : p.at("checks")) {
        const std::string name = c.at("name").get<std::string>();
        if ((name == "hf_layout" || name == "source_hf_layout") && c.contains("details") &&
            c["details"].is_object() && c["details"].contains("layout") &&
            c["details"]["layout"].is_string()) {
          (name == "hf_layout" ? a.layout : a.source_layout) =
              c["details"]["layout"].get<std::string>();
        }
      }
      if (p.contains("refs") && p["refs"].is_object()) {
        const auto& refs = p["refs"];
        if (refs.contains("model_ref") && refs["model_ref"].is_string()) {
          a.model_ref = refs["model_ref"].get<std::string>();
        }
        if (refs.contains("source_ref") && refs["source_ref"].is_string()) {
          a.source_ref = refs["source_ref"].get<std::string>();
        }
      }
      facts.audit_keys[seq] = key;
      facts.audits[key].push_back(std::move(a));
    } else if (type == evidence::kVerificationSummaryType &&
               p.at("verifier").at("id").get<std::string>() == verifier_id_) {
      DecisionFacts d;
      d.seq = seq;
      d.pass = p.at("verificationResult").get<std::string>() == "PASSED";
      d.time = p.at("timeVerified").get<std::string>();
      d.source_manifest_root = SourceRootOf(p);
      const auto& inputs = p.at("inputAttestations");
      if (!inputs.empty()) {
        std::string uri = inputs.at(0).at("uri").get<std::string>();
        std::string prefix = origin_ + "#";
        int64_t input = -1;
        if (uri.rfind(prefix, 0) == 0 && absl::SimpleAtoi(uri.substr(prefix.size()), &input)) {
          d.input_seq = input;
        } else {
          return;  // rests on something outside this log: never reused
        }
      }
      facts.decisions[DecisionKey(key, p.at("policy").at("uri").get<std::string>(),
                                  p.at("resourceUri").get<std::string>())] = d;
    }
  } catch (const nlohmann::json::exception&) {
    // A signed statement of another shape tells a gate nothing.
  }
}

void VerifiedLogIndex::AddEntry(uint64_t seq, const std::string& envelope, Facts& facts) const {
  facts.tree.Append(storage::LeafHash(evidence::AsBytes(envelope)));
  Index(seq, envelope, facts);
}

void VerifiedLogIndex::CheckCheckpoint(const std::string& note, Facts& facts) const {
  auto head = storage::VerifyCheckpoint(note, origin_, trust_);
  absl::Status broken;
  if (!head.ok()) {
    broken = head.status();
  } else if (head->size != facts.tree.size()) {
    broken = absl::DataLossError(absl::StrCat("the newest signed checkpoint covers ", head->size,
                                              " entries but the log holds ", facts.tree.size()));
  } else if (head->size > 0 && *storage::RootAt(facts.tree, head->size) != head->root) {
    broken = absl::DataLossError(
        "the log's entries do not hash to the root of its newest signed checkpoint");
  }
  if (!broken.ok()) {
    if (facts.broken.ok()) {
      facts.broken = absl::FailedPreconditionError(absl::StrCat(
          "gates are refused: ", broken.message(), "; run `ckpt-audit verify-log`"));
    }
    return;
  }
  facts.checkpoint_size = head->size;
  facts.checkpoint = note;
}

void VerifiedLogIndex::Load(const storage::EvidenceLog& log) {
  Facts facts;
  absl::Status s = log.InReadTransaction([&]() -> absl::Status {
    auto walk = log.ForEachEntry([&](const storage::LogEntry& e) -> absl::Status {
      if (e.seq != facts.tree.size()) {
        return absl::DataLossError(absl::StrCat("entry ", facts.tree.size(), " is missing"));
      }
      AddEntry(e.seq, e.envelope, facts);
      return absl::OkStatus();
    });
    if (!walk.ok()) return walk;
    auto latest = log.LatestCheckpoint();
    if (absl::IsNotFound(latest.status()) && facts.tree.size() == 0) return absl::OkStatus();
    if (!latest.ok()) return latest.status();
    CheckCheckpoint(latest->second, facts);
    return absl::OkStatus();
  });
  if (!s.ok() && facts.broken.ok()) {
    facts.broken = absl::FailedPreconditionError(
        absl::StrCat("gates are refused: the log cannot be read: ", s.message()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    facts_ = std::move(facts);
    std::sort(pending_.begin(), pending_.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [seq, entry] : pending_) AppendedLocked(seq, entry.first, entry.second);
    pending_.clear();
    ready_ = true;
  }
  loaded_.notify_all();
}

void VerifiedLogIndex::Appended(uint64_t seq, const std::string& envelope,
                                const std::string& checkpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ready_) {
    pending_.push_back({seq, {envelope, checkpoint}});
    return;
  }
  AppendedLocked(seq, envelope, checkpoint);
}

void VerifiedLogIndex::AppendedLocked(uint64_t seq, const std::string& envelope,
                                      const std::string& checkpoint) {
  if (seq < facts_.tree.size()) {  // already read by Load's snapshot
    if (*facts_.tree.Node(0, seq) != storage::LeafHash(evidence::AsBytes(envelope)) &&
        facts_.broken.ok()) {
      facts_.broken = absl::FailedPreconditionError(
          absl::StrCat("gates are refused: entry ", seq, " differs from what was appended"));
    }
    return;
  }
  if (seq != facts_.tree.size()) {
    if (facts_.broken.ok()) {
      facts_.broken = absl::FailedPreconditionError(
          absl::StrCat("gates are refused: entry ", seq, " was appended after a gap"));
    }
    return;
  }
  AddEntry(seq, envelope, facts_);
  if (!checkpoint.empty()) CheckCheckpoint(checkpoint, facts_);
}

absl::Status VerifiedLogIndex::WaitReady(const Progress& progress) const {
  std::unique_lock<std::mutex> lock(mu_);
  while (!ready_) {
    if (progress.Cancelled()) {
      return absl::CancelledError("gate cancelled while the log was being verified");
    }
    loaded_.wait_for(lock, std::chrono::milliseconds(100));
  }
  return facts_.broken;
}

absl::Status VerifiedLogIndex::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!ready_) return absl::UnavailableError("the daemon is still verifying the evidence log");
  return facts_.broken;
}

std::vector<AuditFacts> VerifiedLogIndex::Audits(const ContentKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = facts_.audits.find(key);
  return it == facts_.audits.end() ? std::vector<AuditFacts>() : it->second;
}

std::optional<AuditFacts> VerifiedLogIndex::AuditAt(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto key = facts_.audit_keys.find(seq);
  if (key == facts_.audit_keys.end()) return std::nullopt;
  for (const AuditFacts& a : facts_.audits.at(key->second)) {
    if (a.seq == seq) return a;
  }
  return std::nullopt;
}

std::optional<DecisionFacts> VerifiedLogIndex::LatestDecision(
    const ContentKey& key, const std::string& policy_uri, const std::string& resource_uri) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = facts_.decisions.find(DecisionKey(key, policy_uri, resource_uri));
  if (it == facts_.decisions.end()) return std::nullopt;
  return it->second;
}

absl::Status VerifiedLogIndex::CheckEntry(uint64_t seq, const std::string& envelope) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq >= facts_.tree.size() ||
      *facts_.tree.Node(0, seq) != storage::LeafHash(evidence::AsBytes(envelope))) {
    return absl::DataLossError(
        absl::StrCat("entry ", seq, " read back from the log differs from the verified entry"));
  }
  return absl::OkStatus();
}

absl::StatusOr<EntryProof> VerifiedLogIndex::Prove(uint64_t seq) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (seq >= facts_.checkpoint_size) {
    return absl::NotFoundError(absl::StrCat("no entry ", seq, " under the newest checkpoint"));
  }
  EntryProof p;
  p.leaf_index = seq;
  p.tree_size = facts_.checkpoint_size;
  auto hashes = storage::InclusionProof(facts_.tree, seq, p.tree_size);
  if (!hashes.ok()) return hashes.status();
  p.hashes = *std::move(hashes);
  auto root = storage::RootAt(facts_.tree, p.tree_size);
  if (!root.ok()) return root.status();
  p.root = *root;
  p.checkpoint = facts_.checkpoint;
  return p;
}

}  // namespace ckpt::daemon
