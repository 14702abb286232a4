// `ckpt-audit inspect PATH`: what a checkpoint root or a single .safetensors file holds.
#include <sys/stat.h>

#include <cstdio>
#include <map>

#include "absl/strings/str_format.h"
#include "core/audit/engine.h"
#include "core/audit/weight_files.h"
#include "core/quant/format.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"

namespace ckpt::cli {
namespace {

struct FileSummary {
  std::string path;
  uint64_t bytes = 0;
  size_t tensors = 0;
};

struct Summary {
  std::string kind;
  std::string layout = "plain";  // core/io/hf_layout.h
  std::string model_ref;
  std::string quantization = "none declared";
  std::vector<FileSummary> files;
  std::vector<audit::UncheckedWeightFile> unchecked;  // weights no check reads
  std::map<std::string, size_t> by_dtype;
  uint64_t tensor_bytes = 0;
};

void AddFile(const SafetensorsFile& f, const std::string& name, Summary* s) {
  s->files.push_back({EncodeName(name), f.file_size(), f.tensors().size()});
  for (const TensorInfo& t : f.tensors()) {
    s->by_dtype[std::string(DTypeName(t.dtype))]++;
    s->tensor_bytes += t.num_bytes();
  }
}

absl::StatusOr<Summary> Summarize(const std::string& path, const LinkOptions& links,
                                  uint64_t window) {
  Summary s;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
    auto f = SafetensorsFile::OpenHeader(path);
    if (!f.ok()) return f.status();
    s.kind = "safetensors file";
    AddFile(**f, path, &s);
    return s;
  }
  // Small files and headers only: no tensor data is read (core/audit/engine.h).
  audit::EngineOptions options;
  options.root = path;
  options.links = links;
  options.memory_window = window;  // small files and headers count against it
  options.file_digests = false;
  auto engine = audit::Engine::Open(options, NoProgress());
  if (!engine.ok()) return engine.status();
  const audit::TreeHeaders& tree = (*engine)->root();
  s.layout = std::string(TreeLayoutName(tree.layout.kind));
  s.model_ref = tree.layout.ModelRef();
  if (tree.checkpoint == nullptr) return tree.checkpoint_status;
  const Checkpoint* ckpt = tree.checkpoint.get();
  s.kind = absl::StrFormat("checkpoint root (%s) %s", LayoutName(ckpt->layout()),
                           EncodeName(ckpt->root()));
  const quant::FormatReport format = quant::DetectFormat(*ckpt);
  s.quantization = format.Describe();
  if (format.findings.total() > 0) {
    s.quantization += " (" + std::to_string(format.findings.total()) +
                      " contract findings: ckpt-audit quant-check)";
  }
  for (const auto& shard : ckpt->shards()) AddFile(*shard, ckpt->RelativePath(*shard), &s);
  s.unchecked = audit::UncheckedWeightFiles(*ckpt);
  return s;
}

void PrintText(const Summary& s) {
  std::printf("%s\n", s.kind.c_str());
  std::printf("layout: %s%s\n", s.layout.c_str(),
              s.model_ref.empty() ? "" : (" (model ref " + s.model_ref + ")").c_str());
  std::printf("quantization: %s\n", s.quantization.c_str());
  size_t total_tensors = 0;
  for (const FileSummary& f : s.files) {
    std::printf("  %-48s %12s  %6zu tensors\n", f.path.c_str(), HumanBytes(f.bytes).c_str(),
                f.tensors);
    total_tensors += f.tensors;
  }
  for (const audit::UncheckedWeightFile& u : s.unchecked) {
    std::printf("  %-48s %12s  not checked: %s%s (%s)\n", u.name.c_str(),
                HumanBytes(u.bytes).c_str(), u.code.c_str(), u.fails ? ", fails an audit" : "",
                u.reason.c_str());
  }
  std::printf("tensors by dtype:");
  for (const auto& [dtype, n] : s.by_dtype) std::printf(" %s=%zu", dtype.c_str(), n);
  std::printf("\ntotal: %zu files, %zu tensors, %s of tensor data (%llu bytes)\n",
              s.files.size(), total_tensors, HumanBytes(s.tensor_bytes).c_str(),
              static_cast<unsigned long long>(s.tensor_bytes));
}

void PrintJson(const Summary& s) {
  nlohmann::json j;
  j["kind"] = s.kind;
  j["layout"] = s.layout;
  if (!s.model_ref.empty()) j["model_ref"] = s.model_ref;
  j["quantization"] = s.quantization;
  j["tensor_bytes"] = s.tensor_bytes;
  j["tensors_by_dtype"] = s.by_dtype;
  for (const FileSummary& f : s.files) {
    j["files"].push_back({{"path", f.path}, {"bytes", f.bytes}, {"tensors", f.tensors}});
  }
  for (const audit::UncheckedWeightFile& u : s.unchecked) {
    j["unchecked_weight_files"].push_back({{"path", u.name},
                                           {"bytes", u.bytes},
                                           {"code", u.code},
                                           {"fails", u.fails},
                                           {"reason", u.reason}});
  }
  std::printf("%s\n", DumpJson(j, 2).c_str());
}

}  // namespace

void AddInspectCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand("inspect", "Summarize a checkpoint root or .safetensors file");
  auto path = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  AcceptHubRepoIds(cmd->add_option("PATH", *path, "checkpoint root or .safetensors file"))
      ->required();
  cmd->add_flag("--json", *json, "machine-readable output");
  auto links = std::make_shared<LinkOptions>();
  AddLinkFlags(cmd, links.get());
  auto window = std::make_shared<uint64_t>(kDefaultMemoryWindow);
  AddMemoryWindowFlag(cmd, window.get());
  cmd->callback([=] {
    absl::StatusOr<Summary> s = Summarize(*path, *links, *window);
    if (!s.ok()) {
      *exit_code = ReportError(s.status());
      return;
    }
    *json ? PrintJson(*s) : PrintText(*s);
    *exit_code = kExitOk;
  });
}

}  // namespace ckpt::cli
