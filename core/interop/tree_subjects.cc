#include "core/interop/tree_subjects.h"

#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/fingerprint/fingerprint.h"

namespace ckpt::interop {

absl::StatusOr<std::vector<evidence::Subject>> TreeSubjects(const std::string& root,
                                                            unsigned threads, Progress& progress) {
  FingerprintOptions fo;
  fo.threads = threads;
  fo.tensor_digests = false;  // subjects are whole files and the OMS ROOT
  auto fp = FingerprintTree(root, fo, progress);
  if (!fp.ok()) return fp.status();
  return audit::SubjectsOf(*fp);
}

std::map<std::string, std::string> SubjectMap(const std::vector<evidence::Subject>& subjects) {
  std::map<std::string, std::string> out;
  for (const evidence::Subject& s : subjects) out[s.name] = s.sha256;
  return out;
}

std::vector<std::string> SubjectDifferences(const std::map<std::string, std::string>& stated,
                                            const std::map<std::string, std::string>& disk) {
  std::vector<std::string> out;
  for (const auto& [name, digest] : stated) {
    auto it = disk.find(name);
    // The manifest digest of an audit over oci:// is no file (a file of that name is compared).
    if (it == disk.end() && name == evidence::kOciManifestSubject) continue;
    if (it == disk.end()) {
      out.push_back(absl::StrCat("missing on disk: ", name));
    } else if (it->second != digest) {
      out.push_back(absl::StrCat("changed: ", name, " (stated ", digest, ", on disk ", it->second,
                                 ")"));
    }
  }
  for (const auto& [name, _] : disk) {
    if (!stated.count(name)) out.push_back(absl::StrCat("not stated: ", name));
  }
  return out;
}

}  // namespace ckpt::interop
