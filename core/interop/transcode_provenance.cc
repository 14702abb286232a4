#include "core/interop/transcode_provenance.h"

#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/fingerprint/fingerprint.h"
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
  // provenance names, and the output digests are of the files it wrote
  // (core/quant/transcode.h), whatever happens to either tree on disk meanwhile.
  auto result = quant::TranscodeToNvfp4(source, output, options, progress);
  if (!result.ok()) return result.status();
  const TreeWalkOptions walk;
  auto source_subjects = audit::SubjectsOf(FingerprintOf(*result->source, walk.ignore_paths));
  if (!source_subjects.ok()) return source_subjects.status();
  auto derived_subjects = audit::SubjectsOf(FingerprintOf(*result->output, walk.ignore_paths));
  if (!derived_subjects.ok()) return derived_subjects.status();
  p.source = *std::move(source_subjects);
  p.derived = *std::move(derived_subjects);
  p.source_ref = source_ref;
  p.target_format = "nvfp4";
  p.layout = quant::TranscodeLayoutName(options.layout);
  p.policy = audit::PolicyRefOf(options.policy);
  p.source_path = result->source->root;
  p.output_path = result->output->root;
  p.finished_at = evidence::Rfc3339Now();
  out.result = *std::move(result);
  return out;
}

}  // namespace ckpt::interop
