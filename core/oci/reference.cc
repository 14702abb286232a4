#include "core/oci/reference.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_split.h"
#include "core/sha256.h"

namespace ckpt::oci {
namespace {

bool RepoComponentOk(absl::string_view c) {
  if (c.empty() || c.size() > 255) return false;
  for (char ch : c) {
    if (!(absl::ascii_islower(ch) || absl::ascii_isdigit(ch) || ch == '.' || ch == '_' ||
          ch == '-')) {
      return false;
    }
  }
  return absl::ascii_isalnum(c.front()) && absl::ascii_isalnum(c.back());
}

bool TagOk(absl::string_view t) {
  if (t.empty() || t.size() > 128 || !(absl::ascii_isalnum(t[0]) || t[0] == '_')) return false;
  for (char ch : t) {
    if (!(absl::ascii_isalnum(ch) || ch == '.' || ch == '_' || ch == '-')) return false;
  }
  return true;
}

bool RegistryOk(absl::string_view r) {
  if (r.empty() || r.size() > 255) return false;
  for (char ch : r) {
    if (!(absl::ascii_isalnum(ch) || ch == '.' || ch == '-' || ch == ':' || ch == '[' ||
          ch == ']')) {
      return false;
    }
  }
  return true;
}

}  // namespace

bool Reference::Loopback() const {
  absl::string_view host = registry;
  if (absl::StartsWith(host, "[")) {
    host = host.substr(0, host.find(']') + 1);
  } else {
    host = host.substr(0, host.find(':'));
  }
  return host == "localhost" || host == "127.0.0.1" || host == "[::1]";
}

std::string Reference::ToString() const {
  return absl::StrCat(kScheme, registry, "/", repository,
                      digest.empty() ? absl::StrCat(":", tag) : absl::StrCat("@", digest));
}

Reference Reference::ByDigest(const std::string& d) const {
  Reference r = *this;
  r.tag.clear();
  r.digest = d;
  return r;
}

bool IsOciReference(absl::string_view text) { return absl::StartsWith(text, kScheme); }

absl::Status CheckDigest(absl::string_view digest, absl::string_view what) {
  absl::string_view hex = digest;
  bool ok = absl::ConsumePrefix(&hex, "sha256:") && hex.size() == 64;
  for (char ch : hex) ok = ok && (absl::ascii_isdigit(ch) || (ch >= 'a' && ch <= 'f'));
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": digest '", digest, "' is not sha256: followed by 64 lowercase hex digits"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ParseRegistry(absl::string_view text) {
  std::string registry = absl::AsciiStrToLower(text);
  if (!RegistryOk(registry)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", text, "' is not a registry (host[:port], e.g. registry.example:5000)"));
  }
  return registry;
}

absl::StatusOr<Reference> ParseReference(absl::string_view text) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is not an OCI reference (",
                                                   kScheme, "REGISTRY/REPO@sha256:HEX or ",
                                                   kScheme, "REGISTRY/REPO:TAG): ", why));
  };
  absl::string_view rest = text;
  if (!absl::ConsumePrefix(&rest, kScheme)) return bad("no oci:// scheme");
  size_t slash = rest.find('/');
  if (slash == absl::string_view::npos) return bad("no repository");
  Reference r;
  auto registry = ParseRegistry(rest.substr(0, slash));
  if (!registry.ok()) return bad("the registry is not a host[:port]");
  r.registry = *std::move(registry);
  rest.remove_prefix(slash + 1);
  if (size_t at = rest.find('@'); at != absl::string_view::npos) {
    r.digest = std::string(rest.substr(at + 1));
    if (!CheckDigest(r.digest, "reference").ok()) {
      return bad("the digest is not sha256: followed by 64 lowercase hex digits");
    }
    rest = rest.substr(0, at);
  } else {
    size_t colon = rest.rfind(':');
    if (colon == absl::string_view::npos || rest.find('/', colon) != absl::string_view::npos) {
      return bad("neither @sha256:HEX nor :TAG");
    }
    r.tag = std::string(rest.substr(colon + 1));
    if (!TagOk(r.tag)) return bad("the tag is not [A-Za-z0-9_][A-Za-z0-9._-]{0,127}");
    rest = rest.substr(0, colon);
  }
  if (rest.size() > 255) return bad("the repository is longer than 255 characters");
  for (absl::string_view c : absl::StrSplit(rest, '/')) {
    if (!RepoComponentOk(c)) return bad("a repository component is empty or not [a-z0-9._-]");
  }
  r.repository = std::string(rest);
  return r;
}

std::string DigestOf(absl::string_view bytes) {
  return absl::StrCat("sha256:", ToHex(Sha256Of(std::span<const uint8_t>(
                                     reinterpret_cast<const uint8_t*>(bytes.data()),
                                     bytes.size()))));
}

}  // namespace ckpt::oci
