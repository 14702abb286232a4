// `ckpt-audit quant-check ROOT`: quantization format, config/tensor contract findings and the
// scale-window policy verdict of one checkpoint. Exit 0 clean, 1 contract findings, over-span
// or NaN scales (backend hazards are reported but do not fail), 2 invalid input or error.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/audit/engine.h"
#include "core/audit/scale_window_check.h"
#include "core/quant/format.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"

namespace ckpt::cli {
namespace {

struct QuantCheckArgs {
  audit::EngineOptions engine;  // root, threads, window
  bool json = false;
  size_t max_findings = 20;
  std::vector<std::string> map_root;
};

void PrintList(const char* title, const quant::FindingList& list) {
  std::printf("%s: %llu\n", title, static_cast<unsigned long long>(list.total()));
  for (const quant::Finding& f : list.kept()) std::printf("  - %s\n", f.ToText().c_str());
  if (list.total() > list.kept().size()) {
    std::printf("  ... %llu more not listed\n",
                static_cast<unsigned long long>(list.total() - list.kept().size()));
  }
}

int Run(const QuantCheckArgs& a) {
  quant::FormatOptions fopt;
  fopt.max_findings = a.max_findings;
  for (const std::string& spec : a.map_root) {
    absl::StatusOr<quant::RootMapping> m = quant::ParseRootMapping(spec);
    if (!m.ok()) return ReportError(m.status());
    fopt.root_map.push_back(*m);
  }
  TerminalProgress progress;
  // One read of the root in the memory window (core/audit/engine.h); no file digests.
  auto engine = audit::Engine::Open(a.engine, progress);
  if (!engine.ok()) return ReportError(engine.status());
  const Checkpoint* ckpt = (*engine)->root().checkpoint.get();
  if (ckpt == nullptr) return ReportError((*engine)->root().checkpoint_status);
  const quant::FormatReport format = quant::DetectFormat(*ckpt, fopt);
  quant::ScaleWindowConfig config;
  config.max_listed = a.max_findings;
  audit::ScaleWindowCheck check(config);
  auto streamed = (*engine)->Run({&check}, progress);
  if (!streamed.ok()) return ReportError(streamed.status());
  if (absl::Status s = (*engine)->CheckUnchanged(*streamed); !s.ok()) return ReportError(s);
  const quant::ScaleWindowResult sw = std::move(check).Result();
  const bool failed = format.findings.total() > 0 ||
                      sw.verdict == quant::ScaleWindowVerdict::kOverSpan ||
                      sw.verdict == quant::ScaleWindowVerdict::kNaNScale;
  if (a.json) {
    nlohmann::json j = {{"root", ckpt->root()},
                        {"format", format.ToJson()},
                        {"scale_window", sw.ToJson()},
                        {"passed", !failed}};
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("%s\nformat: %s, %llu quantized tensors\n", EncodeName(ckpt->root()).c_str(),
                format.Describe().c_str(),
                static_cast<unsigned long long>(format.quantized_modules));
    PrintList("contract findings", format.findings);
    PrintList("warnings (never failing)", format.warnings);
    std::printf("scale window (%s): %s; %llu all-zero groups with out-of-window scales\n",
                sw.config.id().c_str(), quant::VerdictName(sw.verdict).c_str(),
                static_cast<unsigned long long>(sw.zero_groups_out_of_window));
    PrintList("over-span groups", sw.over_span);
    PrintList("NaN scales", sw.nan_scales);
    PrintList("backend hazards", sw.hazards);
  }
  return failed ? kExitCheckFailed : kExitOk;
}

}  // namespace

void AddQuantCheckCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "quant-check", "Detect the quantization format, check its contract and the scale window");
  auto a = std::make_shared<QuantCheckArgs>();
  a->engine.file_digests = false;
  AcceptHubRepoIds(cmd->add_option("ROOT", a->engine.root, "checkpoint root"))->required();
  cmd->add_flag("--json", a->json, "machine-readable output");
  AddThreadsOption(cmd, &a->engine.threads);
  AddMemoryWindowFlag(cmd, &a->engine.memory_window);
  cmd->add_option("--max-findings", a->max_findings, "findings listed per kind");
  cmd->add_option("--map-root", a->map_root,
                  "/DECLARED=/ACTUAL: where an X4T checkpoint_root is mounted now");
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
