// ckpt-auditd: the gRPC audit daemon. See docs/daemon.md.
//
//   ckpt-auditd --listen 0.0.0.0:7433 --tls-cert server.pem --tls-key server.key
//               --tokens /etc/ckpt-audit/tokens --db /var/lib/ckpt-audit/evidence.db
//               --key /etc/ckpt-audit/signing.pem --allow-root /models [--trust FILE]
//               [--allow-registry registry.example:5000 [--attach]]
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "CLI/CLI.hpp"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/grpcpp.h"
#include "core/evidence/environment.h"
#include "core/evidence/key_source.h"
#include "core/fingerprint/fingerprint.h"
#include "core/parallel.h"
#include "services/daemon/grpc_service.h"
#include "services/daemon/json_log.h"
#include "services/daemon/metrics.h"
#include "services/daemon/rpc_observer.h"
#include "services/daemon/serving.h"
#include "storage/head_state.h"

namespace {

volatile std::sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

constexpr std::chrono::seconds kLogFlushTimeout(2);

// Clears the variable's value where the process's environment block holds it (also what
// /proc/PID/environ shows) and removes it, before the first child process starts.
void ForgetEnvironmentVariable(const std::string& name) {
  if (char* value = std::getenv(name.c_str()); value != nullptr) {
    ::explicit_bzero(value, std::strlen(value));
  }
  ::unsetenv(name.c_str());
}

// Passes the backend's reports on to the metrics (when served) and logs the job steps that
// reach outside the daemon (attaching referrers to a registry).
class ObserverLog final : public ckpt::daemon::AuditObserver {
 public:
  explicit ObserverLog(ckpt::daemon::AuditObserver* metrics) : metrics_(metrics) {}
  void AuditFinished(std::string_view verdict, double seconds, uint64_t bytes_read) override {
    if (metrics_ != nullptr) metrics_->AuditFinished(verdict, seconds, bytes_read);
  }
  void GateDecided(bool pass) override {
    if (metrics_ != nullptr) metrics_->GateDecided(pass);
  }
  void Attached(std::string_view job, std::string_view subject,
                const absl::Status& result) override {
    nlohmann::ordered_json line = {
        {"msg", result.ok() ? "attached the record as referrers" : "attach failed"},
        {"job", job},
        {"subject", subject}};
    if (!result.ok()) line["error"] = result.ToString();
    ckpt::daemon::LogJson(result.ok() ? "info" : "warn", line);
    if (metrics_ != nullptr) metrics_->Attached(job, subject, result);
  }

 private:
  ckpt::daemon::AuditObserver* const metrics_;
};

int Fail(const absl::Status& s) {
  ckpt::daemon::LogJson("error", {{"msg", "ckpt-auditd: " + s.ToString()}});
  ckpt::daemon::FlushJsonLog(kLogFlushTimeout);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ckpt::daemon;
  CLI::App app{"ckpt-auditd: audits checkpoints as jobs and serves signed evidence over gRPC"};
  app.set_version_flag("--version", ckpt::evidence::VersionText("ckpt-auditd"));
  std::string db, trust_path;
  ckpt::evidence::KeySource key_source;
  int drain_seconds = 5;
  BackendOptions options;
  ServingOptions serving;
  app.add_option("--listen", serving.listen,
                 "address:port to serve on (without TLS: loopback only)");
  app.add_option("--tls-cert", serving.tls_cert, "server certificate chain (PEM)");
  app.add_option("--tls-key", serving.tls_key, "server private key (PEM, mode 0600)");
  app.add_option("--client-ca", serving.client_ca,
                 "CA bundle (PEM): require and verify client certificates (mutual TLS)");
  app.add_option("--tokens", serving.tokens,
                 "token file: 'sha256:HEX ROLE NAME' per line (ckpt-audit tokens add)");
  app.add_flag("--insecure-no-auth", serving.insecure_no_auth,
               "development only: no tokens, every caller is admin; loopback only");
  app.add_option("--metrics-listen", serving.metrics_listen,
                 "address:port for Prometheus /metrics over HTTP (loopback unless "
                 "--metrics-public)");
  app.add_option("--health-listen", serving.health_listen,
                 "address:port serving only grpc.health.v1 in plaintext (for probes that cannot "
                 "speak TLS, such as Kubernetes' gRPC probe)");
  app.add_flag("--metrics-public", serving.metrics_public,
               "allow a non-loopback --metrics-listen address");
  app.add_option("--db", db, "evidence database (created if missing)")->required();
  app.add_option("--head-state", options.head_path,
                 "file where the daemon keeps the log's newest signed tree head, to refuse a "
                 "rolled-back or forked log (default: --db's path + '.head')");
  app.add_option("--key", key_source.key,
                 "Ed25519 signing key: a PEM file (mode 0600) or a pkcs11: URI")->required();
  // As the CLI's signing commands take them (services/cli/cli_util.h, AddPkcs11Flags).
  app.add_option("--pkcs11-module", key_source.pkcs11_module,
                 "PKCS#11 module (.so) holding a --key given as a pkcs11: URI");
  app.add_option("--pin-file", key_source.pin_file,
                 "file holding the token's user PIN (mode 0600); for a pkcs11: key");
  app.add_option("--pin-env", key_source.pin_env,
                 "environment variable holding the token's user PIN; for a pkcs11: key");
  app.add_option("--trust", trust_path, "trust file of accepted keys (default: --key's own)");
  app.add_option("--allow-root", options.allowed_roots,
                 "directory whose checkpoints may be audited (repeatable)")->required();
  app.add_option("--allow-registry", options.allowed_registries,
                 "registry HOST[:PORT] whose oci:// artifacts may be audited (repeatable; "
                 "none: oci:// roots are refused)");
  app.add_flag("--attach", options.attach,
               "after an audit of an oci:// root, push its record's verification summary and "
               "test result as referrers of the manifest (docs/daemon.md \"OCI subjects\")");
  app.add_option("--workers", options.workers, "audits run at once")
      ->check(CLI::Range(1u, ckpt::kMaxThreads));
  app.add_option("--threads-per-audit", options.threads_per_audit, "0: all cores")
      ->check(CLI::Range(0u, ckpt::kMaxThreads));
  int work_threads = GrpcAuditService::kDefaultWorkThreads, malloc_arenas = 2;
  app.add_option("--work-threads", work_threads,
                 "Gate, StartAudit, CancelJob and VerifyLog calls run at once (more wait)")
      ->check(CLI::Range(1, 1024));
  app.add_option("--malloc-arenas", malloc_arenas,
                 "glibc malloc arenas (0: glibc's default, 8 per core); MALLOC_ARENA_MAX wins")
      ->check(CLI::Range(0, 1024));
  app.add_option("--drain-seconds", drain_seconds,
                 "on SIGTERM: report NOT_SERVING, then let audits and calls finish this long");
  std::string executor = "local";
  ckpt::daemon::SlurmOptions slurm;
  unsigned poll_ms = 1000;
  app.add_option("--executor", executor,
                 "where audits run: local (here) or slurm (as job arrays of parts, merged and "
                 "signed here; docs/daemon.md \"Slurm executor\")")
      ->check(CLI::IsMember({"local", "slurm"}));
  app.add_option("--slurm-parts-dir", slurm.parts_dir,
                 "slurm: directory shared with every node, for the parts of each job");
  app.add_option("--slurm-node-key", slurm.node_key,
                 "slurm: the nodes' part-signing key PEM, as the nodes see it");
  app.add_option("--part-trust", slurm.part_trust,
                 "slurm: trust file of the node keys that may sign parts (never --trust)");
  app.add_option("--slurm-audit-binary", slurm.audit_binary,
                 "slurm: the ckpt-audit binary as the nodes see it (default: on their PATH)");
  app.add_option("--slurm-sbatch-arg", slurm.sbatch_args,
                 "slurm: an sbatch option for every array, e.g. --partition=audit (repeatable)");
  app.add_option("--slurm-max-parts", slurm.max_parts, "slurm: most parts one audit may have")
      ->check(CLI::Range(1u, ckpt::kMaxParts));
  app.add_option("--slurm-part-bytes", slurm.bytes_per_part,
                 "slurm: parts when a request names none: one per this many bytes of both trees");
  app.add_option("--slurm-poll-ms", poll_ms, "slurm: how often the parts' states are read")
      ->check(CLI::Range(50, 60000));
  // Usage errors exit 2, as every ckpt-audit command's do (README.md, "Exit codes"); --help and
  // --version exit 0.
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (executor == "slurm") {
    slurm.poll = absl::Milliseconds(poll_ms);
    auto made = ckpt::daemon::SlurmExecutor::Create(slurm);
    if (!made.ok()) return Fail(made.status());
    options.slurm = *std::move(made);
  } else if (!slurm.parts_dir.empty() || !slurm.node_key.empty() || !slurm.part_trust.empty()) {
    return Fail(absl::InvalidArgumentError("the --slurm-* options and --part-trust need "
                                           "--executor slurm"));
  }
  options.db_path = db;
  if (options.head_path.empty()) options.head_path = db + ".head";
  const uint64_t max_open_files = SetProcessDefaultsForServing(malloc_arenas);
  RouteGrpcLogsToJson();

  if (absl::Status s = CheckServingOptions(serving); !s.ok()) return Fail(s);
  std::unique_ptr<Authenticator> auth;
  if (serving.insecure_no_auth) {
    auth = std::make_unique<Authenticator>(Authenticator::NoAuth());
    LogJson("warn", {{"msg", "--insecure-no-auth: every caller on loopback is admin"}});
  } else {
    auto tokens = TokenStore::Load(serving.tokens);
    if (!tokens.ok()) return Fail(tokens.status());
    auth = std::make_unique<Authenticator>(*std::move(tokens));
  }
  auto credentials = MakeServerCredentials(serving);
  if (!credentials.ok()) return Fail(credentials.status());

  auto key = ckpt::evidence::LoadSigningKey(key_source);
  if (!key.ok()) return Fail(key.status());
  // The PIN is read once; no child (sbatch exports its whole environment to the nodes) may
  // inherit it (docs/evidence.md, "Keys in an HSM").
  if (!key_source.pin_env.empty()) ForgetEnvironmentVariable(key_source.pin_env);
  ckpt::evidence::TrustStore trust;
  if (!trust_path.empty()) {
    auto loaded = ckpt::evidence::TrustStore::Load(trust_path);
    if (!loaded.ok()) return Fail(loaded.status());
    trust = *std::move(loaded);
  }
  trust.Add(key->public_key());
  std::unique_ptr<DaemonMetrics> metrics;
  if (!serving.metrics_listen.empty()) metrics = std::make_unique<DaemonMetrics>();
  ObserverLog observer_log(metrics.get());
  options.observer = &observer_log;
  // Before anything is appended: a log that does not extend the remembered head is refused.
  auto head = ckpt::storage::CheckHeadAtStart(db, options.head_path, trust);
  if (!head.ok()) return Fail(head.status());
  if (!head->message.empty()) {
    LogJson(head->warning ? "warn" : "info",
            {{"msg", head->message}, {"head_adopted", head->adopted}});
  }
  auto backend = AuditBackend::Create(options, *key, std::move(trust));
  if (!backend.ok()) return Fail(backend.status());
  int metrics_port = 0;
  if (metrics) {
    AuditBackend* b = backend->get();
    auto port = metrics->Serve(serving.metrics_listen, [b] { return b->jobs().Counts(); });
    if (!port.ok()) return Fail(port.status());
    metrics_port = *port;
  }

  GrpcAuditService service(**backend, *auth, work_threads);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(serving.listen, *credentials, &port);
  ApplyServerLimits(builder);
  builder.RegisterService(&service);
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> observers;
  auto observer = std::make_unique<RpcObserverFactory>(*auth, metrics.get());
  const RpcObserverFactory& calls = *observer;
  observers.push_back(std::move(observer));
  builder.experimental().SetInterceptorCreators(std::move(observers));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (!server || port == 0) {
    return Fail(absl::UnavailableError("cannot listen on " + serving.listen));
  }
  // The health-only server: no AuditService, so no token ever arrives there.
  std::unique_ptr<grpc::Server> health_server;
  int health_port = 0;
  if (!serving.health_listen.empty()) {
    grpc::ServerBuilder hb;
    hb.AddListeningPort(serving.health_listen, grpc::InsecureServerCredentials(), &health_port);
    ApplyServerLimits(hb);
    health_server = hb.BuildAndStart();
    if (!health_server || health_port == 0) {
      return Fail(absl::UnavailableError("cannot listen on " + serving.health_listen));
    }
  }
  auto set_serving = [&](bool serving_now) {
    server->GetHealthCheckService()->SetServingStatus(serving_now);
    if (health_server) health_server->GetHealthCheckService()->SetServingStatus(serving_now);
  };
  // Before health says SERVING and the log says so: a supervisor (or a test) may send SIGTERM as
  // soon as it sees either, and the default action would kill the daemon without draining.
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  set_serving(true);
  const bool tls = !serving.tls_cert.empty();
  LogJson("info", {{"msg", "serving on port " + std::to_string(port)},
                   {"port", port},
                   {"tls", tls},
                   {"mutual_tls", !serving.client_ca.empty()},
                   {"auth", auth->enabled() ? "tokens" : "none"},
                   {"metrics_port", metrics_port},
                   {"health_port", health_port},
                   {"max_open_files", max_open_files},
                   {"db", db}});
  if (absl::Status s = (*backend)->append_status(); !s.ok()) {
    LogJson("warn", {{"msg", "serving reads only: " + s.ToString()}});
  }
  for (const std::string& note : (*backend)->jobs().recovery_notes()) {
    LogJson("warn", {{"msg", "recovering jobs: " + note}});
  }

  IdleMemoryReleaser releaser(/*quiet_ticks=*/3,  // 0.6 s without a new call
                              [b = backend->get()] { b->CloseIdleReaders(); });
  while (!g_stop && !GrpcListenerFailed()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    releaser.Tick(calls.calls_started());
  }
  const bool listener_failed = GrpcListenerFailed();
  if (listener_failed) {
    LogJson("error", {{"msg", "a listening port stopped accepting connections (gRPC 1.51 gives "
                              "up on a port after a failed accept); exiting so that the "
                              "supervisor starts the daemon again"}});
  }
  LogJson("info", {{"msg", "stopping: health NOT_SERVING, draining"},
                   {"drain_seconds", drain_seconds}});
  set_serving(false);
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(drain_seconds);
  // Running audits get the drain deadline to finish; queued ones stay queued in the database.
  if (!(*backend)->Drain(absl::FromChrono(deadline))) {
    LogJson("warn", {{"msg", "audits still running after the drain deadline"}});
  }
  server->Shutdown(deadline);
  if (health_server) health_server->Shutdown(deadline);
  FlushJsonLog(kLogFlushTimeout);
  return listener_failed ? 3 : 0;
}
