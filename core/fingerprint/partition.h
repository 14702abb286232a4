// Splitting one fingerprint across machines (a Kubernetes Indexed Job, deploy/k8s/) and merging
// the parts back into the fingerprint a single run would have produced.
//
// Files are assigned largest first to the least-loaded part (ties to the lowest index), so
// every worker computes the same assignment from the same tree listing and the parts carry
// similar byte counts. Whole-file digests are sequential per file, so a file is never split.
// Parts use the OMS files mode; their JSON is FingerprintToJson's, plus {"part": {index, count}}.
#ifndef CKPT_CORE_FINGERPRINT_PARTITION_H_
#define CKPT_CORE_FINGERPRINT_PARTITION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/fingerprint/fingerprint.h"
#include "nlohmann/json.hpp"

namespace ckpt {

// The part (0..count-1) of each of `sizes`: largest first to the least-loaded part (ties to the
// lowest index, a stable sort), the same on every machine. An audit split in parts assigns
// groups of files by it (core/audit/parts.h).
std::vector<unsigned> AssignLargestFirst(const std::vector<uint64_t>& sizes, unsigned count);

// The files of `tree` that part `spec` hashes, in the tree's order.
std::vector<TreeFile> FilesOfPart(const std::vector<TreeFile>& tree, const PartSpec& spec);

// `fingerprint --json` output; with `part`, the part it covers.
nlohmann::json FingerprintToJson(const Fingerprint& fp, const PartSpec* part = nullptr);

// Merges part JSON documents of the tree at `root` (listed again here, not hashed). Errors
// (INVALID_ARGUMENT) name the part and file: parts of different roots or counts, a missing or
// repeated part index, a file missing from every part or in two, a size that differs from the
// tree, a part that is not files mode. The digests themselves are taken from the parts.
absl::StatusOr<Fingerprint> MergeFingerprintParts(const std::string& root,
                                                  const std::vector<nlohmann::json>& parts,
                                                  const TreeWalkOptions& walk = {});

}  // namespace ckpt

#endif  // CKPT_CORE_FINGERPRINT_PARTITION_H_
