// Who may call what on ckpt-auditd (docs/daemon.md, "Authentication and roles"): the four
// roles, the table of which AuditService method needs which role, the token file (one SHA-256
// hash, role and name per line; the tokens themselves are never stored), and the authenticator
// that turns a call's bearer token and client certificate into a Caller.
//
// No gRPC in here: grpc_service.cc extracts the `authorization` metadata and the verified
// client certificate subject from the call and hands them over. Everything is immutable after
// loading, so one Authenticator is shared by all RPC threads.
#ifndef CKPT_SERVICES_DAEMON_AUTH_H_
#define CKPT_SERVICES_DAEMON_AUTH_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::daemon {

// reader: queries, records, proofs, jobs. auditor: reader + StartAudit, CancelJob.
// gate: reader + Gate. admin: everything, including VerifyLog.
enum class Role { kReader, kAuditor, kGate, kAdmin };
absl::string_view RoleName(Role role);
absl::StatusOr<Role> ParseRole(absl::string_view name);
// Whether a caller holding `held` may call a method that needs `needed`.
bool RoleGrants(Role held, Role needed);

// The role a method needs, by full gRPC method name ("/package.Service/Method"). nullopt for the
// methods anyone may call without a token (grpc.health.v1 and server reflection); a method not
// in the table needs admin, so a method added later is closed until someone decides otherwise.
std::optional<Role> RequiredRole(absl::string_view full_method);

// Whether `full_method` is one of the public methods or an AuditService method in the table.
bool IsKnownMethod(absl::string_view full_method);

// The AuditService methods the table names (tests check it against the proto's descriptor).
std::vector<std::string> AuditServiceMethodsInTable();

// Token names: 1-64 characters of [A-Za-z0-9._@-], so they are safe in logs and records.
bool IsValidTokenName(absl::string_view name);

struct TokenEntry {
  std::array<uint8_t, 32> hash{};  // SHA-256 of the token text
  Role role = Role::kReader;
  std::string name;
};

// A new random token: "ckpt_" followed by 64 hex digits (256 bits from RAND_bytes).
absl::StatusOr<std::string> NewToken();
// The token-file line for `token` (no newline): "sha256:<hex> <role> <name>".
std::string TokenLine(absl::string_view token, Role role, absl::string_view name);

class TokenStore {
 public:
  // Reads a token file. FAILED_PRECONDITION when the file is writable by group or others or owned
  // by a user other than root or this process's (anyone who can write it can mint an admin
  // token), or is not a regular file; INVALID_ARGUMENT naming
  // the line for a malformed line, an unknown role, or a repeated hash or name.
  static absl::StatusOr<TokenStore> Load(const std::string& path);
  static absl::StatusOr<TokenStore> Parse(absl::string_view text, absl::string_view source);

  // The entry whose hash is SHA-256(token), compared in constant time against every entry.
  const TokenEntry* Find(absl::string_view token) const;
  const std::vector<TokenEntry>& entries() const { return entries_; }

 private:
  std::vector<TokenEntry> entries_;
};

// Appends a token line to `path` under an exclusive lock, creating the file with mode 0600 when
// it does not exist. Refuses (like Load) a file others can write, and a name already present.
absl::Status AppendToken(const std::string& path, absl::string_view token, Role role,
                         absl::string_view name);

// The identity of one call.
struct Caller {
  std::string name;          // token name, or "anonymous" without authentication
  Role role = Role::kReader;
  std::string cert_subject;  // the verified client certificate's subject under mutual TLS

  // What records and logs carry: "ROLE:NAME", plus " cert:SUBJECT" under mutual TLS.
  std::string Invoker() const;
};

class Authenticator {
 public:
  // Every call must present a token from `tokens`.
  explicit Authenticator(TokenStore tokens) : tokens_(std::move(tokens)) {}
  // No tokens at all: every caller is an anonymous admin. Only for a loopback development
  // daemon started with --insecure-no-auth (main.cc enforces that).
  static Authenticator NoAuth() { return Authenticator(); }

  // `authorization` holds the values of the call's `authorization` metadata. UNAUTHENTICATED
  // when there is not exactly one "Bearer TOKEN" value or the token is unknown.
  absl::StatusOr<Caller> Authenticate(const std::vector<absl::string_view>& authorization,
                                      std::string cert_subject) const;
  // PERMISSION_DENIED naming the method and both roles when `caller` may not call it.
  static absl::Status Authorize(const Caller& caller, absl::string_view full_method);

  bool enabled() const { return tokens_.has_value(); }

 private:
  Authenticator() = default;
  std::optional<TokenStore> tokens_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_AUTH_H_
