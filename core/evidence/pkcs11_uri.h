// PKCS#11 URIs (RFC 7512) naming a key on a token: `pkcs11:token=NAME;object=LABEL` or
// `...;id=%01%02`, as `--key` takes them (docs/evidence.md, "Keys in an HSM").
//
// Parsing is strict: every attribute this tool matches may appear once; an attribute it does not
// match (library-*, slot-*, vendor `x-` attributes, any other name) is refused rather than
// ignored, because a key selected without it may not be the key the URI meant. `pin-value` is
// refused because a URI lands in argv, shell history and logs (the PIN comes from --pin-file or
// --pin-env); `pin-source`, `module-name` and `module-path` are refused because the module and
// the PIN are named by their own flags, never by a URI an attacker might supply.
#ifndef CKPT_CORE_EVIDENCE_PKCS11_URI_H_
#define CKPT_CORE_EVIDENCE_PKCS11_URI_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace ckpt::evidence {

inline constexpr char kPkcs11UriScheme[] = "pkcs11:";

struct Pkcs11Uri {
  // Token attributes (CK_TOKEN_INFO, compared without the fields' trailing blank padding).
  std::optional<std::string> token;         // label
  std::optional<std::string> manufacturer;  // manufacturerID
  std::optional<std::string> model;
  std::optional<std::string> serial;        // serialNumber
  // Object attributes.
  std::optional<std::string> object;        // CKA_LABEL
  std::optional<std::vector<uint8_t>> id;   // CKA_ID
  std::optional<std::string> type;          // "private" (the key pair: "public" is refused)
};

inline bool IsPkcs11Uri(absl::string_view key) { return absl::StartsWith(key, kPkcs11UriScheme); }

// INVALID_ARGUMENT naming the reason: not a pkcs11: URI, a malformed percent escape or character,
// an empty or repeated attribute, a refused attribute (see above), a type other than private, or
// a URI that names no object (neither object= nor id=).
absl::StatusOr<Pkcs11Uri> ParsePkcs11Uri(absl::string_view uri);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_PKCS11_URI_H_
