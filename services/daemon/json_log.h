// ckpt-auditd's structured log: one JSON object per line on stderr, with "time" (RFC 3339 UTC)
// and "level" ("info", "warn", "error") first. Strings that are not valid UTF-8 (file names
// are bytes) are written with U+FFFD in place of the bad bytes, so every line parses.
//
// A writer thread of its own writes the lines, so a call never waits for whoever reads stderr
// (journald, a container runtime): when that reader stalls, up to 1 MiB of lines wait; beyond
// that, lines are dropped and counted, and a "log lines dropped" line with the count follows
// once writing works again (docs/daemon.md, "Health, reflection, metrics, logs").
#ifndef CKPT_SERVICES_DAEMON_JSON_LOG_H_
#define CKPT_SERVICES_DAEMON_JSON_LOG_H_

#include <chrono>
#include <string_view>

#include "nlohmann/json.hpp"

namespace ckpt::daemon {

// Thread-safe; each call queues one whole line and returns without waiting for stderr.
void LogJson(std::string_view level, const nlohmann::ordered_json& fields);

// Waits until the lines logged before it are written (or dropped), at most `timeout`: at exit,
// so that the last lines are not lost, and so that a stalled stderr cannot keep the daemon from
// stopping.
void FlushJsonLog(std::chrono::milliseconds timeout);

// Sends gRPC's own log messages (TLS handshake failures, ...) through LogJson too, with "msg"
// and "source", so that stderr holds nothing but JSON lines.
void RouteGrpcLogsToJson();

// True once gRPC logged a failed accept on a listening port ("Failed accept4", for instance
// when the process ran out of file descriptors): gRPC 1.51 then stops accepting on that port
// for good, so the daemon exits for its supervisor to restart it (docs/daemon.md, "Limits").
bool GrpcListenerFailed();

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_JSON_LOG_H_
