#include "services/daemon/auth.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/io/small_file.h"
#include "core/sha256.h"
#include "openssl/crypto.h"
#include "openssl/rand.h"

namespace ckpt::daemon {
namespace {

constexpr absl::string_view kAuditService = "/ckpt_audit.v1.AuditService/";
constexpr absl::string_view kHashPrefix = "sha256:";
constexpr absl::string_view kTokenPrefix = "ckpt_";
constexpr size_t kMaxTokenFileBytes = 1 << 20;
constexpr char kTokenFileHeader[] =
    "# ckpt-auditd tokens (docs/daemon.md): sha256:<SHA-256 of the token, hex> <role> <name>\n";

struct MethodRole {
  absl::string_view method;  // the part after kAuditService
  Role role;
};
constexpr MethodRole kAuditServiceRoles[] = {
    {"QueryAudits", Role::kReader},  {"GetRecord", Role::kReader},
    {"GetInclusionProof", Role::kReader}, {"GetJob", Role::kReader},
    {"WatchJob", Role::kReader},     {"StartAudit", Role::kAuditor},
    {"CancelJob", Role::kAuditor},   {"Gate", Role::kGate},
    {"VerifyLog", Role::kAdmin},
};

// Methods that need no token: a prober and a reflection client carry no credentials, and
// neither reveals evidence.
constexpr absl::string_view kPublicMethods[] = {
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
};

std::array<uint8_t, 32> HashToken(absl::string_view token) {
  return Sha256Of({reinterpret_cast<const uint8_t*>(token.data()), token.size()});
}

int LowerHexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

std::string Errno(const std::string& path, absl::string_view what) {
  return absl::StrCat(path, ": cannot ", what, ": ", std::strerror(errno));
}

// What every read of a token file checks, on the descriptor read (core/io/small_file.h): whoever
// can write the file can add an admin token.
io::SmallFileRules TokenFileRules() {
  io::SmallFileRules rules;
  rules.what = "token file";
  rules.max_bytes = kMaxTokenFileBytes;
  rules.forbidden_mode = 022;
  rules.owner_root_or_self = true;
  return rules;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kReader: return "reader";
    case Role::kAuditor: return "auditor";
    case Role::kGate: return "gate";
    case Role::kAdmin: return "admin";
  }
  return "?";
}

absl::StatusOr<Role> ParseRole(absl::string_view name) {
  for (Role r : {Role::kReader, Role::kAuditor, Role::kGate, Role::kAdmin}) {
    if (name == RoleName(r)) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown role '", absl::CHexEscape(name), "' (reader, auditor, gate, admin)"));
}

bool RoleGrants(Role held, Role needed) {
  return held == Role::kAdmin || needed == Role::kReader || held == needed;
}

std::optional<Role> RequiredRole(absl::string_view full_method) {
  for (absl::string_view m : kPublicMethods) {
    if (full_method == m) return std::nullopt;
  }
  if (absl::ConsumePrefix(&full_method, kAuditService)) {
    for (const MethodRole& mr : kAuditServiceRoles) {
      if (full_method == mr.method) return mr.role;
    }
  }
  return Role::kAdmin;
}

bool IsKnownMethod(absl::string_view full_method) {
  for (absl::string_view m : kPublicMethods) {
    if (full_method == m) return true;
  }
  if (!absl::ConsumePrefix(&full_method, kAuditService)) return false;
  for (const MethodRole& mr : kAuditServiceRoles) {
    if (full_method == mr.method) return true;
  }
  return false;
}

std::vector<std::string> AuditServiceMethodsInTable() {
  std::vector<std::string> out;
  for (const MethodRole& mr : kAuditServiceRoles) out.emplace_back(mr.method);
  return out;
}

bool IsValidTokenName(absl::string_view name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '@' && c != '-') {
      return false;
    }
  }
  return true;
}

absl::StatusOr<std::string> NewToken() {
  uint8_t bytes[32];
  if (RAND_bytes(bytes, sizeof bytes) != 1) {
    return absl::InternalError("RAND_bytes failed: no token was created");
  }
  std::string token = absl::StrCat(kTokenPrefix, ToHex(bytes));
  OPENSSL_cleanse(bytes, sizeof bytes);
  return token;
}

std::string TokenLine(absl::string_view token, Role role, absl::string_view name) {
  return absl::StrCat(kHashPrefix, ToHex(HashToken(token)), " ", RoleName(role), " ", name);
}

absl::StatusOr<TokenStore> TokenStore::Parse(absl::string_view text, absl::string_view source) {
  TokenStore store;
  std::map<std::string, size_t> names;
  size_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat(source, ":", line_no, ": ", why));
    };
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() != 3) return bad("expected 'sha256:<hex> <role> <name>'");
    absl::string_view hex = fields[0];
    if (!absl::ConsumePrefix(&hex, kHashPrefix) || hex.size() != 64) {
      return bad("the hash must be 'sha256:' and 64 hex digits");
    }
    TokenEntry e;
    for (size_t i = 0; i < 32; ++i) {
      int hi = LowerHexDigit(hex[2 * i]), lo = LowerHexDigit(hex[2 * i + 1]);
      if (hi < 0 || lo < 0) return bad("the hash must be lowercase hex");
      e.hash[i] = static_cast<uint8_t>(hi * 16 + lo);
    }
    auto role = ParseRole(fields[1]);
    if (!role.ok()) return bad(role.status().message());
    e.role = *role;
    if (!IsValidTokenName(fields[2])) {
      return bad("the name must be 1-64 characters of A-Z a-z 0-9 . _ @ -");
    }
    e.name = std::string(fields[2]);
    if (!names.emplace(e.name, line_no).second) {
      return bad(absl::StrCat("name '", e.name, "' is already used on line ", names[e.name]));
    }
    for (const TokenEntry& other : store.entries_) {
      if (other.hash == e.hash) return bad("the same token hash appears twice");
    }
    store.entries_.push_back(std::move(e));
  }
  return store;
}

absl::StatusOr<TokenStore> TokenStore::Load(const std::string& path) {
  absl::StatusOr<std::string> text = io::ReadSmallFile(path, TokenFileRules());
  if (!text.ok()) return text.status();
  return Parse(*text, path);
}

const TokenEntry* TokenStore::Find(absl::string_view token) const {
  const std::array<uint8_t, 32> h = HashToken(token);
  const TokenEntry* found = nullptr;
  for (const TokenEntry& e : entries_) {  // no early exit: every entry costs the same
    if (CRYPTO_memcmp(e.hash.data(), h.data(), h.size()) == 0) found = &e;
  }
  return found;
}

absl::Status AppendToken(const std::string& path, absl::string_view token, Role role,
                         absl::string_view name) {
  if (!IsValidTokenName(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("token name '", absl::CHexEscape(name),
                     "' must be 1-64 characters of A-Z a-z 0-9 . _ @ -"));
  }
  bool created = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {
    created = false;
    fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
  }
  if (fd < 0) return absl::PermissionDeniedError(Errno(path, "open token file"));
  auto fail = [&](absl::Status s) {
    ::close(fd);
    return s;
  };
  if (created && ::fchmod(fd, 0600) != 0) return fail(absl::InternalError(Errno(path, "chmod")));
  // Two concurrent `tokens add` must not both pass the name check and append the same name.
  if (::flock(fd, LOCK_EX) != 0) return fail(absl::InternalError(Errno(path, "lock")));
  auto text = io::ReadSmallFile(fd, path, TokenFileRules());
  if (!text.ok()) return fail(text.status());
  auto store = TokenStore::Parse(*text, path);
  if (!store.ok()) return fail(store.status());
  for (const TokenEntry& e : store->entries()) {
    if (e.name == name) {
      return fail(absl::AlreadyExistsError(
          absl::StrCat(path, ": a token named '", name, "' already exists")));
    }
  }
  std::string out = text->empty() ? kTokenFileHeader : "";
  if (!text->empty() && text->back() != '\n') out += "\n";
  absl::StrAppend(&out, TokenLine(token, role, name), "\n");
  // One write with O_APPEND: the line lands whole at the end, never interleaved.
  ssize_t n = ::write(fd, out.data(), out.size());
  if (n != static_cast<ssize_t>(out.size())) return fail(absl::InternalError(Errno(path, "write")));
  if (::fsync(fd) != 0) return fail(absl::InternalError(Errno(path, "sync")));
  ::close(fd);
  return absl::OkStatus();
}

std::string Caller::Invoker() const {
  std::string s = absl::StrCat(RoleName(role), ":", name);
  if (!cert_subject.empty()) absl::StrAppend(&s, " cert:", cert_subject);
  return s;
}

absl::StatusOr<Caller> Authenticator::Authenticate(
    const std::vector<absl::string_view>& authorization, std::string cert_subject) const {
  if (!tokens_) return Caller{"anonymous", Role::kAdmin, std::move(cert_subject)};
  if (authorization.empty()) {
    return absl::UnauthenticatedError(
        "no token: send the metadata 'authorization: Bearer TOKEN' (ckpt-audit --token-file)");
  }
  if (authorization.size() > 1) {
    return absl::UnauthenticatedError("more than one authorization header");
  }
  absl::string_view value = authorization[0];
  if (value.size() < 7 || !absl::EqualsIgnoreCase(value.substr(0, 7), "bearer ")) {
    return absl::UnauthenticatedError("the authorization header is not 'Bearer TOKEN'");
  }
  const TokenEntry* e = tokens_->Find(absl::StripAsciiWhitespace(value.substr(7)));
  if (e == nullptr) return absl::UnauthenticatedError("unknown token");
  return Caller{e->name, e->role, std::move(cert_subject)};
}

absl::Status Authenticator::Authorize(const Caller& caller, absl::string_view full_method) {
  std::optional<Role> needed = RequiredRole(full_method);
  if (!needed || RoleGrants(caller.role, *needed)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      full_method, " needs role ", RoleName(*needed), "; token '", caller.name, "' has role ",
      RoleName(caller.role)));
}

}  // namespace ckpt::daemon
