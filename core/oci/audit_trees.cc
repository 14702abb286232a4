#include "core/oci/audit_trees.h"

#include "core/oci/artifact.h"

namespace ckpt::oci {
namespace {

absl::Status Open(const std::string& text, uint64_t window, std::string* path,
                  std::shared_ptr<const io::Directory>* dir,
                  std::optional<audit::ReadBinding>* binding, std::string* ref) {
  ArtifactOptions options;
  options.tar_budget = window;
  auto artifact = Artifact::Open(text, options);
  if (!artifact.ok()) return artifact.status();
  const Artifact& a = **artifact;
  *dir = a.root();
  *path = a.reference().ToString();
  *binding = audit::ReadBinding{a.manifest_digest(), a.raw_files()};
  if (ref->empty()) *ref = a.reference().ToString();
  return absl::OkStatus();
}

}  // namespace

absl::Status OpenOciTrees(audit::AuditOptions* o) {
  if (IsOciReference(o->root)) {
    absl::Status s = Open(o->root, o->memory_window, &o->root, &o->root_dir, &o->root_binding,
                          &o->refs.model_ref);
    if (!s.ok()) return s;
  }
  if (IsOciReference(o->source)) {
    return Open(o->source, o->memory_window, &o->source, &o->source_dir, &o->source_binding,
                &o->refs.source_ref);
  }
  return absl::OkStatus();
}

}  // namespace ckpt::oci
