// Commands against a running ckpt-auditd (proto/ckpt_audit/v1/audit.proto):
//   ckpt-audit submit --server ADDR ROOT [--source S] [--policy P] [--json]
//       queues an audit on the daemon and follows its progress stream to the verdict;
//   ckpt-audit gate --server ADDR ROOT [--policy P] [--source-manifest-root HEX]
//                   [--expect-root HEX | --verify-local] [--max-age D]
//                   [--map-root /DECLARED=/ACTUAL] [--trust FILE] [--json]
//       asks for a pass/fail decision on the root as it is on disk now, and believes a PASS only
//       after verifying the signed decision, its inclusion in the log, and that it is about what
//       was asked, recently (docs/daemon.md "Gate clients").
// Both take --token-file (or $CKPT_AUDIT_TOKEN), and --tls-ca [--tls-cert --tls-key] for TLS /
// mutual TLS; a token goes to a server without TLS only on loopback with --insecure-loopback.
// Exit codes as everywhere: 0 pass, 1 fail, 2 error (including an unreachable daemon).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "ckpt_audit/v1/audit.grpc.pb.h"
#include "core/audit/audit_checks.h"
#include "core/checkpoint.h"
#include "core/evidence/dsse.h"
#include "core/evidence/hex_digest.h"
#include "core/evidence/record.h"
#include "core/fingerprint/fingerprint.h"
#include "core/io/small_file.h"
#include "core/oci/reference.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/gate_state.h"
#include "services/cli/settings.h"
#include "services/daemon/address.h"
#include "storage/merkle.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::cli {
namespace {

namespace pb = ckpt_audit::v1;

struct ConnectArgs {
  std::string server;  // ResolveConnect: the flag, CKPT_AUDIT_SERVER, the config, the default
  std::string token_file;
  std::string ca, cert, key;  // PEM files: TLS when ca is set, mutual TLS with cert and key
  bool insecure_loopback = false;  // a token may go to a loopback server without TLS
};

struct RemoteArgs {
  ConnectArgs connect;
  std::string root, source, policy, trust;
  std::string source_manifest_root;   // gate: only records against this source decide
  std::vector<std::string> map_root;  // gate: "/DECLARED=/ACTUAL"
  std::string expect_root;            // gate: the content ROOT the decision must be about
  bool verify_local = false;          // gate: ... and the content of ROOT as fingerprinted here
  std::string max_age = "10m";        // gate: how old a decision may be
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

// A token or a TLS client key is a secret: group and others may not read its file.
absl::StatusOr<std::string> ReadClientFile(const std::string& path, bool secret) {
  io::SmallFileRules rules;
  rules.what = secret ? "secret file" : "certificate file";
  rules.forbidden_mode = secret ? 077 : 0;
  return io::ReadSmallFile(path, rules);
}

// The flags, else the environment, else the config file (services/cli/settings.h).
absl::Status ResolveConnect(ConnectArgs* a) {
  if (absl::Status s = ApplySetting(Setting::kServer, &a->server); !s.ok()) return s;
  if (a->server.empty()) a->server = kDefaultServer;
  return ApplySetting(Setting::kTokenFile, &a->token_file);
}

// --token-file's first line, else $CKPT_AUDIT_TOKEN, else the config file's token-file (already
// in `a` after ResolveConnect), else no token.
absl::StatusOr<std::string> LoadToken(const ConnectArgs& a) {
  std::string token;
  if (!a.token_file.empty()) {
    auto text = ReadClientFile(a.token_file, /*secret=*/true);
    if (!text.ok()) return text.status();
    token = std::string(absl::StripAsciiWhitespace(text->substr(0, text->find('\n'))));
    if (token.empty()) return absl::InvalidArgumentError(a.token_file + ": no token");
  } else if (const char* env = std::getenv("CKPT_AUDIT_TOKEN"); env != nullptr && env[0] != '\0') {
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
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together, and need --tls-ca");
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (a.ca.empty()) {
    // Without TLS nothing says who listens on the port: a token goes there only where no other
    // host can listen (loopback), and only when the user accepts that any local process could.
    if (!r.token.empty() && (!daemon::IsLoopbackAddress(a.server) || !a.insecure_loopback)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "refusing to send a token to ", a.server,
          " without TLS: nothing verifies who is listening there; give --tls-ca (the CA that "
          "signed the daemon's certificate)",
          daemon::IsLoopbackAddress(a.server)
              ? ", or --insecure-loopback to trust any local process on that port"
              : ""));
    }
    creds = grpc::InsecureChannelCredentials();
  } else {
    grpc::SslCredentialsOptions ssl;
    auto ca = ReadClientFile(a.ca, /*secret=*/false);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    if (!a.cert.empty()) {
      auto cert = ReadClientFile(a.cert, /*secret=*/false);
      if (!cert.ok()) return cert.status();
      auto key = ReadClientFile(a.key, /*secret=*/true);
      if (!key.ok()) return key.status();
      ssl.pem_cert_chain = *cert;
      ssl.pem_private_key = *key;
    }
    creds = grpc::SslCredentials(ssl);
  }
  r.stub = pb::AuditService::NewStub(grpc::CreateChannel(a.server, creds));
  return r;
}

// A root as the daemon is to read it: an oci:// reference as given; a path made absolute against
// this process's working directory (the daemon has its own) and normalised without a trailing
// '/'. Links are left to the daemon, which resolves them under its allow-list.
std::string DaemonPath(const std::string& path) {
  if (path.empty() || oci::IsOciReference(path)) return path;
  std::error_code ec;
  std::string out = std::filesystem::absolute(path, ec).lexically_normal().string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

int Submit(const RemoteArgs& a) {
  auto remote = Connect(a.connect);
  if (!remote.ok()) return ReportError(remote.status());
  pb::StartAuditRequest req;
  req.set_root(DaemonPath(a.root));
  req.set_source_root(DaemonPath(a.source));
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
  if (job.error_code() != 0) {  // succeeded, but --attach failed (docs/daemon.md)
    std::fprintf(stderr, "warning: %s\n", job.error_message().c_str());
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

// What the caller asked about, that a decision must be about.
struct Asked {
  std::vector<std::string> roots;  // name-encoded: the root as given (made absolute, normalised)
                                   // and, where it resolves here, its real path
  std::string policy;              // scale-window policy name
  std::string source;              // the pinned source ROOT, or empty
  std::vector<std::pair<std::string, std::string>> contents;  // (content ROOT, where it came from)
  absl::Duration max_age;
};

// 64 lower-case hex characters from a digest given with an optional "sha256:" prefix, any case.
absl::StatusOr<std::string> DigestArg(const std::string& flag, const std::string& value) {
  std::string hex = absl::AsciiStrToLower(value);
  if (absl::StartsWith(hex, "sha256:")) hex = hex.substr(7);
  if (!evidence::IsSha256Hex(hex)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " '", value, "': expected 64 hex characters"));
  }
  return hex;
}

absl::StatusOr<Asked> AskedOf(const RemoteArgs& a) {
  Asked q;
  const std::string given = DaemonPath(a.root);
  q.roots.push_back(EncodeName(given));
  if (auto real = RealPath(a.root); real.ok() && EncodeName(*real) != q.roots[0]) {
    q.roots.push_back(EncodeName(*real));
  }
  q.policy = a.policy.empty() ? audit::kDefaultPolicy : a.policy;
  if (!a.source_manifest_root.empty()) {
    auto pin = DigestArg("--source-manifest-root", a.source_manifest_root);
    if (!pin.ok()) return pin.status();
    q.source = *pin;
  }
  if (!a.expect_root.empty()) {
    auto root = DigestArg("--expect-root", a.expect_root);
    if (!root.ok()) return root.status();
    q.contents.emplace_back(*root, "--expect-root");
  }
  if (a.verify_local) {
    FingerprintOptions options;
    options.tensor_digests = false;  // the ROOT is over file digests
    TerminalProgress progress;
    auto fp = FingerprintTree(a.root, options, progress);
    if (!fp.ok()) return fp.status();
    q.contents.emplace_back(fp->manifest.RootHex(), "the local fingerprint");
  }
  if (!absl::ParseDuration(a.max_age, &q.max_age) || q.max_age < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-age '", a.max_age, "': expected a duration such as 10m or 90s"));
  }
  return q;
}

// The server's decision as signed: a verification summary signed by a trusted key, whose exact
// envelope is a leaf of the log under a tree head signed by a trusted key. A server that merely
// says `pass`, or relabels a FAILED decision, proves nothing.
absl::StatusOr<evidence::RecordIndex> VerifiedDecision(const pb::GateResponse& resp,
                                                       const evidence::TrustStore& trust) {
  if (resp.decision_envelope().empty()) {
    return absl::FailedPreconditionError("the answer carries no signed decision");
  }
  auto env = evidence::ParseEnvelope(resp.decision_envelope());
  if (!env.ok()) return env.status();
  if (auto signer = evidence::VerifyEnvelope(*env, trust); !signer.ok()) return signer.status();
  auto decision = evidence::IndexPayload(env->payload);
  if (!decision.ok()) return decision.status();
  if (decision->predicate_type != evidence::kVerificationSummaryType) {
    return absl::FailedPreconditionError("the signed statement is not a gate decision");
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
  absl::Status included = storage::VerifyInclusion(
      storage::LeafHash(evidence::AsBytes(resp.decision_envelope())),
      static_cast<uint64_t>(proof.leaf_index()), head->size, hashes, head->root);
  if (!included.ok()) return included;
  return decision;
}

// The query parameter `name` of a gate policy URI
// ("ckpt-audit:gate/NAME@1?policy=P[&source=HEX]", services/daemon/gate_policy.h); empty if none.
std::string UriParam(const std::string& uri, const std::string& name) {
  const size_t q = uri.find('?');
  if (q == std::string::npos) return "";
  for (absl::string_view kv : absl::StrSplit(absl::string_view(uri).substr(q + 1), '&')) {
    if (absl::ConsumePrefix(&kv, name + "=")) return std::string(kv);
  }
  return "";
}

// The decision is about the root, policy and source asked; both sides named when not.
absl::Status CheckQuestion(const evidence::RecordIndex& d, const Asked& q) {
  if (std::find(q.roots.begin(), q.roots.end(), d.root) == q.roots.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the signed decision is about root ", d.root, ", not the requested ", q.roots[0],
        q.roots.size() > 1 ? absl::StrCat(" (", q.roots[1], " here)") : ""));
  }
  if (std::string policy = UriParam(d.policy, "policy"); policy != q.policy) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the signed decision is under policy '", policy, "' (", d.policy,
        "), not the requested '", q.policy, "'"));
  }
  if (std::string source = UriParam(d.policy, "source"); !q.source.empty() && source != q.source) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the signed decision rests on ", source.empty() ? "no pinned source" : "source " + source,
        ", not the requested --source-manifest-root ", q.source));
  }
  return absl::OkStatus();
}

// When the decision was signed; a time more than a minute ahead of this clock is refused, so a
// server cannot make its decisions outrank every later one in the gate state.
absl::StatusOr<absl::Time> DecisionTime(const evidence::RecordIndex& d, absl::Time now) {
  absl::Time t;
  std::string err;
  if (!absl::ParseTime(absl::RFC3339_full, d.time, &t, &err)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the signed decision's time '", d.time, "' is not RFC 3339: ", err));
  }
  if (t > now + absl::Minutes(1)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the signed decision is dated ", d.time, ", ahead of this clock (",
        absl::FormatTime(absl::RFC3339_sec, now, absl::UTCTimeZone()), ")"));
  }
  return t;
}

// A PASS the caller may rely on: a verified decision that says PASSED about the content the
// server fingerprinted and any the caller expects, about what was asked, made within --max-age
// and not before the newest decision this user has seen for the same question.
absl::Status CheckPass(const evidence::RecordIndex& d, const pb::GateResponse& resp,
                       const Asked& q, absl::Time t, absl::Time now,
                       std::optional<absl::Time> newest) {
  if (d.verdict != "pass") return absl::FailedPreconditionError("the signed decision says FAILED");
  if (UriParam(d.policy, "policy").empty() || d.policy != resp.gate_policy()) {
    return absl::FailedPreconditionError("the signed decision states another gate policy");
  }
  std::vector<std::string> contents;
  for (const evidence::Subject& s : d.subjects) {
    if (s.name == evidence::kManifestRootSubject) contents.push_back(s.sha256);
  }
  if (contents.size() != 1 || contents[0] != resp.manifest_root()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the signed decision is not about content ", resp.manifest_root()));
  }
  const std::string& content = contents[0];
  for (const auto& [expected, where] : q.contents) {
    if (content != expected) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the signed decision is about content ", content, ", not ", expected, " (", where,
          ")"));
    }
  }
  if (now - t > q.max_age) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the signed decision was made at ", d.time, ", more than --max-age ",
        absl::FormatDuration(q.max_age), " ago"));
  }
  if (newest && t < *newest) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the signed decision was made at ", d.time, ", before the newest decision already seen "
        "for this root, policy and source (",
        absl::FormatTime(absl::RFC3339_full, *newest, absl::UTCTimeZone()), ")"));
  }
  return absl::OkStatus();
}

int Gate(const RemoteArgs& a) {
  auto asked = AskedOf(a);
  if (!asked.ok()) return ReportError(asked.status());
  auto trust = LoadTrust(a.trust);
  if (!trust.ok()) return ReportError(trust.status());
  auto state = GateState::Load();
  if (!state.ok()) return ReportError(state.status());
  auto remote = Connect(a.connect);
  if (!remote.ok()) return ReportError(remote.status());
  pb::GateRequest req;
  req.set_root(DaemonPath(a.root));
  req.set_policy(a.policy);
  req.set_source_manifest_root(a.source_manifest_root);
  if (auto s = AddRootMap(a.map_root, req.mutable_root_map()); !s.ok()) return ReportError(s);
  pb::GateResponse resp;
  if (grpc::Status s = remote->stub->Gate(remote->Context().get(), req, &resp); !s.ok()) {
    return ReportRpcError(s);
  }
  // Any verified decision about this question, PASS or FAIL, is remembered: an older PASS
  // replayed after it is then refused.
  const absl::Time now = absl::Now();
  absl::Status checked = absl::OkStatus();
  std::string decided_at;
  absl::StatusOr<evidence::RecordIndex> d = VerifiedDecision(resp, *trust);
  if (!d.ok()) checked = d.status();
  if (checked.ok()) checked = CheckQuestion(*d, *asked);
  absl::StatusOr<absl::Time> t = checked.ok() ? DecisionTime(*d, now) : checked;
  if (checked.ok()) checked = t.status();
  const GateQuestion question{checked.ok() ? d->root : "", asked->policy, asked->source};
  if (checked.ok() && resp.pass()) {
    checked = CheckPass(*d, resp, *asked, *t, now, state->Newest(question));
  }
  if (checked.ok()) {
    decided_at = d->time;
    if (absl::Status s = state->Remember(question, *t); !s.ok()) return ReportError(s);
  }
  const bool pass = resp.pass() && checked.ok();
  std::string verified;
  if (resp.pass()) {
    verified = checked.ok()
                   ? absl::StrCat("decision signature and log inclusion verified; about ",
                                  d->root, " under ", d->policy, ", made at ", d->time)
                   : absl::StrCat("the server said PASS but its decision does not verify: ",
                                  checked.message());
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
    if (!decided_at.empty()) j["decision_time"] = decided_at;
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
  cmd->add_option("--server", a->connect.server,
                  "ckpt-auditd address (default: $CKPT_AUDIT_SERVER, then the config file, then "
                  "127.0.0.1:7433)");
  cmd->add_option("--token-file", a->connect.token_file,
                  "file holding the bearer token (default: $CKPT_AUDIT_TOKEN holds the token, else "
                  "the config file's token-file)");
  cmd->add_option("--tls-ca", a->connect.ca, "CA certificate(s) to verify the daemon: use TLS");
  cmd->add_option("--tls-cert", a->connect.cert,
                  "client certificate for mutual TLS (with --tls-key)");
  cmd->add_option("--tls-key", a->connect.key, "client private key for mutual TLS");
  cmd->add_flag("--insecure-loopback", a->connect.insecure_loopback,
                "send the token to a loopback server without TLS (any local process could be "
                "listening on that port)");
  cmd->add_option("--policy", a->policy, "policy name (default: the daemon's)");
  cmd->add_flag("--json", a->json, "machine-readable output");
}

}  // namespace

void AddRemoteCommands(CLI::App& app, int* exit_code) {
  auto submit = std::make_shared<RemoteArgs>();
  auto* s = app.add_subcommand("submit", "Run an audit on ckpt-auditd and follow its progress");
  AddCommon(s, submit.get());
  s->add_option("--source", submit->source, "source checkpoint for a pair audit");
  s->callback([=] {
    absl::Status resolved = ResolveConnect(&submit->connect);
    *exit_code = resolved.ok() ? Submit(*submit) : ReportError(resolved);
  });

  auto gate = std::make_shared<RemoteArgs>();
  auto* g = app.add_subcommand("gate", "Ask ckpt-auditd for a verified pass/fail on a root");
  AddCommon(g, gate.get());
  g->add_option("--trust", gate->trust,
                "trust file with the daemon's public key (default: per-user)");
  g->add_option("--source-manifest-root", gate->source_manifest_root,
                "only a pair audit against the source with this OMS ROOT may decide");
  g->add_option("--map-root", gate->map_root,
                "/DECLARED=/ACTUAL: where an X4T container's declared root is (repeatable)");
  g->add_option("--expect-root", gate->expect_root,
                "a PASS must be about the content with this OMS ROOT (e.g. from the transcode "
                "provenance)");
  g->add_flag("--verify-local", gate->verify_local,
              "fingerprint ROOT here: a PASS must be about the content on this disk");
  g->add_option("--max-age", gate->max_age,
                "a PASS must have been decided within this long (default 10m)");
  g->callback([=] {
    absl::Status resolved = ResolveConnect(&gate->connect);
    *exit_code = resolved.ok() ? Gate(*gate) : ReportError(resolved);
  });
}

}  // namespace ckpt::cli
