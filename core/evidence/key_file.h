// Private key files, for every signing key type (Ed25519 records, ECDSA OMS bundles): reading a
// PEM with the file checks a secret deserves, writing one that is never readable by others, and
// the PEM text of an OpenSSL key.
#ifndef CKPT_CORE_EVIDENCE_KEY_FILE_H_
#define CKPT_CORE_EVIDENCE_KEY_FILE_H_

#include <openssl/evp.h>

#include <string>

#include "absl/status/statusor.h"

namespace ckpt::evidence {

// The PEM text of the private key file at `path`. The file is opened once and checked through
// that descriptor (a link to it is followed, as Kubernetes secret mounts need): it must be a
// regular file of at most 1 MiB that neither group nor others can access (core/io/small_file.h).
// NOT_FOUND, FAILED_PRECONDITION (mode), INVALID_ARGUMENT (not a regular file, too large).
absl::StatusOr<std::string> ReadPrivateKeyFile(const std::string& path);

// Writes `pem` to a new file at `path`, created with mode 0600 (O_EXCL: never visible with wider
// permissions, and an existing key is never overwritten: ALREADY_EXISTS), then fsyncs it.
absl::Status WritePrivateKeyFile(const std::string& path, const std::string& pem);

// PKCS#8 PEM of a private key; PEM of a public key (SubjectPublicKeyInfo).
std::string PrivateKeyPem(EVP_PKEY* pkey);
std::string PublicKeyPem(EVP_PKEY* pkey);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_KEY_FILE_H_
