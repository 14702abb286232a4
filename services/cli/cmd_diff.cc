// `ckpt-audit diff A.safetensors B.safetensors`: per-tensor bitwise comparison, differing
// elements, max |diff| and ULP histograms of two tensor files, e.g. activations a serving engine
// captured against `forward --output` (core/forward/tensor_file_diff.h). Exit 0 identical,
// 1 different, 2 error.
#include <cstdio>

#include "core/forward/tensor_file_diff.h"
#include "core/text/json_dump.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"

namespace ckpt::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  bool json = false;
  uint64_t memory_window = kDefaultMemoryWindow;
};

int Run(const DiffArgs& args) {
  auto r = forward::DiffTensorFiles(args.a, args.b, args.memory_window);
  if (!r.ok()) return ReportError(r.status());
  const nlohmann::json& j = r->report;
  if (args.json) {
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    for (const auto& [name, t] : j["tensors"].items()) {
      const std::string status = t["status"].get<std::string>();
      if (status != "compared") {
        std::printf("  %-24s %s\n", name.c_str(), status.c_str());
        continue;
      }
      std::string hist;  // in bucket order (JSON objects sort their keys)
      for (const char* bucket : {"0", "1", "2-3", "4-15", "16-255", "256+"}) {
        hist += (hist.empty() ? "" : "/") + std::to_string(t["ulp_histogram"].value(bucket, uint64_t{0}));
      }
      std::printf("  %-24s %s  in %s  differing %llu/%llu  max|diff| %s  ULPs %s\n",
                  name.c_str(), t["bitwise_equal"].get<bool>() ? "identical" : "DIFFERENT",
                  t["compared_in"].get<std::string>().c_str(),
                  static_cast<unsigned long long>(t["differing_elements"].get<uint64_t>()),
                  static_cast<unsigned long long>(t["elements"].get<uint64_t>()),
                  t["max_abs_diff"].get<std::string>().c_str(), hist.c_str());
    }
    std::printf("verdict: %s\n", j["verdict"].get<std::string>().c_str());
  }
  return r->identical ? kExitOk : kExitCheckFailed;
}

}  // namespace

void AddDiffCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "diff", "Compare the tensors of two safetensors files (bits, max |diff|, ULP histograms)");
  auto a = std::make_shared<DiffArgs>();
  cmd->add_option("A", a->a, "first safetensors file")->required();
  cmd->add_option("B", a->b, "second safetensors file")->required();
  cmd->add_flag("--json", a->json, "machine-readable output");
  AddMemoryWindowFlag(cmd, &a->memory_window);
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
