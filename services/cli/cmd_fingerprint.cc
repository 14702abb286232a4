// `ckpt-audit fingerprint ROOT`: SHA-256 of every file and tensor under ROOT and the OpenSSF
// model-signing manifest ROOT over them (docs/oms-manifest.md).
#include <cstdio>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/evidence/strict_json.h"
#include "core/fingerprint/fingerprint.h"
#include "core/fingerprint/partition.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/read_file.h"

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
  std::string part;                 // "I/N"
  std::vector<std::string> merge;   // part JSON files
  LinkOptions links;
};

absl::StatusOr<Fingerprint> Merge(const FingerprintArgs& args) {
  std::vector<nlohmann::json> parts;
  for (const std::string& path : args.merge) {
    absl::StatusOr<std::string> text = ReadSmallFile(path);
    if (!text.ok()) return text.status();
    absl::StatusOr<nlohmann::json> j = evidence::ParseStrictJson(*text, path);
    if (!j.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(j.status().message(), " (not a JSON fingerprint part)"));
    }
    parts.push_back(*std::move(j));
  }
  return MergeFingerprintParts(args.root, parts);
}

void PrintText(const Fingerprint& fp) {
  uint64_t bytes = 0;
  for (const FileFingerprint& f : fp.files) bytes += f.size;
  std::printf("%s: %zu files, %s, %zu tensors\n", EncodeName(fp.root).c_str(), fp.files.size(),
              HumanBytes(bytes).c_str(), fp.tensors.size());
  for (const FileFingerprint& f : fp.files) {
    std::printf("  %s  %12s  %6zu tensors  %s\n",
                f.sha256 ? ToHex(*f.sha256).c_str() : std::string(64, '-').c_str(),
                HumanBytes(f.size).c_str(), f.tensor_count, f.path.c_str());
  }
  if (fp.layout.kind != TreeLayout::kPlain) {
    const std::string ref = fp.layout.ModelRef();
    std::printf("layout: %s%s\n", std::string(TreeLayoutName(fp.layout.kind)).c_str(),
                ref.empty() ? "" : (" (model ref " + ref + ")").c_str());
  }
  const OmsManifest& m = fp.manifest;
  std::printf("OMS manifest: %s, %zu resources\n", m.Algorithm().c_str(), m.resources.size());
  std::printf("ROOT %s\n", m.RootHex().c_str());
}

int Run(const FingerprintArgs& args) {
  FingerprintOptions options;
  options.threads = args.threads;
  options.manifest_mode = args.manifest == "oms-shards" ? OmsMode::kShards : OmsMode::kFiles;
  options.shard_size = args.shard_size;
  options.tensor_digests = !args.no_tensors;
  options.file_digests = !args.no_file_digests;
  options.links = args.links;
  if (!args.part.empty()) {
    // A part's manifest covers only its files: its ROOT must not be mistaken for the tree's.
    if (!args.json) {
      return ReportError(absl::InvalidArgumentError("--part writes JSON for --merge; add --json"));
    }
    auto part = ParsePartSpec(args.part);
    if (!part.ok()) return ReportError(part.status());
    options.part = *part;
  }
  TerminalProgress progress;
  absl::StatusOr<Fingerprint> fp =
      args.merge.empty() ? FingerprintTree(args.root, options, progress) : Merge(args);
  if (!fp.ok()) return ReportError(fp.status());
  if (args.statement) {
    std::printf("%s\n", DumpJson(OmsInTotoStatement(fp->manifest), 2).c_str());
  } else if (args.json) {
    const PartSpec* part = options.part.count > 1 ? &options.part : nullptr;
    nlohmann::json j = FingerprintToJson(*fp, part);
    if (args.merge.empty()) {
      j["layout"] = TreeLayoutName(fp->layout.kind);
      if (!fp->layout.ModelRef().empty()) j["model_ref"] = fp->layout.ModelRef();
    }
    std::printf("%s\n", DumpJson(j, 2).c_str());
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
  AcceptHubRepoIds(cmd->add_option("ROOT", args->root, "directory to fingerprint (any tree)"))
      ->required();
  cmd->add_option("--manifest", args->manifest,
                  "oms: one resource per file; oms-shards: per byte range of --shard-size")
      ->check(CLI::IsMember({"oms", "oms-shards"}));
  cmd->add_option("--shard-size", args->shard_size, "bytes per shard for --manifest oms-shards")
      ->check(CLI::PositiveNumber);
  AddThreadsOption(cmd, &args->threads);
  cmd->add_flag("--json", args->json, "every file and tensor digest and the ROOT, as JSON");
  cmd->add_flag("--no-tensors", args->no_tensors,
                "file digests only; *.safetensors files are then not parsed");
  cmd->add_flag("--no-file-digests", args->no_file_digests,
                "oms-shards only: skip the whole-file SHA-256, which is sequential per file");
  cmd->add_option("--part", args->part,
                  "hash only part I/N of the files (with --json; one Indexed Job pod each)");
  cmd->add_option("--merge", args->merge,
                  "merge these --part JSON files into the whole tree's fingerprint")
      ->excludes("--part");
  cmd->add_flag("--statement", args->statement,
                "print the unsigned in-toto statement (model_signing v1.0 predicate)");
  AddLinkFlags(cmd, &args->links);
  cmd->callback([=] { *exit_code = Run(*args); });
}

}  // namespace ckpt::cli
