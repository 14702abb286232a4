// `ckpt-audit verify-chain DERIVED [--source S] --db LOG [--provenance FILE] [--trust FILE]`:
// checks offline that DERIVED is what a signed transcode provenance names, that the source (when
// given) is what it was made from, and that the log holds a passing pair audit of exactly this
// derived content against exactly that source; prints the chain (core/interop/chain_verify.h).
// Exit 0 the whole chain holds, 1 a link is broken, 2 invalid input.
#include <cstdio>
#include <memory>
#include <string>

#include "core/text/json_dump.h"
#include "absl/strings/str_cat.h"
#include "core/interop/chain_verify.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/log_heads.h"
#include "storage/evidence_log.h"

namespace ckpt::cli {
namespace {

struct ChainArgs {
  interop::ChainOptions options;
  std::string db;
  std::string trust;
  bool json = false;
};

void PrintChain(const interop::ChainReport& r) {
  if (!r.provenance) return;
  const evidence::TranscodeProvenance& p = *r.provenance;
  auto root = [](const std::vector<evidence::Subject>& subjects) {
    for (const auto& s : subjects) {
      if (s.name == evidence::kManifestRootSubject) return s.sha256;
    }
    return std::string("?");
  };
  std::string ref = p.source_ref.empty() ? "" : absl::StrCat(" (", p.source_ref, ")");
  std::printf("chain:\n  source   %s%s\n           OMS ROOT %s\n", p.source_path.c_str(),
              ref.c_str(), root(p.source).c_str());
  std::printf("  -> transcode to %s under policy %s@%s by ckpt-audit %s, %s .. %s\n",
              p.target_format.c_str(), p.policy.name.c_str(), p.policy.version.c_str(),
              p.environment.tool_version.c_str(), p.started_at.c_str(), p.finished_at.c_str());
  std::printf("  derived  %s\n           OMS ROOT %s\n", p.output_path.c_str(),
              root(p.derived).c_str());
  if (r.pair_audit_id) {
    std::printf("  -> pair audit: record %llu (pass)\n",
                static_cast<unsigned long long>(*r.pair_audit_id));
  }
}

int Run(const ChainArgs& a) {
  auto trust = LoadTrust(a.trust);
  if (!trust.ok()) return ReportError(trust.status());
  auto log = OpenLogReader(a.db);
  if (!log.ok()) return ReportError(log.status());
  TerminalProgress progress;
  auto report = interop::VerifyChain(a.options, **log, *trust, progress);
  if (!report.ok()) return ReportError(report.status());
  if (a.json) {
    nlohmann::ordered_json j = {{"ok", report->ok()}, {"steps", nlohmann::ordered_json::array()}};
    for (const auto& s : report->steps) j["steps"].push_back({{"ok", s.ok}, {"what", s.what}});
    if (report->provenance_id) j["provenance_id"] = *report->provenance_id;
    if (report->pair_audit_id) j["pair_audit_id"] = *report->pair_audit_id;
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    for (const auto& s : report->steps) {
      std::printf("[%s] %s\n", s.ok ? "ok" : "FAIL", s.what.c_str());
    }
    PrintChain(*report);
    std::printf("%s\n", report->ok() ? "CHAIN VERIFIED" : "CHAIN NOT VERIFIED");
  }
  return report->ok() ? kExitOk : kExitCheckFailed;
}

}  // namespace

void AddVerifyChainCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ChainArgs>();
  auto* cmd = app.add_subcommand(
      "verify-chain",
      "Check a derived checkpoint's provenance, its source and its pair audit, offline");
  AcceptHubRepoIds(cmd->add_option("DERIVED", a->options.derived, "derived checkpoint root"))
      ->required();
  AcceptHubRepoIds(
      cmd->add_option("--source", a->options.source, "the source checkpoint, when it is here"));
  cmd->add_option("--db", a->db,
                  "evidence database holding the pair audit (default: $CKPT_AUDIT_DB, then the "
                  "config file, then per-user)");
  cmd->add_option("--provenance", a->options.provenance,
                  "provenance file (default DERIVED.intoto.jsonl, else the log)");
  cmd->add_option("--trust", a->trust, "trust file (default: per-user)");
  AddThreadsOption(cmd, &a->options.threads);
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback(WithDefaultDb(&a->db, exit_code, [=] { return Run(*a); }));
}

}  // namespace ckpt::cli
