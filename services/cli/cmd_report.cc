// `ckpt-audit report --db PATH ID`: one audit record as text, JSON, Markdown or a
// self-contained HTML page with plots; the record's signature is checked and shown.
#include <cstdio>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "core/evidence/strict_json.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/log_heads.h"
#include "services/cli/report_render.h"
#include "storage/evidence_log.h"

namespace ckpt::cli {
namespace {

struct ReportArgs {
  std::string db;
  uint64_t id = 0;
  std::string format = "text";
  std::string output;
  std::string trust;
};

int Run(const ReportArgs& a) {
  auto log = OpenLogReader(a.db);
  if (!log.ok()) return ReportError(log.status());
  auto entry = (*log)->Get(a.id);
  if (!entry.ok()) return ReportError(entry.status());
  if (entry->predicate_type != evidence::kEvidencePredicateType) {
    return ReportError(absl::InvalidArgumentError(absl::StrCat(
        "record ", a.id, " is a ", entry->predicate_type, " statement; report renders evidence "
        "records (see `verify --id` or `export --id`)")));
  }
  auto env = evidence::ParseEnvelope(entry->envelope);
  if (!env.ok()) return ReportError(env.status());
  // Bounded first (a stored payload may nest without end); then in its own key order for display.
  const std::string label = absl::StrCat(a.db, ": record ", a.id, " payload");
  if (auto checked = evidence::ParseStrictJson(env->payload, label); !checked.ok()) {
    return ReportError(absl::DataLossError(checked.status().message()));
  }
  auto statement = nlohmann::ordered_json::parse(env->payload, nullptr, false);
  ReportContext ctx;
  ctx.record_id = a.id;
  ctx.db = a.db;
  ctx.log_origin = (*log)->origin();
  auto trust = LoadTrust(a.trust);
  if (!trust.ok()) {
    ctx.signature = absl::StrCat("not checked: ", trust.status().message());
  } else if (auto keyid = evidence::VerifyEnvelope(*env, *trust); keyid.ok()) {
    ctx.signature_ok = true;
    ctx.signature = absl::StrCat("valid Ed25519 signature by trusted key ", *keyid);
  } else {
    ctx.signature = std::string(keyid.status().message());
  }
  std::string text;
  if (a.format == "text") text = RenderText(statement, ctx);
  else if (a.format == "json") text = RenderJson(statement, ctx);
  else if (a.format == "md") text = RenderMarkdown(statement, ctx);
  else if (a.format == "html") text = RenderHtml(statement, ctx);
  else return ReportError(absl::InvalidArgumentError("--format must be text, json, md or html"));
  if (a.output.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
  } else {
    std::ofstream out(a.output, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) return ReportError(absl::InvalidArgumentError(absl::StrCat(a.output, ": cannot write")));
  }
  return kExitOk;
}

}  // namespace

void AddReportCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ReportArgs>();
  auto* cmd = app.add_subcommand("report", "Render one audit record (text, json, md, html)");
  cmd->add_option(
      "--db", a->db,
      "evidence database (default: $CKPT_AUDIT_DB, then the config file, then per-user)");
  cmd->add_option("ID", a->id, "record id (from audit or query)")->required();
  cmd->add_option("--format", a->format, "text, json, md or html")
      ->check(CLI::IsMember({"text", "json", "md", "html"}));
  cmd->add_option("-o,--output", a->output, "write to this file instead of stdout");
  cmd->add_option("--trust", a->trust, "trust file for the signature check (default: per-user)");
  cmd->callback(WithDefaultDb(&a->db, exit_code, [=] { return Run(*a); }));
}

}  // namespace ckpt::cli
