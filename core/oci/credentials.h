// Registry credentials from the Docker config file (docs/interop.md, "Authentication and
// transport"), found as Docker finds them: `credHelpers[REGISTRY]`, else `credsStore`, else
// `auths[REGISTRY].auth`. A helper NAME is run as `docker-credential-NAME get` (looked up on
// PATH and executed directly, never through a shell), with the registry on its standard input;
// it answers `{"Username": ..., "Secret": ...}` on its standard output. The username `<token>`
// means the secret is an identity token (an OAuth2 refresh token for the registry's token
// endpoint), not a password.
//
// Errors name the helper and the registry, and never quote what the helper printed (it may be a
// secret): a NAME that is not a plain token (letters, digits, '.', '_', '-'; so never a path) is
// INVALID_ARGUMENT; a helper not on PATH FAILED_PRECONDITION; one that does not answer within
// the timeout DEADLINE_EXCEEDED (it is killed); one that prints more than 64 KiB
// RESOURCE_EXHAUSTED (killed too); a non-zero exit UNAUTHENTICATED, except that Docker's
// "credentials not found in native keychain" means no credentials; an answer that is not that
// JSON INVALID_ARGUMENT.
#ifndef CKPT_CORE_OCI_CREDENTIALS_H_
#define CKPT_CORE_OCI_CREDENTIALS_H_

#include <string>

#include "absl/status/statusor.h"

namespace ckpt::oci {

struct RegistryCredentials {
  std::string basic;           // base64 of user:password, or empty
  std::string identity_token;  // a refresh token (the helper's `<token>` answer), or empty
  bool empty() const { return basic.empty() && identity_token.empty(); }
};

// The credentials for `registry` (host[:port]) from the Docker config file at `config_path`
// (a missing file: none), running a helper for at most `helper_timeout_ms`.
absl::StatusOr<RegistryCredentials> DockerCredentials(const std::string& registry,
                                                      const std::string& config_path,
                                                      long helper_timeout_ms);

}  // namespace ckpt::oci

#endif  // CKPT_CORE_OCI_CREDENTIALS_H_
