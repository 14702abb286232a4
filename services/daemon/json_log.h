// ckpt-auditd's structured log: one JSON object per line on stderr, with "time" (RFC 3339 UTC)
// and "level" ("info", "warn", "error") first. Strings that are not valid UTF-8 (file names
// are bytes) are written with U+FFFD in place of the bad bytes, so every line parses.
#ifndef CKPT_SERVICES_DAEMON_JSON_LOG_H_
#define CKPT_SERVICES_DAEMON_JSON_LOG_H_

#include <string_view>

#include "nlohmann/json.hpp"

namespace ckpt::daemon {

// Thread-safe; each call writes one whole line.
void LogJson(std::string_view level, const nlohmann::ordered_json& fields);

// Sends gRPC's own log messages (TLS handshake failures, ...) through LogJson too, with "msg"
// and "source", so that stderr holds nothing but JSON lines.
void RouteGrpcLogsToJson();

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_JSON_LOG_H_
