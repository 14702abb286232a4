// An OCI artifact reference as the CLI takes it (docs/interop.md, "OCI registries"):
// `oci://REGISTRY/REPO@sha256:HEX` or `oci://REGISTRY/REPO:TAG`. A tag is resolved to a digest
// when the manifest is fetched, and only the digest is recorded.
#ifndef CKPT_CORE_OCI_REFERENCE_H_
#define CKPT_CORE_OCI_REFERENCE_H_

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"

namespace ckpt::oci {

inline constexpr char kScheme[] = "oci://";

struct Reference {
  std::string registry;    // host[:port], as given (lower case)
  std::string repository;  // path components of [a-z0-9._-], separated by '/'
  std::string tag;         // empty when `digest` was given
  std::string digest;      // "sha256:<64 lowercase hex>", or empty for a tag

  // True for localhost, 127.0.0.1 and [::1] (any port): the only registries spoken to over
  // plain HTTP, as Docker treats them.
  bool Loopback() const;
  // oci://REGISTRY/REPO@DIGEST (or :TAG when no digest is known).
  std::string ToString() const;
  // The same artifact named by `digest`.
  Reference ByDigest(const std::string& digest) const;
};

bool IsOciReference(absl::string_view text);

// INVALID_ARGUMENT naming the text and the rule it breaks (no registry, an upper-case or empty
// repository component, a tag of other characters or over 128, a digest that is not sha256
// with 64 lowercase hex digits).
absl::StatusOr<Reference> ParseReference(absl::string_view text);

// A registry named alone (ckpt-auditd --allow-registry): host[:port], lower-cased as
// ParseReference lower-cases a reference's; INVALID_ARGUMENT naming the text otherwise.
absl::StatusOr<std::string> ParseRegistry(absl::string_view text);

// "sha256:<hex>" of `bytes`.
std::string DigestOf(absl::string_view bytes);
// INVALID_ARGUMENT unless `digest` is "sha256:" and 64 lowercase hex digits.
absl::Status CheckDigest(absl::string_view digest, absl::string_view what);

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_REFERENCE_H_
