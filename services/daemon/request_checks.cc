#include "services/daemon/request_checks.h"

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/record.h"
#include "core/evidence/test_result.h"

namespace ckpt::daemon {
namespace {

absl::Status Invalid(absl::string_view field, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", why));
}

// `value` shown in an error, bounded so a huge field does not become a huge message.
std::string Shown(absl::string_view value) {
  constexpr size_t kMax = 80;
  return value.size() <= kMax ? absl::StrCat("'", value, "'")
                              : absl::StrCat("'", value.substr(0, kMax), "...'");
}

}  // namespace

absl::Status RequireNonEmpty(absl::string_view field, absl::string_view value) {
  if (value.empty()) return Invalid(field, "required");
  return absl::OkStatus();
}

absl::StatusOr<std::string> NormalizeDigest(absl::string_view field, absl::string_view value) {
  if (value.empty()) return std::string();
  std::string hex = absl::AsciiStrToLower(value);
  if (absl::StartsWith(hex, "sha256:")) hex = hex.substr(7);
  bool ok = hex.size() == 64;
  for (char c : hex) ok &= absl::ascii_isxdigit(static_cast<unsigned char>(c));
  if (!ok) {
    return Invalid(field, absl::StrCat(Shown(value),
                                       " is not a SHA-256 digest (64 hex digits, optionally "
                                       "prefixed 'sha256:')"));
  }
  return hex;
}

absl::StatusOr<std::optional<absl::Time>> ParseTimeField(absl::string_view field,
                                                         absl::string_view value) {
  if (value.empty()) return std::optional<absl::Time>();
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, value, &t, &err)) {
    return Invalid(field, absl::StrCat(Shown(value), " is not an RFC 3339 time (e.g. "
                                                     "2026-01-02T03:04:05Z or +02:00): ",
                                       err));
  }
  return std::optional<absl::Time>(t);
}

absl::Status CheckVerdict(absl::string_view field, absl::string_view value) {
  if (value.empty() || value == "pass" || value == "fail") return absl::OkStatus();
  return Invalid(field, absl::StrCat(Shown(value), " is not 'pass' or 'fail'"));
}

absl::StatusOr<int> CheckLimit(absl::string_view field, int64_t value) {
  if (value == 0) return 50;
  if (value < 1 || value > 1000) {
    return Invalid(field, absl::StrCat(value, " is outside 1..1000 (0 means 50)"));
  }
  return static_cast<int>(value);
}

absl::StatusOr<std::string> NormalizePathFilter(absl::string_view field, absl::string_view value) {
  if (value.empty()) return std::string();
  if (value.front() != '/') return Invalid(field, absl::StrCat(Shown(value), " is not absolute"));
  if (value.find('\0') != absl::string_view::npos) return Invalid(field, "contains a NUL byte");
  std::string normal = std::filesystem::path(std::string(value)).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

absl::StatusOr<std::string> PredicateTypeFilter(absl::string_view field, absl::string_view value) {
  if (value.empty()) return std::string();
  if (value == "audit" || value == evidence::kEvidencePredicateType) {
    return std::string(evidence::kEvidencePredicateType);
  }
  if (value == "gate" || value == evidence::kVerificationSummaryType) {
    return std::string(evidence::kVerificationSummaryType);
  }
  if (value == "test-result" || value == evidence::kTestResultPredicateType) {
    return std::string(evidence::kTestResultPredicateType);
  }
  return Invalid(field, absl::StrCat(Shown(value), " is not 'audit', 'gate', 'test-result' or "
                                                   "one of their predicate type URIs"));
}

absl::Status CheckPageToken(absl::string_view field, absl::string_view value) {
  bool ok = value.size() <= 20;
  for (char c : value) ok &= absl::ascii_isdigit(static_cast<unsigned char>(c));
  if (!ok) return Invalid(field, absl::StrCat(Shown(value), " is not a page token from a reply"));
  return absl::OkStatus();
}

absl::Status CheckJobId(absl::string_view field, absl::string_view value) {
  bool ok = !value.empty() && value.size() <= 64;
  for (char c : value) ok &= absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-';
  if (!ok) return Invalid(field, absl::StrCat(Shown(value), " is not a job id"));
  return absl::OkStatus();
}

absl::StatusOr<quant::RootMapping> CheckRootMapping(absl::string_view field,
                                                    absl::string_view declared,
                                                    absl::string_view actual) {
  auto d = NormalizePathFilter(absl::StrCat(field, ".declared"), declared);
  if (!d.ok()) return d.status();
  auto a = NormalizePathFilter(absl::StrCat(field, ".actual"), actual);
  if (!a.ok()) return a.status();
  if (d->empty() || a->empty()) return Invalid(field, "declared and actual are both required");
  return quant::RootMapping{*d, *a};
}

}  // namespace ckpt::daemon
