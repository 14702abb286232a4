// A transcode that knows where its output came from: the source tree is read once, streamed
// (core/quant/transcode.h), and the transcode runs on those bytes, so the source digests the
// provenance names are the digests of exactly what was transcoded; the output digests are of
// the files the transcode wrote, and both become an SLSA Provenance v1 statement
// (core/evidence/provenance.h; docs/interop.md).
#ifndef CKPT_CORE_INTEROP_TRANSCODE_PROVENANCE_H_
#define CKPT_CORE_INTEROP_TRANSCODE_PROVENANCE_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/evidence/provenance.h"
#include "core/progress.h"
#include "core/quant/transcode.h"

namespace ckpt::interop {

struct ProvenancedTranscode {
  quant::TranscodeResult result;
  evidence::TranscodeProvenance provenance;  // unsigned
};

// Errors as quant::TranscodeToNvfp4 (FAILED_PRECONDITION: the policy refused the source, or the
// destination is locked or its temporary directory refused; DATA_LOSS: a source file changed
// while it was read, or an output write failed; RESOURCE_EXHAUSTED: one unit of the source does
// not fit the memory window).
absl::StatusOr<ProvenancedTranscode> TranscodeWithProvenance(const std::string& source,
                                                             const std::string& output,
                                                             const quant::TranscodeOptions& options,
                                                             const std::string& source_ref,
                                                             Progress& progress);

// Where `transcode` writes the signed statement: beside the output directory, as
// "<output>.intoto.jsonl" (outside the tree, so it is not one of its own subjects).
std::string DefaultProvenancePath(const std::string& output);

}  // namespace ckpt::interop

#endif  // CKPT_CORE_INTEROP_TRANSCODE_PROVENANCE_H_
