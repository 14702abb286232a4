// A client of the OCI distribution API (docs/interop.md, "OCI registries"), over libcurl.
//
// One Registry speaks to one repository of one registry, from any number of threads at once
// (each request takes an idle curl handle of its own). HTTPS with verified certificates, except
// for loopback registries (localhost, 127.0.0.1, [::1]), which are spoken to over plain HTTP as
// Docker does. Credentials come from the Docker config file as Docker finds them (a credential
// helper, else `auths`; core/oci/credentials.h); a 401 answer with a Bearer challenge is
// answered by fetching a token from the challenge's realm (with those credentials, or an
// identity token as an OAuth2 refresh token, when there are any) and retrying once.
//
// Every answer is bounded: headers (64 KiB a response), error bodies (kept up to 4 KiB for the
// message), manifests (ClientOptions::max_manifest), tokens (1 MiB); blob bytes go straight to
// the caller's buffer or sink and must be exactly the descriptor's size. Named errors:
//   UNAUTHENTICATED  401 without a usable challenge or credentials, or 401 again after a token
//   PERMISSION_DENIED 403
//   RESOURCE_EXHAUSTED 429 (never retried; the message names the registry and Retry-After)
//   NOT_FOUND        404
//   DATA_LOSS        a blob longer or shorter than its descriptor, or bytes whose digest is not
//                    the one asked for (manifests; blobs read whole)
//   UNAVAILABLE      transport errors, 5xx, more than 5 redirects
//   ABORTED          a manifest PUT answered 400 naming BLOB_UNKNOWN, MANIFEST_BLOB_UNKNOWN or
//                    DIGEST_INVALID: a referenced blob is missing, or (Debian's docker-registry)
//                    another client's upload of it is rewriting its link; a caller that pushed
//                    the blobs itself may push what is missing and try again
//   FAILED_PRECONDITION a redirect from HTTPS to plain HTTP off loopback; a registry that
//                    ignores a Range request
// A redirect keeps the Authorization header only when it stays on the registry's own scheme,
// host and port: blob downloads redirected to storage elsewhere are followed without it.
#ifndef CKPT_CORE_OCI_REGISTRY_H_
#define CKPT_CORE_OCI_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/oci/reference.h"

namespace ckpt::oci {

inline constexpr char kOciManifest[] = "application/vnd.oci.image.manifest.v1+json";
inline constexpr char kOciIndex[] = "application/vnd.oci.image.index.v1+json";
inline constexpr char kDockerManifest[] = "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr char kDockerManifestList[] =
    "application/vnd.docker.distribution.manifest.list.v2+json";

struct ClientOptions {
  // The Docker config file; empty: $DOCKER_CONFIG/config.json, else ~/.docker/config.json (a
  // missing file means no credentials).
  std::string docker_config;
  uint64_t max_manifest = 4u << 20;
  long connect_timeout_s = 30;
  long low_speed_timeout_s = 60;  // a transfer slower than 1 byte/s for this long fails
  std::string ca_file;            // extra CA bundle (tests); empty: the system's
  long credential_helper_timeout_ms = 30000;  // a docker-credential-NAME that answers later
                                              // is killed (DEADLINE_EXCEEDED)
};

struct FetchedManifest {
  std::string digest;      // sha256 of `bytes`, equal to the digest asked for when one was
  std::string media_type;  // the answer's Content-Type
  std::string bytes;
};

// Bytes of a blob as they arrive, in order; an error stops the transfer and is returned.
using BlobSink = std::function<absl::Status(std::span<const uint8_t> bytes)>;

class Registry {
 public:
  static absl::StatusOr<std::shared_ptr<Registry>> Connect(const Reference& ref,
                                                           const ClientOptions& options = {});
  ~Registry();

  const Reference& reference() const { return ref_; }

  // GET /v2/REPO/manifests/(tag or digest) accepting OCI and Docker v2 manifests and indexes.
  // By digest, the bytes must hash to it (DATA_LOSS otherwise); by tag, the digest is computed
  // from the bytes (and must equal Docker-Content-Digest when the registry sends one).
  absl::StatusOr<FetchedManifest> GetManifest(const std::string& tag_or_digest) const;

  // [offset, offset + out.size()) of blob `digest` whose descriptor says `size` bytes, by an HTTP
  // Range request; the answer's total must be `size` (DATA_LOSS naming both otherwise).
  absl::Status ReadBlobRange(const std::string& digest, uint64_t size, uint64_t offset,
                             std::span<uint8_t> out) const;
  // The whole blob, in order, to `sink`; exactly `size` bytes whose SHA-256 is `digest`.
  absl::Status ReadBlob(const std::string& digest, uint64_t size, const BlobSink& sink) const;

  // Upload (what pushing a model or attaching a statement needs): a blob in one monolithic
  // POST + PUT (skipped when a HEAD of it answers 200; a HEAD answered 5xx is UNAVAILABLE),
  // and a manifest under a tag or its digest. Returns the manifest's digest; `oci_subject`
  // (when given) receives the answer's OCI-Subject header, which a registry with the referrers
  // API sends for a manifest with a subject (empty: the registry has none; docs/interop.md
  // "Attaching verdicts").
  absl::Status PushBlob(absl::string_view bytes) const;
  absl::StatusOr<std::string> PushManifest(const std::string& tag_or_digest,
                                           const std::string& media_type,
                                           absl::string_view bytes,
                                           std::string* oci_subject = nullptr) const;

  // GET /v2/REPO/referrers/DIGEST: the image index of the manifests whose subject is `digest`
  // (OCI distribution 1.1). NOT_FOUND when the registry has no referrers API.
  absl::StatusOr<FetchedManifest> GetReferrers(const std::string& digest) const;

 private:
  struct Impl;
  Registry(Reference ref, std::unique_ptr<Impl> impl);
  Reference ref_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_REGISTRY_H_
