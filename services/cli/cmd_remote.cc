// Commands against a running ckpt-auditd (proto/ckpt_audit/v1/audit.proto):
//   ckpt-audit submit --server ADDR ROOT [--source S] [--policy P] [--json]
//       queues an audit on the daemon and follows its progress stream to the verdict;
//   ckpt-audit gate --server ADDR ROOT [--policy P] [--json]
//       asks for a pass/fail decision on the root as it is on disk now.
// Exit codes as everywhere: 0 pass, 1 fail, 2 error (including an unreachable daemon).
#include <cstdio>

#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "core/text/json_dump.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"

namespace ckpt::cli {
namespace {

namespace pb = ckpt_audit::v1;

struct RemoteArgs {
  std::string server = "127.0.0.1:7433";
  std::string root, source, policy;
  bool json = false;
};

int ReportRpcError(const grpc::Status& s) {
  return ReportError(absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                  s.error_message()));
}

std::unique_ptr<pb::AuditService::Stub> Connect(const std::string& server) {
  return pb::AuditService::NewStub(
      grpc::CreateChannel(server, grpc::InsecureChannelCredentials()));
}

int Submit(const RemoteArgs& a) {
  auto stub = Connect(a.server);
  pb::StartAuditRequest req;
  req.set_root(a.root);
  req.set_source_root(a.source);
  req.set_policy(a.policy);
  pb::Job job;
  grpc::ClientContext ctx;
  if (grpc::Status s = stub->StartAudit(&ctx, req, &job); !s.ok()) return ReportRpcError(s);
  if (!a.json) std::fprintf(stderr, "%s queued on %s\n", job.id().c_str(), a.server.c_str());

  pb::WatchJobRequest watch;
  watch.set_id(job.id());
  grpc::ClientContext wctx;
  auto reader = stub->WatchJob(&wctx, watch);
  TerminalProgress progress;
  std::string phase;
  uint64_t shown = 0;  // units of the current phase already passed to the bar
  pb::JobEvent e;
  while (reader->Read(&e)) {
    if (e.phase() == "queued") continue;  // nothing to draw until a worker picks it up
    if (!e.done() && e.phase() != phase) {
      if (!phase.empty()) progress.End();
      phase = e.phase();
      shown = 0;
      progress.Begin(phase, e.total_units());
    }
    if (e.done_units() > shown) {
      progress.Advance(e.done_units() - shown);
      shown = e.done_units();
    }
    if (e.done()) {
      if (!phase.empty()) progress.End();
      job = e.job();
    }
  }
  if (grpc::Status s = reader->Finish(); !s.ok()) return ReportRpcError(s);
  if (job.state() == pb::JOB_STATE_FAILED) {
    return ReportError(absl::Status(static_cast<absl::StatusCode>(job.error_code()),
                                    job.error_message()));
  }
  if (a.json) {
    nlohmann::json j = {{"job", job.id()}, {"verdict", job.verdict()},
                        {"record_id", job.record_id()}, {"server", a.server}};
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("verdict %s: record %lld on %s\n", job.verdict().c_str(),
                static_cast<long long>(job.record_id()), a.server.c_str());
  }
  return job.verdict() == "pass" ? kExitOk : kExitCheckFailed;
}

int Gate(const RemoteArgs& a) {
  auto stub = Connect(a.server);
  pb::GateRequest req;
  req.set_root(a.root);
  req.set_policy(a.policy);
  pb::GateResponse resp;
  grpc::ClientContext ctx;
  if (grpc::Status s = stub->Gate(&ctx, req, &resp); !s.ok()) return ReportRpcError(s);
  if (a.json) {
    nlohmann::json j = {{"pass", resp.pass()},
                        {"reasons", std::vector<std::string>(resp.reasons().begin(),
                                                             resp.reasons().end())},
                        {"record_id", resp.record_id()},
                        {"decision_id", resp.decision_id()},
                        {"manifest_root", resp.manifest_root()}};
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("gate %s for %s (content %s)\n", resp.pass() ? "PASS" : "FAIL",
                a.root.c_str(), resp.manifest_root().c_str());
    for (const auto& r : resp.reasons()) std::printf("  - %s\n", r.c_str());
    std::printf("decision recorded as %lld\n", static_cast<long long>(resp.decision_id()));
  }
  return resp.pass() ? kExitOk : kExitCheckFailed;
}

void AddCommon(CLI::App* cmd, RemoteArgs* a) {
  cmd->add_option("ROOT", a->root, "checkpoint root, as the daemon sees it")->required();
  cmd->add_option("--server", a->server, "ckpt-auditd address (default 127.0.0.1:7433)");
  cmd->add_option("--policy", a->policy, "policy name (default: the daemon's)");
  cmd->add_flag("--json", a->json, "machine-readable output");
}

}  // namespace

void AddRemoteCommands(CLI::App& app, int* exit_code) {
  auto submit = std::make_shared<RemoteArgs>();
  auto* s = app.add_subcommand("submit", "Run an audit on ckpt-auditd and follow its progress");
  AddCommon(s, submit.get());
  s->add_option("--source", submit->source, "source checkpoint for a pair audit");
  s->callback([=] { *exit_code = Submit(*submit); });

  auto gate = std::make_shared<RemoteArgs>();
  auto* g = app.add_subcommand("gate", "Ask ckpt-auditd for a pass/fail decision on a root");
  AddCommon(g, gate.get());
  g->callback([=] { *exit_code = Gate(*gate); });
}

}  // namespace ckpt::cli
