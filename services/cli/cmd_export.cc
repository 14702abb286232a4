// `ckpt-audit export --db PATH --id N --format intoto-jsonl [--out FILE]`: a logged statement and
// its companions (the record's test result and verification summaries) as an in-toto bundle,
// JSON Lines of DSSE envelopes (core/interop/intoto_bundle.h). Exit 0 written, 2 error.
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/interop/intoto_bundle.h"
#include "services/cli/cli_util.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/commands.h"
#include "services/cli/log_heads.h"
#include "services/cli/read_file.h"
#include "storage/evidence_log.h"

namespace ckpt::cli {
namespace {

struct ExportArgs {
  std::string db;
  int64_t id = -1;
  std::string format;
  std::string out;
};

int Run(const ExportArgs& a) {
  if (a.format != "intoto-jsonl") {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat("--format ", a.format, ": only intoto-jsonl is supported")));
  }
  if (a.id < 0) return ReportError(absl::InvalidArgumentError("--id must be a record id >= 0"));
  auto log = OpenLogReader(a.db);
  if (!log.ok()) return ReportError(log.status());
  auto bundle = interop::ExportInTotoBundle(**log, static_cast<uint64_t>(a.id));
  if (!bundle.ok()) return ReportError(bundle.status());
  if (a.out.empty()) {
    std::fputs(bundle->jsonl.c_str(), stdout);
  } else if (auto s = WriteFileAtomically(a.out, bundle->jsonl); !s.ok()) {
    return ReportError(s);
  }
  std::fprintf(stderr, "exported entries %s of %s\n", absl::StrJoin(bundle->ids, ", ").c_str(),
               (*log)->origin().c_str());
  return kExitOk;
}

}  // namespace

void AddExportCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<ExportArgs>();
  auto* cmd = app.add_subcommand(
      "export", "Write a logged record and its companions as an in-toto bundle (.intoto.jsonl)");
  cmd->add_option(
      "--db", a->db,
      "evidence database (default: $CKPT_AUDIT_DB, then the config file, then per-user)");
  cmd->add_option("--id", a->id, "record id")->required();
  cmd->add_option("--format", a->format, "intoto-jsonl")->required();
  cmd->add_option("--out", a->out, "write here instead of stdout");
  cmd->callback(WithDefaultDb(&a->db, exit_code, [=] { return Run(*a); }));
}

}  // namespace ckpt::cli
