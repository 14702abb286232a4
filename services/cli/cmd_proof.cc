// `ckpt-audit proof --db PATH --id N` prints a portable C2SP tlog-proof@v1 proof that record N is
// in the log (the record itself, its inclusion path and the signed checkpoint; storage/
// tlog_proof.h). `ckpt-audit verify-proof FILE --vkey VKEY` checks one offline with nothing but
// the log's note verifier key (`keys show --db PATH` prints it). Exit 0 verified, 1 not,
// 2 invalid input.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "core/text/json_dump.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/log_heads.h"
#include "services/cli/read_file.h"
#include "storage/evidence_log.h"
#include "storage/tlog_proof.h"

namespace ckpt::cli {
namespace {

struct ProofArgs {
  std::string db;
  int64_t id = -1;
  std::string out;
};

struct VerifyProofArgs {
  std::string file;
  std::string vkey;
  std::string entry;
  std::string trust;
  bool json = false;
};

int Prove(const ProofArgs& a) {
  if (a.id < 0) return ReportError(absl::InvalidArgumentError("--id must be a record id >= 0"));
  auto log = OpenLogReader(a.db);
  if (!log.ok()) return ReportError(log.status());
  auto proof = storage::ProveEntry(**log, static_cast<uint64_t>(a.id));
  if (!proof.ok()) return ReportError(proof.status());
  std::string text = storage::FormatTlogProof(*proof);
  if (a.out.empty()) {
    std::fputs(text.c_str(), stdout);
    return kExitOk;
  }
  if (auto s = WriteFileAtomically(a.out, text); !s.ok()) return ReportError(s);
  std::fprintf(stderr, "wrote %s: record %lld in %s\n", a.out.c_str(),
               static_cast<long long>(a.id), (*log)->origin().c_str());
  return kExitOk;
}

// --vkey takes the key itself, or the path of a file holding it on its first line.
absl::StatusOr<storage::NoteVerifierKey> LoadVkey(const std::string& arg) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(arg, ec)) return storage::ParseNoteVerifierKey(arg);
  auto text = ReadSmallFile(arg, 4096);
  if (!text.ok()) return text.status();
  std::string line = text->substr(0, text->find('\n'));
  return storage::ParseNoteVerifierKey(std::string(absl::StripAsciiWhitespace(line)));
}

int VerifyProof(const VerifyProofArgs& a) {
  auto vkey = LoadVkey(a.vkey);
  if (!vkey.ok()) return ReportError(vkey.status());
  auto text = ReadSmallFile(a.file, 256u << 20);
  if (!text.ok()) return ReportError(text.status());
  auto proof = storage::ParseTlogProof(*text);
  if (!proof.ok()) return ReportError(proof.status());
  std::optional<std::string> entry;
  if (!a.entry.empty()) {
    auto bytes = ReadSmallFile(a.entry, 256u << 20);
    if (!bytes.ok()) return ReportError(bytes.status());
    entry = *std::move(bytes);
  }
  auto verified = storage::VerifyTlogProof(*proof, *vkey, entry);
  if (!verified.ok() && verified.status().code() != absl::StatusCode::kFailedPrecondition) {
    return ReportError(verified.status());
  }
  std::vector<std::string> lines;
  bool ok = verified.ok();
  std::string predicate_type;
  if (ok) {
    lines.push_back(absl::StrCat("entry ", verified->index, " is included in ", vkey->name,
                                 " at tree size ", verified->head.size,
                                 " (checkpoint signed by ", a.vkey, ")"));
    auto env = evidence::ParseEnvelope(verified->entry);
    auto idx = env.ok() ? evidence::IndexPayload(env->payload)
                        : absl::StatusOr<evidence::RecordIndex>(env.status());
    if (idx.ok()) {
      predicate_type = idx->predicate_type;
      lines.push_back(absl::StrCat("entry: ", idx->predicate_type, ", verdict ", idx->verdict,
                                   ", ", idx->subjects.size(), " subjects"));
    }
    if (!a.trust.empty()) {
      auto trust = LoadTrust(a.trust);
      if (!trust.ok()) return ReportError(trust.status());
      auto signer = env.ok() ? evidence::VerifyEnvelope(*env, *trust)
                             : absl::StatusOr<std::string>(env.status());
      ok = signer.ok();
      lines.push_back(signer.ok() ? absl::StrCat("entry signature: trusted key ", *signer)
                                  : absl::StrCat("entry signature: ", signer.status().message()));
    }
  } else {
    lines.push_back(std::string(verified.status().message()));
  }
  if (a.json) {
    nlohmann::ordered_json j = {{"verified", ok}, {"lines", lines}};
    if (verified.ok()) {
      j["index"] = verified->index;
      j["tree_size"] = verified->head.size;
      j["origin"] = verified->head.origin;
      j["predicate_type"] = predicate_type;
    }
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    for (const std::string& l : lines) std::printf("%s\n", l.c_str());
    std::printf("%s\n", ok ? "PROOF VERIFIED" : "PROOF NOT VERIFIED");
  }
  return ok ? kExitOk : kExitCheckFailed;
}

}  // namespace

void AddProofCommands(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ProofArgs>();
  auto* cmd = app.add_subcommand(
      "proof", "Print a C2SP tlog-proof@v1 inclusion proof of one record (self-contained)");
  cmd->add_option(
      "--db", a->db,
      "evidence database (default: $CKPT_AUDIT_DB, then the config file, then per-user)");
  cmd->add_option("--id", a->id, "record id")->required();
  cmd->add_option("--out", a->out, "write the proof here instead of stdout");
  cmd->callback(WithDefaultDb(&a->db, exit_code, [=] { return Prove(*a); }));

  auto b = std::make_shared<VerifyProofArgs>();
  auto* verify = app.add_subcommand(
      "verify-proof", "Verify a tlog-proof@v1 proof offline with the log's note verifier key");
  verify->add_option("FILE", b->file, "proof file")->required();
  verify->add_option("--vkey", b->vkey, "note verifier key NAME+HASH+KEY, or a file holding it")
      ->required();
  verify->add_option("--entry", b->entry, "the entry's bytes, when the proof has no extra line");
  verify->add_option("--trust", b->trust, "also check the entry's DSSE signature (trust file)");
  verify->add_flag("--json", b->json, "machine-readable output");
  verify->callback([=] { *exit_code = VerifyProof(*b); });
}

}  // namespace ckpt::cli
