#include "core/interop/chain_verify.h"

#include <filesystem>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "core/checkpoint.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "core/io/small_file.h"
#include "core/interop/transcode_provenance.h"
#include "core/interop/tree_subjects.h"
#include "storage/merkle.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::interop {
namespace {

using SubjectMapT = std::map<std::string, std::string>;

constexpr size_t kMaxListed = 10;
constexpr uint64_t kMaxProvenanceFileBytes = 64u << 20;

std::string Listed(std::vector<std::string> lines) {
  size_t total = lines.size();
  if (lines.size() > kMaxListed) lines.resize(kMaxListed);
  std::string out = absl::StrJoin(lines, "; ");
  if (total > kMaxListed) absl::StrAppend(&out, "; ... (", total, " in all)");
  return out;
}

std::string RootOf(const SubjectMapT& m) {
  auto it = m.find(evidence::kManifestRootSubject);
  return it == m.end() ? "" : it->second;
}

struct SignedProvenance {
  std::string envelope;
  std::string keyid;
  evidence::TranscodeProvenance provenance;
};

// The provenance lines of an .intoto.jsonl file whose signatures a trusted key verifies.
absl::StatusOr<SignedProvenance> ReadProvenanceFile(const std::string& path,
                                                    const evidence::TrustStore& trust) {
  io::SmallFileRules rules;
  rules.what = "provenance file";
  rules.max_bytes = kMaxProvenanceFileBytes;
  absl::StatusOr<std::string> read = io::ReadSmallFile(path, rules);
  if (!read.ok()) return read.status();
  const std::string& text = *read;
  std::string last_problem = "no SLSA provenance envelope in it";
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipWhitespace())) {
    auto env = evidence::ParseEnvelope(std::string(line));
    if (!env.ok()) {
      last_problem = std::string(env.status().message());
      continue;
    }
    auto p = evidence::ParseProvenance(env->payload);
    if (!p.ok()) {
      last_problem = std::string(p.status().message());
      continue;
    }
    auto keyid = evidence::VerifyEnvelope(*env, trust);
    if (!keyid.ok()) {
      last_problem = std::string(keyid.status().message());
      continue;
    }
    return SignedProvenance{std::string(line), *keyid, *std::move(p)};
  }
  return absl::FailedPreconditionError(absl::StrCat(path, ": ", last_problem));
}

// Entry `seq` is included under the log's newest checkpoint, which a trusted key signed.
absl::Status CheckIncluded(const storage::EvidenceLog& log, uint64_t seq,
                           const std::string& envelope, const evidence::TrustStore& trust,
                           uint64_t* tree_size) {
  auto latest = log.LatestCheckpoint();
  if (!latest.ok()) return latest.status();
  auto head = storage::VerifyCheckpoint(latest->second, log.origin(), trust);
  if (!head.ok()) return head.status();
  auto proof = log.InclusionProof(seq, head->size);
  if (!proof.ok()) return proof.status();
  *tree_size = head->size;
  return storage::VerifyInclusion(storage::LeafHash(evidence::AsBytes(envelope)), seq,
                                  head->size, *proof, head->root);
}

// Every entry naming `digest` as a subject, newest first, of one predicate type.
absl::Status ForEachEntryNaming(const storage::EvidenceLog& log, const std::string& digest,
                                const std::string& predicate_type,
                                const std::function<bool(const storage::LogEntry&)>& fn) {
  storage::QueryFilter filter;
  filter.digest = digest;
  filter.limit = 500;
  for (;;) {
    auto page = log.Query(filter);
    if (!page.ok()) return page.status();
    for (const storage::LogEntry& e : page->entries) {
      if (e.predicate_type == predicate_type && !fn(e)) return absl::OkStatus();
    }
    if (page->next_page_token.empty()) return absl::OkStatus();
    filter.page_token = page->next_page_token;
  }
}

// Why record `e` is not the pair audit the chain needs; empty when it is.
std::string PairAuditProblem(const storage::LogEntry& e, const SubjectMapT& derived_disk,
                             const evidence::TranscodeProvenance& prov,
                             const evidence::TrustStore& trust, std::string* keyid) {
  auto env = evidence::ParseEnvelope(e.envelope);
  if (!env.ok()) return std::string(env.status().message());
  auto signer = evidence::VerifyEnvelope(*env, trust);
  if (!signer.ok()) return std::string(signer.status().message());
  *keyid = *signer;
  auto idx = evidence::IndexPayload(env->payload);
  if (!idx.ok()) return std::string(idx.status().message());
  if (idx->verdict != "pass") return absl::StrCat("verdict ", idx->verdict);
  std::vector<std::string> diffs = SubjectDifferences(SubjectMap(idx->subjects), derived_disk);
  if (!diffs.empty()) return absl::StrCat("subjects differ from the derived tree: ", Listed(diffs));
  if (idx->source_subjects.empty()) {
    return "binds no source (predicate.source): not a pair audit";
  }
  const SubjectMapT bound = SubjectMap(idx->source_subjects);
  const SubjectMapT wanted = SubjectMap(prov.source);
  if (RootOf(bound) != RootOf(wanted)) {
    return absl::StrCat("audited against source OMS ROOT ", RootOf(bound), ", not the provenance's ",
                        RootOf(wanted));
  }
  std::vector<std::string> d = SubjectDifferences(bound, wanted);
  if (!d.empty()) return absl::StrCat("bound source files differ: ", Listed(d));
  return "";
}

}  // namespace

bool ChainReport::ok() const {
  if (steps.empty()) return false;
  for (const ChainStep& s : steps) {
    if (!s.ok) return false;
  }
  return true;
}

absl::StatusOr<ChainReport> VerifyChain(const ChainOptions& options,
                                        const storage::EvidenceLog& log,
                                        const evidence::TrustStore& trust, Progress& progress) {
  auto derived_root = RealPath(options.derived);
  if (!derived_root.ok()) return derived_root.status();
  auto derived = TreeSubjects(*derived_root, options.threads, progress);
  if (!derived.ok()) return derived.status();
  const SubjectMapT derived_disk = SubjectMap(*derived);
  ChainReport report;

  // 1. The provenance statement.
  std::optional<SignedProvenance> prov;
  std::string file = options.provenance.empty() ? DefaultProvenancePath(options.derived)
                                                : options.provenance;
  std::error_code ec;
  if (!options.provenance.empty() || std::filesystem::exists(file, ec)) {
    auto read = ReadProvenanceFile(file, trust);
    if (!read.ok()) {
      if (read.status().code() != absl::StatusCode::kFailedPrecondition) return read.status();
      report.steps.push_back({false, absl::StrCat("provenance: ", read.status().message())});
      return report;
    }
    prov = *std::move(read);
    report.steps.push_back({true, absl::StrCat("provenance: ", file, ", signed by trusted key ",
                                               prov->keyid)});
    if (auto seq = log.FindByLeafHash(storage::LeafHash(evidence::AsBytes(prov->envelope)));
        seq.ok()) {
      report.provenance_id = *seq;
    }
  } else {
    auto s = ForEachEntryNaming(
        log, RootOf(derived_disk), evidence::kSlsaProvenanceType, [&](const storage::LogEntry& e) {
          auto env = evidence::ParseEnvelope(e.envelope);
          if (!env.ok()) return true;
          auto p = evidence::ParseProvenance(env->payload);
          auto keyid = evidence::VerifyEnvelope(*env, trust);
          if (!p.ok() || !keyid.ok()) return true;
          prov = SignedProvenance{e.envelope, *keyid, *std::move(p)};
          report.provenance_id = e.seq;
          return false;
        });
    if (!s.ok()) return s;
    if (!prov) {
      report.steps.push_back(
          {false, absl::StrCat("provenance: no ", file, " and no signed provenance in ",
                               log.path(), " names the derived OMS ROOT ",
                               RootOf(derived_disk))});
      return report;
    }
    report.steps.push_back({true, absl::StrCat("provenance: log entry ", *report.provenance_id,
                                               ", signed by trusted key ", prov->keyid)});
  }
  report.provenance = prov->provenance;
  const evidence::TranscodeProvenance& p = prov->provenance;
  if (report.provenance_id) {
    uint64_t size = 0;
    absl::Status s = CheckIncluded(log, *report.provenance_id, prov->envelope, trust, &size);
    report.steps.push_back(
        {s.ok(), s.ok() ? absl::StrCat("provenance: entry ", *report.provenance_id,
                                       " is included in the signed tree head of size ", size)
                        : absl::StrCat("provenance: inclusion: ", s.message())});
  }

  // 2. Derived bytes on disk = the provenance's subjects.
  std::vector<std::string> d = SubjectDifferences(SubjectMap(p.derived), derived_disk);
  report.steps.push_back(
      {d.empty(), d.empty() ? absl::StrCat("derived: all ", derived_disk.size(),
                                           " subjects match ", *derived_root, " (OMS ROOT ",
                                           RootOf(derived_disk), ")")
                            : absl::StrCat("derived: ", *derived_root,
                                           " is not what the provenance names: ", Listed(d))});

  // 3. Source bytes on disk = the provenance's dependencies.
  SubjectMapT recorded_source = SubjectMap(p.source);
  if (options.source.empty()) {
    report.steps.push_back(
        {true, absl::StrCat("source: not given; the provenance names source OMS ROOT ",
                            RootOf(recorded_source),
                            p.source_ref.empty() ? "" : absl::StrCat(" (", p.source_ref, ")"),
                            ", ", recorded_source.size() - 1, " files")});
  } else {
    auto source_root = RealPath(options.source);
    if (!source_root.ok()) return source_root.status();
    auto source = TreeSubjects(*source_root, options.threads, progress);
    if (!source.ok()) return source.status();
    std::vector<std::string> sd = SubjectDifferences(recorded_source, SubjectMap(*source));
    report.steps.push_back(
        {sd.empty(), sd.empty() ? absl::StrCat("source: all ", recorded_source.size(),
                                               " recorded digests match ", *source_root,
                                               " (OMS ROOT ", RootOf(recorded_source), ")")
                                : absl::StrCat("source: ", *source_root,
                                               " is not what the provenance names: ",
                                               Listed(sd))});
  }

  // 4. A passing pair audit of exactly this derived content against exactly that source.
  std::vector<std::string> rejected;
  std::string found;
  auto s = ForEachEntryNaming(
      log, RootOf(derived_disk), evidence::kEvidencePredicateType,
      [&](const storage::LogEntry& e) {
        std::string keyid;
        std::string problem = PairAuditProblem(e, derived_disk, p, trust, &keyid);
        uint64_t size = 0;
        if (problem.empty()) {
          absl::Status inc = CheckIncluded(log, e.seq, e.envelope, trust, &size);
          if (!inc.ok()) problem = absl::StrCat("inclusion: ", inc.message());
        }
        if (!problem.empty()) {
          rejected.push_back(absl::StrCat("record ", e.seq, ": ", problem));
          return true;
        }
        report.pair_audit_id = e.seq;
        found = absl::StrCat("pair audit: record ", e.seq, " (", e.time, ", policy ", e.policy,
                             ", signed by ", keyid, ") passed for exactly this derived content "
                             "against source OMS ROOT ", RootOf(recorded_source),
                             "; included in the signed tree head of size ", size);
        return false;
      });
  if (!s.ok()) return s;
  if (report.pair_audit_id) {
    report.steps.push_back({true, found});
  } else {
    report.steps.push_back(
        {false, absl::StrCat("pair audit: no passing, trusted, logged pair audit of this derived "
                             "content against this source in ", log.path(),
                             rejected.empty() ? "" : absl::StrCat(" (", Listed(rejected), ")"))});
  }
  return report;
}

}  // namespace ckpt::interop
