// Signing a model directory the way OpenSSF model signing (`model_signing sign key`) does, and
// verifying such signatures against the bytes on disk (docs/interop.md, "OMS signatures").
//
// Hashing: every regular file under the root in model_signing's `files` method with SHA-256
// (core/fingerprint, OMS files mode), minus the ignore paths: `.git`, `.gitattributes`,
// `.github`, `.gitignore`, the caller's paths (the signature file among them when it lies inside
// the root) and, when verifying, the paths the signed statement itself lists. Verification then
// compares the signed path -> (algorithm, digest) set with the one on disk exactly: a changed,
// added or removed file fails, naming it.
#ifndef CKPT_CORE_INTEROP_MODEL_SIGNATURE_H_
#define CKPT_CORE_INTEROP_MODEL_SIGNATURE_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/cert_chain.h"
#include "core/evidence/ecdsa.h"
#include "core/evidence/oms_bundle.h"
#include "core/progress.h"

namespace ckpt::interop {

struct ModelSigningOptions {
  std::vector<std::string> ignore_paths;  // relative to the root (RelativeIgnorePaths)
  unsigned threads = 0;                   // 0: all cores
};

// Paths as a user typed them (absolute, or relative to the working directory) made relative to
// `root`, as model_signing's CLI resolves --ignore-paths and the signature path; paths outside
// the root are dropped. Paths that do not exist are resolved lexically.
std::vector<std::string> RelativeIgnorePaths(const std::string& root,
                                             const std::vector<std::string>& paths);

// The OMS v1.0 statement of `root` (subject name: the root directory's name).
absl::StatusOr<evidence::OmsStatement> ModelStatement(const std::string& root,
                                                      const ModelSigningOptions& options,
                                                      Progress& progress);

// The Sigstore bundle text `model_signing sign key` would write for `root`.
absl::StatusOr<std::string> SignModel(const std::string& root, const evidence::EcdsaSigningKey& key,
                                      const ModelSigningOptions& options, Progress& progress);

// What a signature is checked against: a public key (key bundles) or trusted certificates
// (certificate-chain bundles).
struct ModelTrust {
  std::optional<evidence::EcdsaPublicKey> public_key;
  std::optional<evidence::CertificateTrust> certificates;
};

struct ModelSignatureCheck {
  std::optional<evidence::OmsError> failure;  // none: verified
  evidence::OmsStatement statement;           // once the signature verified
  std::string signer;                         // "key <hint>" or the certificate's subject
  std::vector<std::string> notes;             // e.g. an older bundle layout was accepted
  std::vector<std::string> differences;       // files-differ: one line per path
  bool ok() const { return !failure.has_value(); }
};

// Errors (a Status) only when the check cannot run: the root cannot be hashed (missing, a
// symlink or special file in it, a file changed while hashed) or no trust is given. Everything
// about the signature is in the result.
absl::StatusOr<ModelSignatureCheck> VerifyModelSignature(const std::string& root,
                                                         const std::string& bundle_text,
                                                         const ModelTrust& trust,
                                                         const ModelSigningOptions& options,
                                                         Progress& progress);

}  // namespace ckpt::interop

#endif  // CKPT_CORE_INTEROP_MODEL_SIGNATURE_H_
