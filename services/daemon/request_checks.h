// Checks and normalisation of request fields, shared by the gRPC adapter (no gRPC in here).
// Every error is INVALID_ARGUMENT and starts with the field's name.
#ifndef CKPT_SERVICES_DAEMON_REQUEST_CHECKS_H_
#define CKPT_SERVICES_DAEMON_REQUEST_CHECKS_H_

#include <cstdint>
#include <optional>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/quant/format.h"

namespace ckpt::daemon {

absl::Status RequireNonEmpty(absl::string_view field, absl::string_view value);

// A SHA-256 digest as the log stores it: 64 lower-case hex digits. Accepts any case and an
// optional "sha256:" prefix; "" stays "" (no filter).
absl::StatusOr<std::string> NormalizeDigest(absl::string_view field, absl::string_view value);

// RFC 3339 with any offset ("2026-01-02T03:04:05+02:00"); "" is nullopt.
absl::StatusOr<std::optional<absl::Time>> ParseTimeField(absl::string_view field,
                                                         absl::string_view value);

// "" | "pass" | "fail".
absl::Status CheckVerdict(absl::string_view field, absl::string_view value);

// 0 means the default (50); otherwise 1..1000.
absl::StatusOr<int> CheckLimit(absl::string_view field, int64_t value);

// An absolute path, normalised lexically ("/a/./b//c/" -> "/a/b/c"); "" stays "". No filesystem
// access: records name the realpath their audit resolved, which may no longer exist.
absl::StatusOr<std::string> NormalizePathFilter(absl::string_view field, absl::string_view value);

// "" | "audit" | "gate" | "test-result" | one of those predicate type URIs; returns the URI
// ("" for all).
absl::StatusOr<std::string> PredicateTypeFilter(absl::string_view field, absl::string_view value);

// A page token from a previous answer: decimal digits.
absl::Status CheckPageToken(absl::string_view field, absl::string_view value);

// A job id as StartAudit returns them: 1..64 characters of [A-Za-z0-9-].
absl::Status CheckJobId(absl::string_view field, absl::string_view value);

// Both sides absolute paths; lexically normalised.
absl::StatusOr<quant::RootMapping> CheckRootMapping(absl::string_view field,
                                                    absl::string_view declared,
                                                    absl::string_view actual);

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_REQUEST_CHECKS_H_
