// `ckpt-audit fingerprint ROOT`: SHA-256 of every file and tensor under ROOT and the OpenSSF
// model-signing manifest ROOT over them (docs/oms-manifest.md).
#include <cstdio>
#include <memory>

#include "absl/strings/str_format.h"
#include "core/fingerprint/fingerprint.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"

namespace ckpt::cli {
namespace {

struct FingerprintArgs {
  std::string root;
  std::string manifest = "oms";
  uint64_t shard_size = kDefaultOmsShardSize;
  unsigned threads = 0;
  bool json = false;
  bool statement = false;
  bool no_tensors = false;
  bool no_file_digests = false;
};

void PrintText(const Fingerprint& fp) {
  uint64_t bytes = 0;
  for (const FileFingerprint& f : fp.files) bytes += f.size;
  std::printf("%s: %zu files, %s, %zu tensors\n", fp.root.c_str(), fp.files.size(),
              HumanBytes(bytes).c_str(), fp.tensors.size());
  for (const FileFingerprint& f : fp.files) {
    std::printf("  %s  %12s  %6zu tensors  %s\n",
                f.sha256 ? ToHex(*f.sha256).c_str() : std::string(64, '-').c_str(),
                HumanBytes(f.size).c_str(), f.tensor_count, f.path.c_str());
  }
  const OmsManifest& m = fp.manifest;
  std::printf("OMS manifest: %s, %zu resources\n", m.Algorithm().c_str(), m.resources.size());
  std::printf("ROOT %s\n", m.RootHex().c_str());
}

nlohmann::json ToJson(const Fingerprint& fp) {
  nlohmann::json j;
  j["root"] = fp.root;
  j["hashed_bytes"] = fp.hashed_bytes;
  j["files"] = nlohmann::json::array();
  for (const FileFingerprint& f : fp.files) {
    nlohmann::json e = {{"path", f.path}, {"size", f.size}, {"tensors", f.tensor_count}};
    if (f.sha256) e["sha256"] = ToHex(*f.sha256);
    j["files"].push_back(std::move(e));
  }
  j["tensors"] = nlohmann::json::array();
  for (const TensorFingerprint& t : fp.tensors) {
    j["tensors"].push_back({{"file", t.file}, {"tensor", t.tensor}, {"bytes", t.bytes},
                            {"sha256", ToHex(t.sha256)}});
  }
  j["manifest"] = OmsManifestJson(fp.manifest);
  return j;
}

int Run(const FingerprintArgs& args) {
  FingerprintOptions options;
  options.threads = args.threads;
  options.manifest_mode = args.manifest == "oms-shards" ? OmsMode::kShards : OmsMode::kFiles;
  options.shard_size = args.shard_size;
  options.tensor_digests = !args.no_tensors;
  options.file_digests = !args.no_file_digests;
  TerminalProgress progress;
  absl::StatusOr<Fingerprint> fp = FingerprintTree(args.root, options, progress);
  if (!fp.ok()) return ReportError(fp.status());
  if (args.statement) {
    std::printf("%s\n", OmsInTotoStatement(fp->manifest).dump(2).c_str());
  } else if (args.json) {
    std::printf("%s\n", ToJson(*fp).dump(2).c_str());
  } else {
    PrintText(*fp);
  }
  return kExitOk;
}

}  // namespace

void AddFingerprintCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "fingerprint", "SHA-256 of every file and tensor in a tree, and its OMS manifest ROOT");
  auto args = std::make_shared<FingerprintArgs>();
  cmd->add_option("ROOT", args->root, "directory to fingerprint (any tree)")->required();
  cmd->add_option("--manifest", args->manifest,
                  "oms: one resource per file; oms-shards: per byte range of --shard-size")
      ->check(CLI::IsMember({"oms", "oms-shards"}));
  cmd->add_option("--shard-size", args->shard_size, "bytes per shard for --manifest oms-shards")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--threads", args->threads, "worker threads (default: all cores)");
  cmd->add_flag("--json", args->json, "every file and tensor digest and the ROOT, as JSON");
  cmd->add_flag("--no-tensors", args->no_tensors,
                "file digests only; *.safetensors files are then not parsed");
  cmd->add_flag("--no-file-digests", args->no_file_digests,
                "oms-shards only: skip the whole-file SHA-256, which is sequential per file");
  cmd->add_flag("--statement", args->statement,
                "print the unsigned in-toto statement (model_signing v1.0 predicate)");
  cmd->callback([=] { *exit_code = Run(*args); });
}

}  // namespace ckpt::cli
