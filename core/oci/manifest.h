// OCI image manifests and Docker v2 schema 2 manifests, as typed values (docs/interop.md,
// "OCI registries"). JSON only here, at the edge.
#ifndef CKPT_CORE_OCI_MANIFEST_H_
#define CKPT_CORE_OCI_MANIFEST_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::oci {

struct Descriptor {
  std::string media_type;
  std::string digest;  // sha256:<hex>
  uint64_t size = 0;
  std::string artifact_type;  // empty unless given
  std::map<std::string, std::string> annotations;
};

struct Manifest {
  std::string media_type;     // kOciManifest or kDockerManifest (core/oci/registry.h)
  std::string artifact_type;  // empty unless given
  Descriptor config;
  std::vector<Descriptor> layers;
  std::optional<Descriptor> subject;
  std::map<std::string, std::string> annotations;
};

// The manifest in `bytes` (served with `content_type`, which may be empty). An image index or
// Docker manifest list is FAILED_PRECONDITION: ckpt-audit never picks a platform, so name one
// manifest of the index by its digest. Anything else that is not an image manifest, a
// descriptor without a sha256 digest or a size, and a schemaVersion other than 2 are
// INVALID_ARGUMENT naming `label`.
absl::StatusOr<Manifest> ParseManifest(absl::string_view bytes, absl::string_view content_type,
                                       const std::string& label);

// The JSON bytes of `m` (what a push uploads).
std::string ManifestBytes(const Manifest& m);

// The `manifests` of an OCI image index (what the referrers API and the referrers tag schema
// answer, docs/interop.md "Attaching verdicts"); INVALID_ARGUMENT naming `label` otherwise.
absl::StatusOr<std::vector<Descriptor>> ParseIndex(absl::string_view bytes,
                                                   const std::string& label);
// The JSON bytes of an OCI image index listing `manifests`.
std::string IndexBytes(const std::vector<Descriptor>& manifests);

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_MANIFEST_H_
