// `ckpt-audit transcode --to nvfp4 SRC DST`: lossless MXFP4 -> NVFP4A16, or a failure naming
// every over-span tensor/row/group (nothing written). Exit 0 written, 1 policy refused the
// source, 2 invalid input or error.
#include <cstdio>
#include <memory>
#include <string>

#include "core/checkpoint.h"
#include "core/quant/transcode.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"

namespace ckpt::cli {
namespace {

struct TranscodeArgs {
  std::string to = "nvfp4";
  std::string src, dst;
  bool json = false;
  unsigned threads = 0;
};

int Run(const TranscodeArgs& a) {
  if (a.to != "nvfp4") {
    return ReportError(absl::InvalidArgumentError("--to: only nvfp4 is supported"));
  }
  auto src = Checkpoint::Open(a.src);
  if (!src.ok()) return ReportError(src.status());
  quant::TranscodeOptions options;
  options.threads = a.threads;
  TerminalProgress progress;
  absl::StatusOr<quant::TranscodeResult> r =
      quant::TranscodeToNvfp4(**src, a.dst, options, progress);
  if (!r.ok()) {
    ReportError(r.status());
    return r.status().code() == absl::StatusCode::kFailedPrecondition ? kExitCheckFailed
                                                                      : kExitError;
  }
  if (a.json) {
    nlohmann::json j = r->ToJson();
    j["source"] = (*src)->root();
    j["destination"] = a.dst;
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("wrote %s: %llu tensors in %zu files (%s), %llu modules transcoded losslessly, "
                "%llu all-zero groups canonicalized to scale +0 (policy %s)\n",
                a.dst.c_str(), static_cast<unsigned long long>(r->tensors_written),
                r->files.size(), HumanBytes(r->bytes_written).c_str(),
                static_cast<unsigned long long>(r->modules_transcoded),
                static_cast<unsigned long long>(r->zero_groups_canonicalized),
                r->policy.config.id().c_str());
  }
  return kExitOk;
}

}  // namespace

void AddTranscodeCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "transcode", "Losslessly transcode an MXFP4 checkpoint to NVFP4A16 (never requantizes)");
  auto a = std::make_shared<TranscodeArgs>();
  cmd->add_option("--to", a->to, "target format (nvfp4)")->required();
  cmd->add_option("SRC", a->src, "compressed-tensors MXFP4 checkpoint root")->required();
  cmd->add_option("DST", a->dst, "output directory (must not exist)")->required();
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->add_option("--threads", a->threads, "worker threads (0 = all cores)");
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
