// The X.509 check of an OMS certificate-signed bundle, made as model_signing's `verify
// certificate` makes it (docs/interop.md): OpenSSL X509_STORE holding the certificates the user
// trusts; the bundle's first certificate is the signing certificate and the rest are untrusted
// intermediates; the chain is validated at the signing certificate's notBefore time (so a chain
// that has since expired still verifies, as upstream); then the signing certificate must carry a
// KeyUsage extension allowing digitalSignature, or else an ExtendedKeyUsage with codeSigning.
// Its public key must be ECDSA P-256/P-384/P-521.
#ifndef CKPT_CORE_EVIDENCE_CERT_CHAIN_H_
#define CKPT_CORE_EVIDENCE_CERT_CHAIN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/ecdsa.h"

namespace ckpt::evidence {

struct SigningCertificate {
  EcdsaPublicKey key;
  std::string subject;  // one-line distinguished names, for messages
  std::string issuer;
};

// The certificates a user trusts (`--certificate-chain` files). Immutable, shareable.
class CertificateTrust {
 public:
  // The text of each trusted file; each may hold several PEM certificates. INVALID_ARGUMENT
  // when they hold none.
  static absl::StatusOr<CertificateTrust> FromPem(const std::vector<std::string>& pem_texts);

  // `chain_der`: a bundle's certificates, signing certificate first. Errors: INVALID_ARGUMENT
  // (a certificate is not DER), FAILED_PRECONDITION (the chain does not verify, or the
  // certificate may not sign, or its key is not ECDSA P-256/384/521; the message names
  // OpenSSL's reason and the subject).
  absl::StatusOr<SigningCertificate> VerifySigningCertificate(
      const std::vector<std::vector<uint8_t>>& chain_der) const;

  size_t size() const { return count_; }

 private:
  struct Store;
  CertificateTrust(std::shared_ptr<Store> store, size_t count)
      : store_(std::move(store)), count_(count) {}
  std::shared_ptr<Store> store_;
  size_t count_;
};

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_CERT_CHAIN_H_
