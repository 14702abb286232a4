// `ckpt-audit verify RECORD|--db PATH [--id N]` checks one record: its DSSE signature against the
// trust file, its subjects against a checkpoint on disk (--root), and its inclusion in the log
// under the newest signed checkpoint. `ckpt-audit verify-log --db PATH` checks a whole log
// (storage/log_verifier.h). Both check the log's newest signed head against the one remembered
// for it and remember it (log_heads.h); verify-log also against a head the caller pins
// (--expect-size, --expect-tree-root). Both exit 0 only when everything verifies, 1 when
// something does not, 2 when the inputs cannot be read.
#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/evidence/dsse.h"
#include "core/evidence/hex_digest.h"
#include "core/evidence/record.h"
#include "core/evidence/strict_json.h"
#include "core/fingerprint/fingerprint.h"
#include "core/interop/tree_subjects.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/settings.h"
#include "services/cli/log_heads.h"
#include "services/cli/read_file.h"
#include "storage/evidence_log.h"
#include "storage/head_state.h"
#include "storage/log_verifier.h"

namespace ckpt::cli {
namespace {

struct VerifyArgs {
  std::string record;
  std::string db;
  int64_t id = -1;
  std::string root;
  std::string source;
  std::string trust;
  bool json = false;
  bool require_pass = false;  // verify: a record whose verdict is fail exits 1
  int64_t expect_size = -1;  // verify-log: a head the log must extend
  std::string expect_root;
};

// One line per verified property; `ok` false marks a failure.
struct Outcome {
  std::vector<std::pair<bool, std::string>> lines;
  void Add(bool ok, std::string what) { lines.emplace_back(ok, std::move(what)); }
  bool ok() const {
    for (const auto& [good, _] : lines) {
      if (!good) return false;
    }
    return !lines.empty();
  }
};

// `what` ("subject", or "source" for a pair audit's bound source) against the tree at `root`.
void CheckSubjects(const std::vector<evidence::Subject>& subjects, const std::string& what,
                   const std::string& raw_root, Outcome* out) {
  if (subjects.empty()) {
    out->Add(false, absl::StrCat(what, ": the record binds none"));
    return;
  }
  TerminalProgress progress;
  auto fp = FingerprintTree(raw_root, {}, progress);
  const std::string root = EncodeName(raw_root);
  if (!fp.ok()) {
    out->Add(false, absl::StrCat(what, ": cannot fingerprint ", root, ": ",
                                 fp.status().message()));
    return;
  }
  auto disk = audit::SubjectsOf(*fp);
  if (!disk.ok()) {
    out->Add(false, absl::StrCat(what, ": ", disk.status().message()));
    return;
  }
  const std::map<std::string, std::string> stated = interop::SubjectMap(subjects);
  const std::vector<std::string> differences =
      interop::SubjectDifferences(stated, interop::SubjectMap(*disk));
  for (const std::string& d : differences) out->Add(false, absl::StrCat(what, " ", d));
  if (differences.empty()) {
    out->Add(true, absl::StrCat(what, ": all ", stated.size(), " digests match ", root));
  }
}

// Inclusion of `envelope` at `seq` under the log's newest signed head, which must extend the
// head remembered for the log (and is remembered in turn).
void CheckInclusion(const storage::EvidenceLog& log, uint64_t seq, const std::string& envelope,
                    const evidence::TrustStore& trust, Outcome* out) {
  storage::SignedHead newest;
  absl::Status included, remembered;
  absl::Status read = log.InReadTransaction([&]() -> absl::Status {
    auto head = storage::NewestSignedHead(log, trust);
    if (!head.ok()) return head.status();
    newest = *std::move(head);
    auto proof = log.InclusionProof(seq, newest.head.size);
    included = proof.ok() ? storage::VerifyInclusion(
                                storage::LeafHash(evidence::AsBytes(envelope)), seq,
                                newest.head.size, *proof, newest.head.root)
                          : proof.status();
    remembered = RememberVerifiedHead(log, newest);
    return absl::OkStatus();
  });
  if (!read.ok()) {
    out->Add(false, absl::StrCat("log checkpoint: ", read.message()));
    return;
  }
  out->Add(included.ok(),
           included.ok() ? absl::StrCat("log: record ", seq, " is included in the signed tree "
                                        "head of size ", newest.head.size, " (", log.origin(), ")")
                         : absl::StrCat("log: inclusion of record ", seq, ": ",
                                        included.message()));
  out->Add(remembered.ok(),
           remembered.ok() ? "log: the signed tree head extends every head verified before"
                           : absl::StrCat("log: ", remembered.message()));
}

int Verify(const VerifyArgs& a) {
  auto trust = LoadTrust(a.trust);
  if (!trust.ok()) return ReportError(trust.status());
  std::unique_ptr<storage::EvidenceLog> log;
  if (!a.db.empty()) {
    auto opened = OpenLogReader(a.db);
    if (!opened.ok()) return ReportError(opened.status());
    log = std::move(*opened);
  }
  std::string envelope;
  int64_t seq = a.id;
  if (!a.record.empty()) {
    auto read = ReadSmallFile(a.record);
    if (!read.ok()) return ReportError(read.status());
    envelope = *std::move(read);
    while (!envelope.empty() && (envelope.back() == '\n' || envelope.back() == '\r')) {
      envelope.pop_back();
    }
  } else {
    if (seq < 0) {
      auto size = log->Size();
      if (!size.ok()) return ReportError(size.status());
      if (*size == 0) return ReportError(absl::NotFoundError(absl::StrCat(a.db, ": log is empty")));
      seq = static_cast<int64_t>(*size) - 1;
    }
    auto entry = log->Get(static_cast<uint64_t>(seq));
    if (!entry.ok()) return ReportError(entry.status());
    envelope = entry->envelope;
  }
  auto env = evidence::ParseEnvelope(envelope);
  if (!env.ok()) return ReportError(env.status());
  auto idx = evidence::IndexPayload(env->payload);
  if (!idx.ok()) return ReportError(idx.status());

  Outcome out;
  auto keyid = evidence::VerifyEnvelope(*env, *trust);
  out.Add(keyid.ok(), keyid.ok() ? absl::StrCat("signature: valid, key ", *keyid)
                                 : absl::StrCat("signature: ", keyid.status().message()));
  if (a.require_pass) {
    out.Add(idx->verdict == "pass",
            absl::StrCat("verdict: the record says ", idx->verdict,
                         idx->verdict == "pass" ? "" : " (--require-pass)"));
  }
  if (!a.root.empty()) CheckSubjects(idx->subjects, "subject", a.root, &out);
  if (!a.source.empty()) CheckSubjects(idx->source_subjects, "source", a.source, &out);
  if (log && idx->predicate_type == evidence::kVerificationSummaryType) {
    // A VSA is not itself logged: it names the logged record it summarizes ("origin#seq") and
    // that record's envelope digest. Check both, then prove that record's inclusion.
    const nlohmann::json vsa =
        evidence::ParseStrictJson(env->payload, "summary").value_or(nlohmann::json());
    std::string uri, digest;
    const nlohmann::json* in = nullptr;
    if (vsa.is_object() && vsa.contains("predicate") && vsa["predicate"].is_object() &&
        vsa["predicate"].contains("inputAttestations") &&
        vsa["predicate"]["inputAttestations"].is_array() &&
        !vsa["predicate"]["inputAttestations"].empty()) {
      in = &vsa["predicate"]["inputAttestations"][0];
    }
    if (in != nullptr && in->is_object()) {
      if (in->contains("uri") && (*in)["uri"].is_string()) uri = (*in)["uri"];
      if (in->contains("digest") && (*in)["digest"].is_object() &&
          (*in)["digest"].contains("sha256") && (*in)["digest"]["sha256"].is_string()) {
        digest = (*in)["digest"]["sha256"];
      }
    }
    std::string prefix = log->origin() + "#";
    int64_t input = -1;
    if (uri.rfind(prefix, 0) != 0 || !absl::SimpleAtoi(uri.substr(prefix.size()), &input)) {
      out.Add(false, absl::StrCat("summary: input '", uri, "' is not a record of log ",
                                  log->origin()));
    } else if (auto entry = log->Get(static_cast<uint64_t>(input)); !entry.ok()) {
      out.Add(false, absl::StrCat("summary: ", entry.status().message()));
    } else if (ToHex(Sha256Of(evidence::AsBytes(entry->envelope))) != digest) {
      out.Add(false, absl::StrCat("summary: record ", input, " digest differs from the summary's"));
    } else {
      out.Add(true, absl::StrCat("summary: summarizes record ", input, " (digest matches)"));
      CheckInclusion(*log, static_cast<uint64_t>(input), entry->envelope, *trust, &out);
    }
  } else if (log) {
    if (seq < 0) {
      auto found = log->FindByLeafHash(storage::LeafHash(evidence::AsBytes(envelope)));
      if (!found.ok()) out.Add(false, absl::StrCat("log: ", found.status().message()));
      else seq = static_cast<int64_t>(*found);
    }
    if (seq >= 0) CheckInclusion(*log, static_cast<uint64_t>(seq), envelope, *trust, &out);
  }
  if (a.json) {
    nlohmann::ordered_json j = {{"ok", out.ok()}, {"verdict", idx->verdict}, {"root", idx->root},
                                {"checks", nlohmann::ordered_json::array()}};
    if (seq >= 0) j["record_id"] = seq;
    for (const auto& [good, what] : out.lines) j["checks"].push_back({{"ok", good}, {"what", what}});
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    for (const auto& [good, what] : out.lines) {
      std::printf("[%s] %s\n", good ? "ok" : "FAIL", what.c_str());
    }
    std::printf("%s (recorded verdict: %s, root %s)\n", out.ok() ? "VERIFIED" : "NOT VERIFIED",
                idx->verdict.c_str(), idx->root.c_str());
  }
  return out.ok() ? kExitOk : kExitCheckFailed;
}

// --expect-size and --expect-tree-root: both or neither; the root as verify-log prints it.
absl::StatusOr<std::optional<storage::TreeHead>> PinnedHead(const VerifyArgs& a) {
  if ((a.expect_size >= 0) != !a.expect_root.empty()) {
    return absl::InvalidArgumentError("give --expect-size and --expect-tree-root together");
  }
  if (a.expect_size < 0) return std::optional<storage::TreeHead>();
  const std::string hex = absl::AsciiStrToLower(a.expect_root);
  if (!evidence::IsSha256Hex(hex)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--expect-tree-root '", a.expect_root, "' is not a SHA-256 root (64 hex digits)"));
  }
  storage::TreeHead pinned;
  pinned.size = static_cast<uint64_t>(a.expect_size);
  const std::string bytes = absl::HexStringToBytes(hex);
  std::copy(bytes.begin(), bytes.end(), pinned.root.begin());
  return std::optional<storage::TreeHead>(pinned);
}

int VerifyLogCommand(const VerifyArgs& a) {
  auto pinned = PinnedHead(a);
  if (!pinned.ok()) return ReportError(pinned.status());
  auto trust = LoadTrust(a.trust);
  if (!trust.ok()) return ReportError(trust.status());
  if (FILE* f = std::fopen(a.db.c_str(), "rb"); f == nullptr) {
    return ReportError(absl::NotFoundError(absl::StrCat(a.db, ": no evidence database")));
  } else {
    std::fclose(f);
  }
  storage::VerifiedLogState state;
  storage::LogVerification v = storage::VerifyLogFile(a.db, *trust, &state);
  if (v.ok()) {
    // The head just verified, against the one the caller pins and the one remembered.
    const storage::SignedHead newest{{v.origin, state.size, state.root}, state.note};
    if (*pinned) {
      (*pinned)->origin = newest.head.origin;
      if (auto s = storage::CheckExtends(state.tree, **pinned, newest.head); !s.ok()) {
        v.problems.push_back(absl::StrCat("--expect-size/--expect-tree-root: ", s.message()));
      }
    }
    if (auto s = RememberVerifiedHead(state.tree, newest); !s.ok()) {
      v.problems.push_back(std::string(s.message()));
    }
  }
  if (a.json) {
    nlohmann::ordered_json j = {{"ok", v.ok()},
                                {"origin", v.origin},
                                {"entries", v.entries},
                                {"checkpoints", v.checkpoints},
                                {"signatures_verified", v.signatures_verified},
                                {"root", v.root_hex},
                                {"problems", v.problems}};
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("%s: %llu entries, %llu signatures verified, %llu checkpoints, root %s\n",
                a.db.c_str(), static_cast<unsigned long long>(v.entries),
                static_cast<unsigned long long>(v.signatures_verified),
                static_cast<unsigned long long>(v.checkpoints), v.root_hex.c_str());
    for (const std::string& p : v.problems) std::printf("  FAIL %s\n", p.c_str());
    std::printf("%s\n", v.ok() ? "LOG VERIFIED" : "LOG NOT VERIFIED");
  }
  return v.ok() ? kExitOk : kExitCheckFailed;
}

}  // namespace

void AddVerifyCommands(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<VerifyArgs>();
  auto* cmd = app.add_subcommand(
      "verify", "Check a record's signature, its subjects (--root) and its inclusion in the log");
  cmd->add_option("RECORD", a->record, "a DSSE envelope file (an evidence record or VSA)");
  cmd->add_option("--db", a->db,
                  "evidence database, when no RECORD (default: $CKPT_AUDIT_DB, then the config "
                  "file, then per-user)");
  cmd->add_option("--id", a->id, "record id in --db (default: the newest)");
  AcceptHubRepoIds(
      cmd->add_option("--root", a->root, "checkpoint root whose files must match the subjects"));
  AcceptHubRepoIds(
      cmd->add_option("--source", a->source,
                      "source checkpoint whose files must match a pair audit's bound source"));
  cmd->add_option("--trust", a->trust, "trust file (default: per-user)");
  cmd->add_flag("--require-pass", a->require_pass,
                "also require the record's verdict to be pass (else exit 1)");
  cmd->add_flag("--json", a->json, "machine-readable output");
  // A RECORD file is checked on its own unless a log is named (--db, CKPT_AUDIT_DB, the config
  // file); without a RECORD, the per-user log by default.
  cmd->callback([=] {
    if (a->record.empty()) return WithDefaultDb(&a->db, exit_code, [=] { return Verify(*a); })();
    absl::Status named = ApplySetting(Setting::kDb, &a->db);
    *exit_code = named.ok() ? Verify(*a) : ReportError(named);
  });

  auto b = std::make_shared<VerifyArgs>();
  auto* log = app.add_subcommand(
      "verify-log", "Recompute and check every entry, signature, tree node and checkpoint");
  log->add_option(
      "--db", b->db,
      "evidence database (default: $CKPT_AUDIT_DB, then the config file, then per-user)");
  log->add_option("--trust", b->trust, "trust file (default: per-user)");
  log->add_option("--expect-size", b->expect_size,
                  "with --expect-tree-root: a tree head the log must be consistent with");
  log->add_option("--expect-tree-root", b->expect_root, "that head's root (hex, as printed)");
  log->add_flag("--json", b->json, "machine-readable output");
  log->callback(WithDefaultDb(&b->db, exit_code, [=] { return VerifyLogCommand(*b); }));
}

}  // namespace ckpt::cli
