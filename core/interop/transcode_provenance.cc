#include "core/interop/transcode_provenance.h"

#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/checkpoint.h"
#include "core/fingerprint/fingerprint.h"
#include "core/interop/tree_subjects.h"
#include "core/io/tree_image.h"

namespace ckpt::interop {

std::string DefaultProvenancePath(const std::string& output) {
  std::string base = output;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + ".intoto.jsonl";
}

absl::StatusOr<ProvenancedTranscode> TranscodeWithProvenance(const std::string& source,
                                                             const std::string& output,
                                                             const quant::TranscodeOptions& options,
                                                             const std::string& source_ref,
                                                             Progress& progress) {
  ProvenancedTranscode out;
  evidence::TranscodeProvenance& p = out.provenance;
  p.started_at = evidence::Rfc3339Now();
  p.environment = evidence::CollectEnvironment();
  // One read of the source: the transcode consumes exactly the bytes whose digests the
  // provenance names (core/io/tree_image.h), whatever happens to the files on disk meanwhile.
  ReadOptions read;
  read.keep = ReadOptions::Keep::kEverything;
  read.threads = options.threads;
  read.tensor_digests = false;
  const TreeWalkOptions walk;
  auto image = ReadTree(source, read, walk);
  if (!image.ok()) return image.status();
  auto ckpt = Checkpoint::Open(*image);
  if (!ckpt.ok()) return ckpt.status();
  auto result = quant::TranscodeToNvfp4(**ckpt, output, options, progress);
  if (!result.ok()) return result.status();
  auto out_root = RealPath(output);
  if (!out_root.ok()) return out_root.status();
  auto derived = TreeSubjects(*out_root, options.threads, progress);
  if (!derived.ok()) return derived.status();
  p.source = audit::SubjectsOf(FingerprintOf(**image, walk.ignore_paths));
  p.derived = *std::move(derived);
  p.source_ref = source_ref;
  p.target_format = "nvfp4";
  p.policy = audit::PolicyRefOf(options.policy);
  p.source_path = (*image)->root;
  p.output_path = *out_root;
  p.finished_at = evidence::Rfc3339Now();
  out.result = *std::move(result);
  return out;
}

}  // namespace ckpt::interop
