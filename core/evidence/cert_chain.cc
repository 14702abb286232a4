#include "core/evidence/cert_chain.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <ctime>
#include <memory>

#include "absl/strings/str_cat.h"

namespace ckpt::evidence {
namespace {

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

std::string OneLine(const X509_NAME* name) {
  char buf[512];
  X509_NAME_oneline(name, buf, sizeof buf);
  return buf;
}

absl::StatusOr<X509Ptr> FromDer(const std::vector<uint8_t>& der, size_t index) {
  const unsigned char* p = der.data();
  X509Ptr cert(d2i_X509(nullptr, &p, static_cast<long>(der.size())));
  if (cert == nullptr || p != der.data() + der.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bundle certificate ", index, " is not one DER X.509 certificate"));
  }
  return cert;
}

// Upstream's rule: KeyUsage must be present; digitalSignature, or else codeSigning in EKU.
absl::Status CheckMaySign(X509* leaf, const std::string& subject) {
  uint32_t flags = X509_get_extension_flags(leaf);
  if ((flags & EXFLAG_KUSAGE) == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("signing certificate ", subject, " has no KeyUsage extension"));
  }
  if ((X509_get_key_usage(leaf) & KU_DIGITAL_SIGNATURE) != 0) return absl::OkStatus();
  if ((flags & EXFLAG_XKUSAGE) != 0 && (X509_get_extended_key_usage(leaf) & XKU_CODE_SIGN) != 0) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "signing certificate ", subject,
      " may not sign: KeyUsage lacks digitalSignature and ExtendedKeyUsage lacks codeSigning"));
}

}  // namespace

struct CertificateTrust::Store {
  Store() : store(X509_STORE_new()) {}
  ~Store() { X509_STORE_free(store); }
  X509_STORE* store;
};

absl::StatusOr<CertificateTrust> CertificateTrust::FromPem(
    const std::vector<std::string>& pem_texts) {
  auto store = std::make_shared<Store>();
  size_t trusted = 0;
  for (const std::string& text : pem_texts) {
    std::unique_ptr<BIO, decltype(&BIO_free)> bio(
        BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), BIO_free);
    while (X509* cert = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
      X509_STORE_add_cert(store->store, cert);  // the store takes its own reference
      X509_free(cert);
      ++trusted;
    }
    ERR_clear_error();  // the loop ends on "no start line"
  }
  if (trusted == 0) {
    return absl::InvalidArgumentError("the trusted certificate files hold no PEM certificate");
  }
  return CertificateTrust(std::move(store), trusted);
}

absl::StatusOr<SigningCertificate> CertificateTrust::VerifySigningCertificate(
    const std::vector<std::vector<uint8_t>>& chain_der) const {
  if (chain_der.empty()) {
    return absl::InvalidArgumentError("bundle has an empty certificate chain");
  }
  auto leaf = FromDer(chain_der[0], 0);
  if (!leaf.ok()) return leaf.status();
  std::unique_ptr<STACK_OF(X509), void (*)(STACK_OF(X509)*)> untrusted(
      sk_X509_new_null(), [](STACK_OF(X509)* s) { sk_X509_pop_free(s, X509_free); });
  for (size_t i = 1; i < chain_der.size(); ++i) {
    auto cert = FromDer(chain_der[i], i);
    if (!cert.ok()) return cert.status();
    sk_X509_push(untrusted.get(), cert->release());
  }
  std::string subject = OneLine(X509_get_subject_name(leaf->get()));
  std::string issuer = OneLine(X509_get_issuer_name(leaf->get()));

  struct tm not_before {};
  if (ASN1_TIME_to_tm(X509_get0_notBefore(leaf->get()), &not_before) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("signing certificate ", subject, ": unreadable notBefore"));
  }
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(),
                                                                      X509_STORE_CTX_free);
  if (X509_STORE_CTX_init(ctx.get(), store_->store, leaf->get(), untrusted.get()) != 1) {
    return absl::InternalError("X509_STORE_CTX_init failed");
  }
  X509_STORE_CTX_set_time(ctx.get(), 0, timegm(&not_before));
  if (X509_verify_cert(ctx.get()) != 1) {
    int err = X509_STORE_CTX_get_error(ctx.get());
    ERR_clear_error();
    return absl::FailedPreconditionError(
        absl::StrCat("certificate chain of ", subject, " does not verify: ",
                     X509_verify_cert_error_string(err), " (depth ",
                     X509_STORE_CTX_get_error_depth(ctx.get()), ")"));
  }
  if (auto s = CheckMaySign(leaf->get(), subject); !s.ok()) return s;

  unsigned char* der = nullptr;
  int len = i2d_PUBKEY(X509_get0_pubkey(leaf->get()), &der);
  if (len <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("signing certificate ", subject, ": unreadable public key"));
  }
  auto key = EcdsaPublicKey::FromDer({der, static_cast<size_t>(len)});
  OPENSSL_free(der);
  if (!key.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("signing certificate ", subject, ": ", key.status().message()));
  }
  return SigningCertificate{*std::move(key), subject, issuer};
}

}  // namespace ckpt::evidence
