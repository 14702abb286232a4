// Weight files that no check reads (docs/audit-engine.md, "Weights no check reads").
//
// A checkpoint's checks read the shards its layout names (core/checkpoint.h). Every other file
// of the tree that looks like weights is listed here, so that a signed pass never covers weights
// nobody checked: a file that a common loader (transformers, vLLM, SGLang) reads by default from
// the root fails the audit; any other (a subfolder such as gpt-oss's `original/`, training
// state, an X4T container A sidecar beside an index) is listed without failing. Hashing a file
// (the fingerprint) does not count as checking it.
#ifndef CKPT_CORE_AUDIT_WEIGHT_FILES_H_
#define CKPT_CORE_AUDIT_WEIGHT_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/evidence/check_result.h"

namespace ckpt::audit {

struct UncheckedWeightFile {
  std::string name;  // the recorded name (core/text/name_encoding.h)
  uint64_t bytes = 0;
  // "unindexed-weights-file": a *.safetensors at the root that the layout does not name;
  // "unsupported-weights-file": weights at the root in a format the checks do not read
  // (pytorch_model.bin, *.pt, *.gguf, ...); both are read by a loader by default, so they fail.
  // "unchecked-weights-file": anything else weight-like; listed, does not fail.
  std::string code;
  bool fails = false;
  std::string reason;  // who would load it, or why it is only listed
};

// In the tree's path order.
std::vector<UncheckedWeightFile> UncheckedWeightFiles(const Checkpoint& ckpt);

// Adds one finding per file (code, path, bytes, fails) to `check`, counts them
// ("unchecked_weight_files") and fails it when any finding fails. Adds nothing for none.
void AddUncheckedWeightFiles(const Checkpoint& ckpt, evidence::CheckResult* check);

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_WEIGHT_FILES_H_
