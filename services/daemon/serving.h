// How ckpt-auditd exposes itself (docs/daemon.md, "Transport"): the start-up rules that keep
// tokens off the network in plaintext, the TLS or mutual-TLS server credentials built from PEM
// files, the allocator settings for serving many concurrent calls, and the release of idle memory.
#ifndef CKPT_SERVICES_DAEMON_SERVING_H_
#define CKPT_SERVICES_DAEMON_SERVING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/server_builder.h"

namespace ckpt::daemon {

struct ServingOptions {
  std::string listen = "127.0.0.1:7433";
  std::string tls_cert, tls_key;  // PEM files; both or neither
  std::string client_ca;          // PEM bundle: client certificates are required and verified
  std::string tokens;             // token file (auth.h)
  bool insecure_no_auth = false;  // no tokens: loopback development daemons only
  std::string health_listen;      // empty: health only on `listen`; else also here, plaintext
  std::string metrics_listen;     // empty: no metrics listener
  bool metrics_public = false;    // allow a non-loopback metrics address
};

// The start-up rules: TLS files come in pairs; --client-ca needs TLS; without TLS only a
// loopback address; --tokens, or --insecure-no-auth on loopback, never both; a metrics address
// on loopback unless --metrics-public. The health-only listener may be anywhere: it serves
// grpc.health.v1 (and reflection of it) and nothing that takes a token.
// FAILED_PRECONDITION / INVALID_ARGUMENT saying what to do.
absl::Status CheckServingOptions(const ServingOptions& options);

// Insecure credentials without TLS; otherwise TLS with the given certificate chain and key, and
// with --client-ca a client certificate is required and verified against that bundle. The key
// file must not be writable by anyone but its owner nor readable by others.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServingOptions& options);

// Limits every gRPC server of the daemon gets (docs/daemon.md, "Limits"), against peers that
// hold connections, streams and memory without a token: requests of at most 256 KiB (the
// largest valid one is about half that), 100 concurrent streams per connection, 10 s to finish
// a handshake, idle connections closed after 5 minutes, and at most kSyncThreads threads for
// the synchronous methods, which only server reflection uses (the daemon's own methods and
// health are on the callback API): beyond that gRPC answers RESOURCE_EXHAUSTED to reflection
// and to nothing else.
inline constexpr int kSyncThreads = 32;
void ApplyServerLimits(grpc::ServerBuilder& builder);

// Process-wide settings for a daemon serving many concurrent calls (docs/daemon.md, "Threads
// and memory"), called once at start, before any other thread: glibc malloc limited to
// `malloc_arenas` arenas (unless MALLOC_ARENA_MAX is set in the environment), and abseil's
// debug-build mutex deadlock detection (a global lock on every mutex operation, in gRPC too)
// turned off, SIGPIPE ignored (a stderr whose reader is gone fails the log's writes instead
// of killing the daemon: json_log.h), and the open-file limit raised to its hard limit (each
// connection takes a descriptor, and gRPC 1.51 stops accepting on a port for good after one
// failed accept: docs/daemon.md, "Limits"). The open-file limit it leaves.
uint64_t SetProcessDefaultsForServing(int malloc_arenas);

// Called on every tick of the daemon's main loop with the number of calls started so far: once
// no call has started for `quiet_ticks` ticks after some did, `release` drops what the daemon
// keeps only to serve a burst faster (idle read connections), and the heap that the burst freed
// is given back to the system (malloc_trim), so an idle daemon's RSS returns close to where it
// was before the burst. Never during a load: a trim holds the allocator's arena locks.
class IdleMemoryReleaser {
 public:
  IdleMemoryReleaser(int quiet_ticks, std::function<void()> release)
      : quiet_ticks_(quiet_ticks), release_(std::move(release)) {}
  // True when this tick released.
  bool Tick(uint64_t calls_started);

 private:
  const int quiet_ticks_;
  const std::function<void()> release_;
  uint64_t last_seen_ = 0, last_trimmed_ = 0;
  int quiet_ = 0;
};

}  // namespace ckpt::daemon

#endif  // CKPT_SERVICES_DAEMON_SERVING_H_
