// The subjects of a directory tree as every ckpt-audit statement names them: each regular file's
// SHA-256 under its POSIX path, plus the OMS manifest ROOT under `oms-manifest-root`
// (core/audit SubjectsOf over a files-only fingerprint; docs/evidence.md §1).
#ifndef CKPT_CORE_INTEROP_TREE_SUBJECTS_H_
#define CKPT_CORE_INTEROP_TREE_SUBJECTS_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/record.h"
#include "core/progress.h"

namespace ckpt::interop {

absl::StatusOr<std::vector<evidence::Subject>> TreeSubjects(const std::string& root,
                                                            unsigned threads, Progress& progress);

// name -> sha256.
std::map<std::string, std::string> SubjectMap(const std::vector<evidence::Subject>& subjects);

// One line per difference between what a statement names (`stated`) and what is on disk
// ("changed: f", "missing on disk: f", "not stated: f"); empty when they are equal. A stated
// `oci-manifest` subject (evidence::kOciManifestSubject) names no file and is passed over when
// the disk has none of that name (a tree holding one has no subjects: CheckFileSubjectName).
std::vector<std::string> SubjectDifferences(const std::map<std::string, std::string>& stated,
                                            const std::map<std::string, std::string>& disk);

}  // namespace ckpt::interop

#endif  // CKPT_CORE_INTEROP_TREE_SUBJECTS_H_
