// `ckpt-audit verify-pair --source S --derived D`: is D a lossless re-encoding of S?
// Exit 0 lossless, 1 any mismatch, 2 invalid input or error (docs/quant.md).
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/audit/engine.h"
#include "core/audit/pair_check.h"
#include "core/quant/pair_verify.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"

namespace ckpt::cli {
namespace {

struct VerifyPairArgs {
  audit::EngineOptions engine;  // root: the derived checkpoint
  bool json = false;
  size_t max_findings = 20;
  std::vector<std::string> map_root;
};

struct WindowTotals {
  uint64_t blocks = 0, window = 0, modelopt = 0;
};
WindowTotals TotalsOf(const quant::PairVerifyResult& r) {
  WindowTotals t;
  for (const quant::PairWindowCount& w : r.windows) {
    t.blocks += w.blocks;
    t.window += w.lossless_window;
    t.modelopt += w.modelopt_rule;
  }
  return t;
}

void PrintText(const VerifyPairArgs& a, const quant::PairVerifyResult& r) {
  std::printf("source:  %s (%s)\n", a.engine.source.c_str(), r.source_format.c_str());
  std::printf("derived: %s (%s)\n", a.engine.root.c_str(), r.derived_format.c_str());
  std::printf("verdict: %s\n", r.verdict().c_str());
  std::printf("  quantized tensors %llu (%s packed, %llu scale blocks), fused groups %llu, "
              "zero groups canonicalized %llu\n",
              static_cast<unsigned long long>(r.quantized_tensors),
              HumanBytes(r.packed_bytes_compared).c_str(),
              static_cast<unsigned long long>(r.value_blocks_compared),
              static_cast<unsigned long long>(r.fused_groups_checked),
              static_cast<unsigned long long>(r.zero_groups_canonicalized));
  std::printf("  other tensors %llu (%s, compared by sha256)\n",
              static_cast<unsigned long long>(r.ignored_tensors_compared),
              HumanBytes(r.ignored_bytes_compared).c_str());
  // The source tensors not wholly inside both windows (ours, ModelOpt's k_max rule).
  const auto k = [](const std::optional<int>& v) { return v ? std::to_string(*v) : "none"; };
  for (const quant::PairWindowCount& w : r.windows) {
    if (w.lossless_window == w.blocks && w.modelopt_rule == w.blocks) continue;
    std::printf("  %s: %llu of %llu blocks in the window (k_max %s), ModelOpt's rule %llu "
                "(k_max %s)\n",
                w.tensor.c_str(), static_cast<unsigned long long>(w.lossless_window),
                static_cast<unsigned long long>(w.blocks), k(w.k_max_active).c_str(),
                static_cast<unsigned long long>(w.modelopt_rule), k(w.k_max_modelopt).c_str());
  }
  std::printf("mismatches: %llu\n", static_cast<unsigned long long>(r.mismatches.total()));
  for (const auto& [code, n] : r.mismatches.by_code()) {
    std::printf("  %-36s %llu\n", code.c_str(), static_cast<unsigned long long>(n));
  }
  for (const quant::Finding& f : r.mismatches.kept()) std::printf("  - %s\n", f.ToText().c_str());
  if (r.mismatches.total() > r.mismatches.kept().size()) {
    std::printf("  ... %llu more not listed (--max-findings)\n",
                static_cast<unsigned long long>(r.mismatches.total() - r.mismatches.kept().size()));
  }
  if (r.warnings.total() > 0) {
    std::printf("warnings (never decide the verdict): %llu\n",
                static_cast<unsigned long long>(r.warnings.total()));
    for (const quant::Finding& f : r.warnings.kept()) std::printf("  - %s\n", f.ToText().c_str());
  }
  const WindowTotals w = TotalsOf(r);
  std::printf("source blocks %llu: in our lossless window %llu, lossless under ModelOpt's k_max "
              "rule %llu\n", static_cast<unsigned long long>(w.blocks),
              static_cast<unsigned long long>(w.window), static_cast<unsigned long long>(w.modelopt));
  std::printf("ModelOpt-cast hazards: %llu\n", static_cast<unsigned long long>(r.hazards.total()));
  for (const quant::Finding& f : r.hazards.kept()) std::printf("  - %s\n", f.ToText().c_str());
}

// Per-tensor window counts and ModelOpt-cast hazards (quant::PairVerifyResult), which the
// record does not carry: they describe the source under another cast, not this pair.
nlohmann::ordered_json WindowsJson(const quant::PairVerifyResult& r) {
  nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
  for (const quant::PairWindowCount& t : r.windows) {
    nlohmann::ordered_json e = {{"tensor", t.tensor},
                                {"blocks", t.blocks},
                                {"lossless_window", t.lossless_window},
                                {"modelopt_rule", t.modelopt_rule}};
    e["k_max_active"] = t.k_max_active ? nlohmann::ordered_json(*t.k_max_active) : nullptr;
    e["k_max_modelopt"] = t.k_max_modelopt ? nlohmann::ordered_json(*t.k_max_modelopt) : nullptr;
    tensors.push_back(std::move(e));
  }
  const WindowTotals w = TotalsOf(r);
  return {{"blocks", w.blocks},
          {"lossless_window", w.window},
          {"modelopt_rule", w.modelopt},
          {"tensors", tensors},
          {"hazards", r.hazards.ToJson()}};
}

int Run(const VerifyPairArgs& a) {
  quant::PairVerifyOptions options;
  options.max_findings = a.max_findings;
  options.threads = a.engine.threads;
  for (const std::string& spec : a.map_root) {
    absl::StatusOr<quant::RootMapping> m = quant::ParseRootMapping(spec);
    if (!m.ok()) return ReportError(m.status());
    options.format.root_map.push_back(*m);
  }
  TerminalProgress progress;
  // One read of both trees in the memory window (core/audit/engine.h); no file digests.
  auto engine = audit::Engine::Open(a.engine, progress);
  if (!engine.ok()) return ReportError(engine.status());
  const audit::Engine& e = **engine;
  if (e.source().checkpoint == nullptr) return ReportError(e.source().checkpoint_status);
  if (e.root().checkpoint == nullptr) return ReportError(e.root().checkpoint_status);
  audit::PairCheck check(options);
  auto streamed = (*engine)->Run({&check}, progress);
  if (!streamed.ok()) return ReportError(streamed.status());
  if (absl::Status s = e.CheckUnchanged(*streamed); !s.ok()) return ReportError(s);
  const quant::PairVerifyResult r = std::move(check).Result();
  if (a.json) {
    nlohmann::ordered_json j = audit::PairAuditOf(r).ToJson();
    j["source"] = e.source().checkpoint->root();
    j["derived"] = e.root().checkpoint->root();
    j["source_windows"] = WindowsJson(r);
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    PrintText(a, r);
  }
  return r.lossless ? kExitOk : kExitCheckFailed;
}

}  // namespace

void AddVerifyPairCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "verify-pair", "Verify that a derived checkpoint (NVFP4 or X4T) is a lossless re-encoding "
                     "of an MXFP4 source");
  auto a = std::make_shared<VerifyPairArgs>();
  a->engine.file_digests = false;
  AcceptHubRepoIds(cmd->add_option("--source", a->engine.source, "MXFP4 source checkpoint root"))
      ->required();
  AcceptHubRepoIds(cmd->add_option("--derived", a->engine.root, "NVFP4 or X4T checkpoint root"))
      ->required();
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->add_option("--max-findings", a->max_findings, "mismatches to list (all are counted)");
  AddThreadsOption(cmd, &a->engine.threads);
  AddMemoryWindowFlag(cmd, &a->engine.memory_window);
  cmd->add_option("--map-root", a->map_root,
                  "/DECLARED=/ACTUAL: where an X4T checkpoint_root is mounted now");
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
