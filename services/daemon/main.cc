// ckpt-auditd: the gRPC audit daemon. See docs/daemon.md.
//
//   ckpt-auditd --listen 127.0.0.1:7433 --db /var/lib/ckpt-audit/evidence.db \
//               --key /etc/ckpt-audit/signing.pem --allow-root /models [--trust FILE]
#include <csignal>
#include <cstdio>
#include <thread>

#include "CLI/CLI.hpp"
#include "grpcpp/grpcpp.h"
#include "services/daemon/grpc_service.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "ckpt-auditd: %s\n", s.ToString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckpt-auditd: audits checkpoints as jobs and serves signed evidence over gRPC"};
  std::string listen = "127.0.0.1:7433", db, key_path, trust_path;
  ckpt::daemon::BackendOptions options;
  app.add_option("--listen", listen, "address:port to serve on");
  app.add_option("--db", db, "evidence database (created if missing)")->required();
  app.add_option("--key", key_path, "Ed25519 signing key PEM (mode 0600)")->required();
  app.add_option("--trust", trust_path, "trust file of accepted keys (default: --key's own)");
  app.add_option("--allow-root", options.allowed_roots,
                 "directory whose checkpoints may be audited (repeatable)")->required();
  app.add_option("--workers", options.workers, "audits run at once");
  app.add_option("--threads-per-audit", options.threads_per_audit, "0: all cores");
  CLI11_PARSE(app, argc, argv);
  options.db_path = db;

  auto key = ckpt::evidence::SigningKey::Load(key_path);
  if (!key.ok()) return Fail(key.status());
  ckpt::evidence::TrustStore trust;
  if (!trust_path.empty()) {
    auto loaded = ckpt::evidence::TrustStore::Load(trust_path);
    if (!loaded.ok()) return Fail(loaded.status());
    trust = *std::move(loaded);
  }
  trust.Add(key->public_key());
  auto backend = ckpt::daemon::AuditBackend::Create(options, *key, std::move(trust));
  if (!backend.ok()) return Fail(backend.status());

  ckpt::daemon::GrpcAuditService service(**backend);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) return Fail(absl::UnavailableError("cannot listen on " + listen));
  std::fprintf(stderr, "ckpt-auditd: serving on port %d, evidence in %s\n", port, db.c_str());

  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  while (!g_stop) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::fprintf(stderr, "ckpt-auditd: stopping\n");
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  return 0;
}
