#include "services/daemon/serving.h"

#include <fcntl.h>
#include <malloc.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "grpc/grpc.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "core/io/small_file.h"
#include "services/daemon/address.h"

namespace ckpt::daemon {
namespace {

constexpr size_t kMaxPemBytes = 1 << 20;

// Reads a PEM file (core/io/small_file.h), checking the mode when it holds a private key.
absl::StatusOr<std::string> ReadPem(const std::string& path, bool private_key) {
  io::SmallFileRules rules;
  rules.what = private_key ? "TLS private key" : "certificate";
  rules.max_bytes = kMaxPemBytes;
  rules.forbidden_mode = private_key ? 026 : 0;  // not readable by others or writable by group
  absl::StatusOr<std::string> read = io::ReadSmallFile(path, rules);
  if (!read.ok()) return read.status();
  const std::string& text = *read;
  if (!absl::StrContains(text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a PEM file"));
  }
  return text;
}

}  // namespace

absl::Status CheckServingOptions(const ServingOptions& o) {
  const bool tls = !o.tls_cert.empty() || !o.tls_key.empty();
  if (tls && (o.tls_cert.empty() || o.tls_key.empty())) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!o.client_ca.empty() && !tls) {
    return absl::InvalidArgumentError("--client-ca (mutual TLS) needs --tls-cert and --tls-key");
  }
  if (!tls && !IsLoopbackAddress(o.listen)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to listen on ", o.listen, " without TLS: tokens and evidence would cross the "
        "network in plaintext. Give --tls-cert and --tls-key, or listen on a loopback address "
        "(127.0.0.1:PORT, [::1]:PORT, localhost:PORT)"));
  }
  if (o.insecure_no_auth && !o.tokens.empty()) {
    return absl::InvalidArgumentError("--insecure-no-auth and --tokens exclude each other");
  }
  if (o.tokens.empty() && !o.insecure_no_auth) {
    return absl::FailedPreconditionError(
        "no --tokens FILE: every caller must present a token (create one with `ckpt-audit "
        "tokens add --file FILE --role ROLE --name NAME`). A development daemon on loopback may "
        "run without tokens with --insecure-no-auth");
  }
  if (o.insecure_no_auth && !IsLoopbackAddress(o.listen)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--insecure-no-auth serves only a loopback address, not ", o.listen));
  }
  if (!o.metrics_listen.empty() && !o.metrics_public && !IsLoopbackAddress(o.metrics_listen)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "refusing to serve metrics on ", o.metrics_listen, " (not loopback; the endpoint has no "
        "authentication). Add --metrics-public to serve it there"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServingOptions& o) {
  if (o.tls_cert.empty()) return grpc::InsecureServerCredentials();
  auto cert = ReadPem(o.tls_cert, /*private_key=*/false);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem(o.tls_key, /*private_key=*/true);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.client_ca.empty()) {
    auto ca = ReadPem(o.client_ca, /*private_key=*/false);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  } else {
    ssl.client_certificate_request = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE;
  }
  return grpc::SslServerCredentials(ssl);
}

void ApplyServerLimits(grpc::ServerBuilder& builder) {
  builder.SetMaxReceiveMessageSize(256 << 10);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 100);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10'000);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, 5 * 60'000);
  grpc::ResourceQuota quota("ckpt-auditd");
  quota.SetMaxThreads(kSyncThreads);
  builder.SetResourceQuota(quota);
}

uint64_t SetProcessDefaultsForServing(int malloc_arenas) {
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr && malloc_arenas > 0) {
    mallopt(M_ARENA_MAX, malloc_arenas);
  }
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  std::signal(SIGPIPE, SIG_IGN);
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
    ::getrlimit(RLIMIT_NOFILE, &files);
  }
  return files.rlim_cur;
}

bool IdleMemoryReleaser::Tick(uint64_t calls_started) {
  if (calls_started != last_seen_) {
    last_seen_ = calls_started;
    quiet_ = 0;
    return false;
  }
  if (last_trimmed_ == calls_started || ++quiet_ < quiet_ticks_) return false;
  last_trimmed_ = calls_started;
  if (release_) release_();
  malloc_trim(0);
  return true;
}

}  // namespace ckpt::daemon
