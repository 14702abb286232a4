// OpenSSF model signing (OMS v1.0) signatures as model_signing v1.x writes them for `sign key`
// and `sign certificate`: a Sigstore bundle v0.3 JSON document holding a DSSE envelope over the
// single-subject OMS in-toto statement (docs/interop.md, "OMS signatures").
//
//   {"mediaType":"application/vnd.dev.sigstore.bundle.v0.3+json",
//    "verificationMaterial":{"publicKey":{"hint":HEX},"tlogEntries":[]},
//    "dsseEnvelope":{"payload":B64,"payloadType":"application/vnd.in-toto+json",
//                    "signatures":[{"sig":B64(DER ECDSA over PAE),"keyid":""}]}}
//
// Parsing is strict like upstream's (unknown fields are errors). Keyless Sigstore bundles
// (a Fulcio `certificate` plus Rekor entries) and message signatures are recognized and refused
// as unsupported: verifying them needs Sigstore's trust roots, which this tool does not carry.
// Nothing here touches the file system; core/interop/model_signature.h hashes the model.
#ifndef CKPT_CORE_EVIDENCE_OMS_BUNDLE_H_
#define CKPT_CORE_EVIDENCE_OMS_BUNDLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/ecdsa.h"

namespace ckpt::evidence {

inline constexpr char kSigstoreBundleV03MediaType[] =
    "application/vnd.dev.sigstore.bundle.v0.3+json";
inline constexpr char kOmsPredicateType[] = "https://model_signing/signature/v1.0";

// Why an OMS signature did not verify. The names are stable: the CLI prints them and tests
// assert them.
enum class OmsReason {
  kMalformedBundle,     // not a well-formed bundle (syntax, missing/unknown/mistyped field)
  kUnsupportedBundle,   // well-formed but of a kind this tool cannot check (keyless, shards)
  kKeyMismatch,         // the bundle's public-key hint names a different key
  kCertificateInvalid,  // the certificate chain does not verify or may not sign
  kSignatureInvalid,    // the DSSE signature does not verify
  kStatementInvalid,    // signed, but not a consistent OMS v1.0 statement
  kFilesDiffer,         // the model on disk is not what was signed
};
std::string OmsReasonName(OmsReason reason);  // "malformed-bundle", "key-mismatch", ...

struct OmsResourceEntry {
  std::string name;       // files method: POSIX path relative to the model root
  std::string algorithm;  // "sha256"
  std::string digest;     // lowercase hex
};

struct OmsStatement {
  std::string model_name;   // the subject name: the model directory's name (informative)
  std::string root_sha256;  // the subject digest: SHA-256 over the raw resource digests
  std::string method = "files";
  std::string hash_type = "sha256";
  bool allow_symlinks = false;
  std::optional<std::vector<std::string>> ignore_paths;  // absent in pre-1.1 signatures
  std::optional<uint64_t> shard_size;                     // shards method only
  std::vector<OmsResourceEntry> resources;                // in signed order
};

// The statement's bytes in model_signing's layout: indented by two spaces, keys in the order of
// its v1.1 output, non-ASCII escaped. root_sha256 is written as given.
std::string OmsStatementPayload(const OmsStatement& statement);

// SHA-256 over the resources' raw digests in order (hex). INVALID_ARGUMENT for a digest that is
// not 64 hex characters.
absl::StatusOr<std::string> OmsRootOf(const std::vector<OmsResourceEntry>& resources);

struct OmsBundle {
  enum class Material { kPublicKey, kCertificateChain };
  Material material = Material::kPublicKey;
  std::string key_hint;             // empty when the bundle has none
  bool legacy_public_key = false;   // pre-1.1 layout: rawBytes/keyDetails instead of a hint
  std::vector<std::vector<uint8_t>> certificates;  // DER, signing certificate first
  std::string payload;              // decoded DSSE payload bytes
  std::string payload_type;
  std::vector<uint8_t> signature;   // decoded DER signature
};

struct OmsError {
  OmsReason reason;
  std::string detail;
};

// Parses a bundle file's text. Failures are kMalformedBundle or kUnsupportedBundle.
std::optional<OmsError> ParseOmsBundle(const std::string& text, OmsBundle* out);

// The bundle text model_signing `sign key` writes, for `payload` signed by `key`.
absl::StatusOr<std::string> SignOmsKeyBundle(const std::string& payload,
                                             const EcdsaSigningKey& key);
// The same layout from parts (the golden test rebuilds an upstream bundle byte for byte).
std::string OmsKeyBundleJson(const std::string& payload, const std::vector<uint8_t>& signature,
                             const std::string& key_hint);

// Checks the signature of `bundle` with `key` and returns the signed statement. For key bundles
// a non-empty hint must equal key.Hint(). Failures: kKeyMismatch, kSignatureInvalid,
// kStatementInvalid (wrong payload type, statement type or predicate type, not one subject,
// ROOT inconsistent with the resources, duplicate resource names, malformed fields).
std::optional<OmsError> OpenOmsBundle(const OmsBundle& bundle, const EcdsaPublicKey& key,
                                      OmsStatement* statement);

// Parses a signed statement (as OpenOmsBundle does after the signature check).
std::optional<OmsError> ParseOmsStatement(const std::string& payload, OmsStatement* out);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_OMS_BUNDLE_H_
