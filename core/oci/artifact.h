// An OCI artifact read as a checkpoint tree (docs/interop.md, "OCI registries"): the layers of
// one manifest become the files of an io::Directory, so the audit engine reads them exactly as
// it reads a directory on disk (docs/audit-engine.md, "The file-system seam").
//
// - Raw layers (ModelPack `application/vnd.cncf.model.*.v1.raw`) are one file each, named by
//   the `org.cncf.model.filepath` annotation (else `org.opencontainers.image.title`), and read
//   by position with HTTP Range requests, so the engine's planner, read-ahead and window work
//   unchanged; reads moving forward are served from a buffer that one larger Range request
//   fills (bounded by ArtifactOptions::read_ahead_budget). The engine hashes every file front
//   to back from the bytes it read; the audit then requires that hash to equal the layer's
//   digest (raw_files(), core/audit ReadBinding), so verdicts and digests are of the
//   manifest's bytes.
// - Tar layers (ModelPack `...v1.tar`, `+gzip`, `+zstd`, and OCI image layers
//   `application/vnd.oci.image.layer.v1.tar`, `+gzip`, `+zstd`) are read front to back once,
//   when the artifact is opened: their digest and length are checked from the bytes read
//   before any of their files is served, and their files are kept in memory within a budget
//   (RESOURCE_EXHAUSTED naming --memory-window when they do not fit).
// Two layers naming the same file, a file that is also a directory, an unknown layer media
// type and a raw layer without a name are INVALID_ARGUMENT naming the layer.
#ifndef CKPT_CORE_OCI_ARTIFACT_H_
#define CKPT_CORE_OCI_ARTIFACT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/io/file_system.h"
#include "core/oci/manifest.h"
#include "core/oci/reference.h"
#include "core/oci/registry.h"

namespace ckpt::oci {

inline constexpr char kModelFilepathAnnotation[] = "org.cncf.model.filepath";
inline constexpr char kTitleAnnotation[] = "org.opencontainers.image.title";

struct ArtifactOptions {
  ClientOptions client;
  uint64_t tar_budget = 1536ull << 20;  // bytes of tar layers' files kept in memory
  // Bytes of raw layers fetched ahead of the engine's reads, for all open files together (each
  // holds at most 16 MiB of it); 0: every read is a Range request of its own.
  uint64_t read_ahead_budget = 64ull << 20;
};

class Artifact {
 public:
  // `text` is an oci:// reference (a tag is resolved to its digest here). Errors: those of
  // ParseReference, Registry (auth, 401, 429, redirects, DATA_LOSS for a manifest whose bytes
  // do not hash to the digest asked for) and ParseManifest, and the layer errors above.
  static absl::StatusOr<std::shared_ptr<const Artifact>> Open(const std::string& text,
                                                              const ArtifactOptions& options);

  const Reference& reference() const { return ref_; }  // by digest
  const std::string& manifest_digest() const { return ref_.digest; }
  const Manifest& manifest() const { return manifest_; }
  std::shared_ptr<const io::Directory> root() const { return root_; }
  // Raw layers by file name (the name encoding of core/text/name_encoding.h) -> the hex SHA-256
  // of their layer digest: what the engine's hash of the bytes it read must equal.
  const std::map<std::string, std::string>& raw_files() const { return raw_files_; }

 private:
  Reference ref_;
  Manifest manifest_;
  std::shared_ptr<const io::Directory> root_;
  std::map<std::string, std::string> raw_files_;
};

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_ARTIFACT_H_
