// Commands against a running ckpt-auditd (proto/ckpt_audit/v1/audit.proto):
//   ckpt-audit submit --server ADDR ROOT [--source S] [--policy P] [--json]
//       queues an audit on the daemon and follows its progress stream to the verdict;
//   ckpt-audit gate --server ADDR ROOT [--policy P] [--source-manifest-root HEX]
//                   [--map-root /DECLARED=/ACTUAL] [--trust FILE] [--json]
//       asks for a pass/fail decision on the root as it is on disk now, and believes a PASS only
//       after verifying the signed decision and its inclusion in the log (docs/daemon.md).
// Both take --token-file (or $CKPT_AUDIT_TOKEN), and --ca [--cert --key] for TLS / mutual TLS.
// Exit codes as everywhere: 0 pass, 1 fail, 2 error (including an unreachable daemon).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "core/text/json_dump.h"
#include "core/text/json_parse.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/daemon/address.h"
#include "storage/merkle.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::cli {
namespace {

namespace pb = ckpt_audit::v1;

struct ConnectArgs {
  std::string server = "127.0.0.1:7433";
  std::string token_file;
  std::string ca, cert, key;  // PEM files: TLS when ca is set, mutual TLS with cert and key
};

struct RemoteArgs {
  ConnectArgs connect;
  std::string root, source, policy, trust;
  std::string source_manifest_root;   // gate: only records against this source decide
  std::vector<std::string> map_root;  // gate: "/DECLARED=/ACTUAL"
  bool json = false;
};

absl::Status AddRootMap(const std::vector<std::string>& specs,
                        google::protobuf::RepeatedPtrField<pb::RootMapping>* out) {
  for (const std::string& spec : specs) {
    std::vector<std::string> parts = absl::StrSplit(spec, absl::MaxSplits('=', 1));
    if (parts.size() != 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("--map-root '", spec, "': expected /DECLARED=/ACTUAL"));
    }
    pb::RootMapping* m = out->Add();
    m->set_declared(parts[0]);
    m->set_actual(parts[1]);
  }
  return absl::OkStatus();
}

// A channel to the daemon and the bearer token every call carries.
struct Remote {
  std::unique_ptr<pb::AuditService::Stub> stub;
  std::string token;
  std::unique_ptr<grpc::ClientContext> Context() const {
    auto ctx = std::make_unique<grpc::ClientContext>();
    if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
    return ctx;
  }
};

int ReportRpcError(const grpc::Status& s) {
  return ReportError(absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                                  s.error_message()));
}

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, bool secret) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  struct stat st;
  bool exposed = ::fstat(fd, &st) == 0 && (st.st_mode & 007) != 0;
  std::string text;
  char buf[4096];
  for (ssize_t n; text.size() < (1 << 20) && (n = ::read(fd, buf, sizeof buf)) > 0;) {
    text.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  if (secret && exposed) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, ": token file is accessible by others; run chmod 600 and consider it exposed"));
  }
  return text;
}

// --token-file's first line, else $CKPT_AUDIT_TOKEN, else no token.
absl::StatusOr<std::string> LoadToken(const ConnectArgs& a) {
  std::string token;
  if (!a.token_file.empty()) {
    auto text = ReadSmallFile(a.token_file, /*secret=*/true);
    if (!text.ok()) return text.status();
    token = std::string(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
    if (token.empty()) return absl::InvalidArgumentError(a.token_file + ": no token");
  } else if (const char* env = std::getenv("CKPT_AUDIT_TOKEN"); env != nullptr) {
    token = std::string(absl::StripAsciiWhitespace(env));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError("the token has a character outside printable ASCII");
    }
  }
  return token;
}

absl::StatusOr<Remote> Connect(const ConnectArgs& a) {
  Remote r;
  auto token = LoadToken(a);
  if (!token.ok()) return token.status();
  r.token = *std::move(token);
  if ((!a.cert.empty() || !a.key.empty()) && (a.ca.empty() || a.cert.empty() || a.key.empty())) {
    return absl::InvalidArgumentError("--cert and --key go together, and need --ca");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (a.ca.empty()) {
    if (!r.token.empty() && !daemon::IsLoopbackAddress(a.server)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to send a token to ", a.server,
          " without TLS; give --ca (the CA that signed the daemon's certificate)"));
    }
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    auto ca = ReadSmallFile(a.ca, /*secret=*/false);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!a.cert.empty()) {
      auto cert = ReadSmallFile(a.cert, /*secret=*/false);
      if (!cert.ok()) return cert.status();
      auto key = ReadSmallFile(a.key, /*secret=*/true);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(ssl);
  }
  r.stub = pb::AuditService::NewStub(grpc::CreateChannel(a.server, creds));
  return r;
}

int Submit(const RemoteArgs& a) {
  auto remote = Connect(a.connect);
  if (!remote.ok()) return ReportError(remote.status());
  pb::StartAuditRequest req;
  req.set_root(a.root);
  req.set_source_root(a.source);
  req.set_policy(a.policy);
  pb::Job job;
  if (grpc::Status s = remote->stub->StartAudit(remote->Context().get(), req, &job); !s.ok()) {
    return ReportRpcError(s);
  }
  const std::string& server = a.connect.server;
  if (!a.json) std::fprintf(stderr, "%s queued on %s\n", job.id().c_str(), server.c_str());

  pb::WatchJobRequest watch;
  watch.set_id(job.id());
  auto wctx = remote->Context();
  auto reader = remote->stub->WatchJob(wctx.get(), watch);
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
                        {"record_id", job.record_id()}, {"server", server}};
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("verdict %s: record %lld on %s\n", job.verdict().c_str(),
                static_cast<long long>(job.record_id()), server.c_str());
  }
  return job.verdict() == "pass" ? kExitOk : kExitCheckFailed;
}

// A PASS counts only when the decision the server returned (its exact envelope, an inclusion
// proof and the signed checkpoint, all in the answer) is a verification summary signed by a
// trusted key that says PASSED for exactly the content digest and gate policy the server
// reported, and is a leaf of the log under a tree head signed by a trusted key. A server that
// merely says `pass` (or replays a decision about other content, or relabels a FAILED one)
// proves nothing.
absl::Status VerifyPass(const pb::GateResponse& resp, const evidence::TrustStore& trust) {
  if (resp.decision_envelope().empty()) {
    return absl::FailedPreconditionError("the answer carries no signed decision");
  }
  auto env = evidence::ParseEnvelope(resp.decision_envelope());
  if (!env.ok()) return env.status();
  if (auto signer = evidence::VerifyEnvelope(*env, trust); !signer.ok()) return signer.status();
  auto parsed = ParseBoundedJson(env->payload, "the signed decision");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || j.value("predicateType", "") != evidence::kVerificationSummaryType ||
      !j.contains("predicate") || !j["predicate"].is_object()) {
    return absl::FailedPreconditionError("the signed statement is not a gate decision");
  }
  const auto& pred = j["predicate"];
  if (pred.value("verificationResult", "") != "PASSED") {
    return absl::FailedPreconditionError("the signed decision says FAILED");
  }
  if (!pred.contains("policy") || !pred["policy"].is_object() ||
      pred["policy"].value("uri", "") != resp.gate_policy()) {
    return absl::FailedPreconditionError("the signed decision states another gate policy");
  }
  bool content_matches = false;
  if (j.contains("subject") && j["subject"].is_array()) {
    for (const auto& s : j["subject"]) {
      content_matches |= s.is_object() &&
                         s.value("name", "") == evidence::kManifestRootSubject &&
                         s.contains("digest") && s["digest"].is_object() &&
                         s["digest"].value("sha256", "") == resp.manifest_root();
    }
  }
  if (!content_matches) {
    return absl::FailedPreconditionError(
        absl::StrCat("the signed decision is not about content ", resp.manifest_root()));
  }

  const pb::InclusionProof& proof = resp.decision_proof();
  const std::string& note = proof.checkpoint();
  auto head = storage::VerifyCheckpoint(note, note.substr(0, note.find('\n')), trust);
  if (!head.ok()) return head.status();
  if (proof.leaf_index() < 0 || proof.leaf_index() != resp.decision_id() ||
      static_cast<uint64_t>(proof.tree_size()) != head->size) {
    return absl::FailedPreconditionError("the inclusion proof is not for this decision and tree");
  }
  std::vector<storage::Hash> hashes;
  for (const std::string& h : proof.hashes()) {
    storage::Hash x;
    if (h.size() != x.size()) return absl::FailedPreconditionError("malformed proof hash");
    std::copy(h.begin(), h.end(), x.begin());
    hashes.push_back(x);
  }
  return storage::VerifyInclusion(storage::LeafHash(evidence::AsBytes(resp.decision_envelope())),
                                  static_cast<uint64_t>(proof.leaf_index()), head->size, hashes,
                                  head->root);
}

int Gate(const RemoteArgs& a) {
  auto trust = LoadTrust(a.trust);
  if (!trust.ok()) return ReportError(trust.status());
  auto remote = Connect(a.connect);
  if (!remote.ok()) return ReportError(remote.status());
  pb::GateRequest req;
  req.set_root(a.root);
  req.set_policy(a.policy);
  req.set_source_manifest_root(a.source_manifest_root);
  if (auto s = AddRootMap(a.map_root, req.mutable_root_map()); !s.ok()) return ReportError(s);
  pb::GateResponse resp;
  if (grpc::Status s = remote->stub->Gate(remote->Context().get(), req, &resp); !s.ok()) {
    return ReportRpcError(s);
  }
  bool pass = resp.pass();
  std::string verified;
  if (pass) {
    absl::Status v = VerifyPass(resp, *trust);
    pass = v.ok();
    verified = v.ok() ? "decision signature and log inclusion verified"
                      : absl::StrCat("the server said PASS but its decision does not verify: ",
                                     v.ToString());
  }
  if (a.json) {
    nlohmann::json j = {{"pass", pass},
                        {"reasons", std::vector<std::string>(resp.reasons().begin(),
                                                             resp.reasons().end())},
                        {"record_id", resp.record_id()},
                        {"decision_id", resp.decision_id()},
                        {"reused", resp.reused()},
                        {"gate_policy", resp.gate_policy()},
                        {"manifest_root", resp.manifest_root()}};
    if (!verified.empty()) j["verification"] = verified;
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    std::printf("gate %s for %s (content %s)\n", pass ? "PASS" : "FAIL", a.root.c_str(),
                resp.manifest_root().c_str());
    for (const auto& r : resp.reasons()) std::printf("  - %s\n", r.c_str());
    if (!verified.empty()) std::printf("  - %s\n", verified.c_str());
    std::printf("decision recorded as %lld\n", static_cast<long long>(resp.decision_id()));
  }
  return pass ? kExitOk : kExitCheckFailed;
}

void AddCommon(CLI::App* cmd, RemoteArgs* a) {
  cmd->add_option("ROOT", a->root, "checkpoint root, as the daemon sees it")->required();
  cmd->add_option("--server", a->connect.server, "ckpt-auditd address (default 127.0.0.1:7433)");
  cmd->add_option("--token-file", a->connect.token_file,
                  "file holding the bearer token (default: $CKPT_AUDIT_TOKEN)");
  cmd->add_option("--ca", a->connect.ca, "CA certificate(s) to verify the daemon: use TLS");
  cmd->add_option("--cert", a->connect.cert, "client certificate for mutual TLS (with --key)");
  cmd->add_option("--key", a->connect.key, "client private key for mutual TLS");
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
  auto* g = app.add_subcommand("gate", "Ask ckpt-auditd for a verified pass/fail on a root");
  AddCommon(g, gate.get());
  g->add_option("--trust", gate->trust,
                "trust file with the daemon's public key (default: per-user)");
  g->add_option("--source-manifest-root", gate->source_manifest_root,
                "only a pair audit against the source with this OMS ROOT may decide");
  g->add_option("--map-root", gate->map_root,
                "/DECLARED=/ACTUAL: where an X4T container's declared root is (repeatable)");
  g->callback([=] { *exit_code = Gate(*gate); });
}

}  // namespace ckpt::cli
