#include "services/daemon/grpc_service.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/text/name_encoding.h"
#include "grpc/grpc_security_constants.h"
#include "services/daemon/request_checks.h"

namespace ckpt::daemon {
namespace {

namespace pb = ckpt_audit::v1;

// Calls waiting for a work thread beyond which new ones are refused (RESOURCE_EXHAUSTED).
constexpr size_t kMaxWaitingWork = 1024;

// proto3 `string` fields must hold valid UTF-8 or the peer refuses the message, and roots,
// error messages and (from a tampered log) stored fields can carry any bytes. Every string this
// adapter sends that is not a fixed literal goes through Text: the name encoding, a no-op for
// valid UTF-8 (docs/evidence.md, "Name encoding").
std::string Text(absl::string_view s) { return EncodeName(std::string_view(s.data(), s.size())); }

// absl and gRPC share the canonical code numbering.
grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), Text(s.message()));
}

pb::JobState ToProto(JobState s) {
  switch (s) {
    case JobState::kQueued: return pb::JOB_STATE_QUEUED;
    case JobState::kRunning: return pb::JOB_STATE_RUNNING;
    case JobState::kSucceeded: return pb::JOB_STATE_SUCCEEDED;
    case JobState::kFailed: return pb::JOB_STATE_FAILED;
    case JobState::kCancelled: return pb::JOB_STATE_CANCELLED;
    case JobState::kInterrupted: return pb::JOB_STATE_INTERRUPTED;
  }
  return pb::JOB_STATE_UNSPECIFIED;
}

// The job as the manager knows it; for a finished audit also what its signed record states about
// the content's origin, read from the verified index (never from the jobs table).
void FillJob(const AuditBackend& backend, const JobSnapshot& s, pb::Job* out) {
  out->set_id(s.id);
  out->set_state(ToProto(s.state));
  out->set_root(Text(s.spec.root));
  out->set_source_root(Text(s.spec.source_root));
  out->set_policy(Text(s.spec.policy));
  for (const auto& m : s.spec.root_map) {
    pb::RootMapping* pm = out->add_root_map();
    pm->set_declared(Text(m.declared));
    pm->set_actual(Text(m.actual));
  }
  out->set_forward_layers(Text(s.spec.forward_layers));
  out->set_device(Text(s.spec.device));
  out->set_emulate(Text(s.spec.emulate));
  out->set_parts(s.spec.parts);
  out->set_executor_job(Text(s.spec.executor_job));
  out->set_verdict(Text(s.outcome.verdict));
  out->set_record_id(s.outcome.record_id);
  out->set_error_code(static_cast<int32_t>(s.error.code()));
  out->set_error_message(Text(s.error.message()));
  out->set_created_at(s.created_at);
  out->set_finished_at(s.finished_at);
  for (const JobReferrer& r : s.outcome.referrers) {
    pb::Referrer* pr = out->add_referrers();
    pr->set_digest(Text(r.digest));
    pr->set_predicate_type(Text(r.predicate_type));
    pr->set_referrers_api(r.referrers_api);
  }
  if (std::optional<AuditFacts> facts = backend.RecordFacts(s.outcome.record_id)) {
    out->set_layout(Text(facts->layout));
    out->set_source_layout(Text(facts->source_layout));
    out->set_model_ref(Text(facts->model_ref));
    out->set_source_ref(Text(facts->source_ref));
  }
}

void FillSummary(const storage::LogEntry& e, pb::AuditSummary* out) {
  out->set_id(static_cast<int64_t>(e.seq));
  // Stored fields: the log file may have been edited.
  out->set_root(Text(e.root));
  out->set_policy(Text(e.policy));
  out->set_verdict(Text(e.verdict));
  out->set_time(Text(e.time));
  out->set_predicate_type(Text(e.predicate_type));
}

std::string HashBytes(const storage::Hash& h) {
  return std::string(reinterpret_cast<const char*>(h.data()), h.size());
}

void FillProof(const InclusionProofResult& p, pb::InclusionProof* out) {
  out->set_leaf_index(static_cast<int64_t>(p.leaf_index));
  out->set_tree_size(static_cast<int64_t>(p.tree_size));
  for (const auto& h : p.hashes) out->add_hashes(HashBytes(h));
  out->set_root_hash(HashBytes(p.root));
  out->set_checkpoint(Text(p.checkpoint));  // stored: a tampered one then fails to verify
}

absl::StatusOr<std::vector<quant::RootMapping>> RootMapOf(
    const google::protobuf::RepeatedPtrField<pb::RootMapping>& in) {
  constexpr int kMaxMappings = 16;
  if (in.size() > kMaxMappings) {
    return absl::InvalidArgumentError(
        absl::StrCat("root_map: ", in.size(), " mappings; at most ", kMaxMappings));
  }
  std::vector<quant::RootMapping> out;
  for (int i = 0; i < in.size(); ++i) {
    auto m = CheckRootMapping(absl::StrCat("root_map[", i, "]"), in[i].declared(),
                              in[i].actual());
    if (!m.ok()) return m.status();
    out.push_back(*m);
  }
  return out;
}

// Cancelled once the client cancels or disconnects or the call's deadline passes; the backend
// polls it while it hashes, once per file and per read chunk, from its hashing threads too. On
// the callback API ServerContextBase::IsCancelled reads a flag the transport sets: no wait.
class CallProgress final : public Progress {
 public:
  explicit CallProgress(grpc::ServerContextBase* ctx) : ctx_(ctx), deadline_(ctx->deadline()) {}
  void Begin(std::string_view, uint64_t) override {}
  void Advance(uint64_t) override {}
  void End() override {}
  bool Cancelled() const override {
    return std::chrono::system_clock::now() > deadline_ || ctx_->IsCancelled();
  }
  grpc::Status Why() const {
    if (std::chrono::system_clock::now() > deadline_) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "gate deadline passed");
    }
    return grpc::Status(grpc::StatusCode::CANCELLED, "the caller cancelled the gate");
  }

 private:
  grpc::ServerContextBase* const ctx_;
  const std::chrono::system_clock::time_point deadline_;
};

// Why nobody waits for the answer to a call that waited for a work thread, if that is so.
std::optional<grpc::Status> Abandoned(grpc::ServerContextBase* ctx) {
  if (std::chrono::system_clock::now() > ctx->deadline()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                        "the deadline passed while the call waited for a work thread");
  }
  if (ctx->IsCancelled()) {
    return grpc::Status(grpc::StatusCode::CANCELLED,
                        "the caller left while the call waited for a work thread");
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<Caller> AuthenticateCall(const Authenticator& auth,
                                        const grpc::ServerContextBase& ctx) {
  std::vector<absl::string_view> authorization;
  auto range = ctx.client_metadata().equal_range("authorization");
  for (auto it = range.first; it != range.second; ++it) {
    authorization.emplace_back(it->second.data(), it->second.size());
  }
  std::string subject;
  if (auto props = ctx.auth_context()->FindPropertyValues(GRPC_X509_SUBJECT_PROPERTY_NAME);
      !props.empty()) {
    subject = std::string(props.front().data(), props.front().size());
  }
  return auth.Authenticate(authorization, std::move(subject));
}

grpc::Status GrpcAuditService::Authorize(grpc::ServerContextBase* ctx, absl::string_view method,
                                         Caller* caller) const {
  auto who = AuthenticateCall(auth_, *ctx);
  if (!who.ok()) return ToGrpc(who.status());
  absl::Status allowed = Authenticator::Authorize(
      *who, absl::StrCat("/", pb::AuditService::service_full_name(), "/", method));
  if (!allowed.ok()) return ToGrpc(allowed);
  if (caller != nullptr) *caller = *std::move(who);
  return grpc::Status::OK;
}

GrpcAuditService::GrpcAuditService(AuditBackend& backend, const Authenticator& auth,
                                   int work_threads)
    : backend_(backend),
      auth_(auth),
      watch_threads_(kMaxWatchers, kMaxWatchers),
      gate_lanes_(work_, kGatesRunningPerCaller, kGatesWaitingPerCaller),
      work_(work_threads, kMaxWaitingWork) {}

GrpcAuditService::WorkLoad GrpcAuditService::work_load() const {
  CallPool::Load pool = work_.load();
  return {pool.running, pool.waiting, gate_lanes_.waiting()};
}

grpc::ServerUnaryReactor* GrpcAuditService::Answer(grpc::CallbackServerContext* ctx,
                                                   grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcAuditService::Queue(grpc::CallbackServerContext* ctx,
                                                  absl::string_view method,
                                                  std::function<grpc::Status(const Caller&)> work,
                                                  bool gate) {
  // Before the queue: callers without the role never take a place in it.
  Caller caller;
  if (grpc::Status s = Authorize(ctx, method, &caller); !s.ok()) return Answer(ctx, std::move(s));
  const std::string invoker = caller.Invoker();
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  // The call, its request and response stay valid until Finish. A call whose caller left or
  // whose deadline passed while it waited does nothing: the caller would never learn of an
  // audit started or a job cancelled for it.
  auto run = [ctx, reactor, caller = std::move(caller), work = std::move(work)] {
    if (std::optional<grpc::Status> why = Abandoned(ctx)) {
      reactor->Finish(*why);
    } else {
      reactor->Finish(work(caller));
    }
  };
  auto busy = [reactor] {
    reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 absl::StrCat("daemon busy: ", kMaxWaitingWork,
                                              " gates, audits or log checks already wait")));
  };
  auto abandoned = [ctx] { return Abandoned(ctx).has_value(); };
  if (!gate) {
    if (!work_.Submit(std::move(run), std::move(abandoned))) busy();
  } else if (!gate_lanes_.Submit(invoker, std::move(run), std::move(abandoned), busy)) {
    // Each gate reads its whole tree: one caller's reads are bounded (docs/daemon.md "Limits").
    reactor->Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        Text(absl::StrCat(invoker, " already has ", kGatesRunningPerCaller, " gates running and ",
                          kGatesWaitingPerCaller, " waiting; retry when one has finished"))));
  }
  return reactor;
}

grpc::ServerUnaryReactor* GrpcAuditService::StartAudit(grpc::CallbackServerContext* ctx,
                                                       const pb::StartAuditRequest* req,
                                                       pb::Job* out) {
  return Queue(ctx, "StartAudit",
               [this, req, out](const Caller& caller) { return DoStartAudit(caller, req, out); });
}

grpc::ServerUnaryReactor* GrpcAuditService::GetJob(grpc::CallbackServerContext* ctx,
                                                   const pb::GetJobRequest* req, pb::Job* out) {
  return Answer(ctx, DoGetJob(ctx, req, out));
}

grpc::ServerUnaryReactor* GrpcAuditService::CancelJob(grpc::CallbackServerContext* ctx,
                                                      const pb::CancelJobRequest* req,
                                                      pb::Job* out) {
  return Queue(ctx, "CancelJob",
               [this, req, out](const Caller&) { return DoCancelJob(req, out); });
}

grpc::ServerUnaryReactor* GrpcAuditService::Gate(grpc::CallbackServerContext* ctx,
                                                 const pb::GateRequest* req,
                                                 pb::GateResponse* out) {
  return Queue(
      ctx, "Gate", [this, ctx, req, out](const Caller& c) { return DoGate(c, ctx, req, out); },
      /*gate=*/true);
}

grpc::ServerUnaryReactor* GrpcAuditService::QueryAudits(grpc::CallbackServerContext* ctx,
                                                        const pb::QueryAuditsRequest* req,
                                                        pb::QueryAuditsResponse* out) {
  return Answer(ctx, DoQueryAudits(ctx, req, out));
}

grpc::ServerUnaryReactor* GrpcAuditService::GetRecord(grpc::CallbackServerContext* ctx,
                                                      const pb::GetRecordRequest* req,
                                                      pb::Record* out) {
  return Answer(ctx, DoGetRecord(ctx, req, out));
}

grpc::ServerUnaryReactor* GrpcAuditService::VerifyLog(grpc::CallbackServerContext* ctx,
                                                      const pb::VerifyLogRequest* req,
                                                      pb::VerifyLogResponse* out) {
  return Queue(ctx, "VerifyLog",
               [this, req, out](const Caller&) { return DoVerifyLog(req, out); });
}

grpc::ServerUnaryReactor* GrpcAuditService::GetInclusionProof(
    grpc::CallbackServerContext* ctx, const pb::GetInclusionProofRequest* req,
    pb::InclusionProof* out) {
  return Answer(ctx, DoGetInclusionProof(ctx, req, out));
}

grpc::Status GrpcAuditService::DoStartAudit(const Caller& caller, const pb::StartAuditRequest* req,
                                            pb::Job* out) {
  if (auto s = RequireNonEmpty("root", req->root()); !s.ok()) return ToGrpc(s);
  auto root_map = RootMapOf(req->root_map());
  if (!root_map.ok()) return ToGrpc(root_map.status());
  JobSpec spec;
  spec.root = req->root();
  spec.source_root = req->source_root();
  spec.policy = req->policy();
  spec.root_map = *root_map;
  spec.invoker = caller.Invoker();
  spec.forward_layers = req->forward_layers();
  spec.device = req->device();
  spec.emulate = req->emulate();
  spec.parts = req->parts();
  auto id = backend_.StartAudit(std::move(spec));
  if (!id.ok()) return ToGrpc(id.status());
  auto snapshot = backend_.jobs().Get(*id);
  if (!snapshot.ok()) return ToGrpc(snapshot.status());
  FillJob(backend_, *snapshot, out);
  return grpc::Status::OK;
}

// A WatchJob stream. JobManager::Watch blocks until the next event, so the stream's events are
// written from a watcher thread, which waits for each to be sent before the next.
class GrpcAuditService::JobWatch final : public grpc::ServerWriteReactor<pb::JobEvent> {
 public:
  // `open` counts the streams that hold a place among kMaxWatchers; this one gives its place
  // back when done, if it took one.
  JobWatch(std::atomic<int>& open, bool counted) : open_(open), counted_(counted) {}
  // Sends `event` and waits until gRPC is done with it; false when the stream broke.
  bool Write(const pb::JobEvent& event) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      event_ = event;
      writing_ = true;
    }
    StartWrite(&event_);
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !writing_; });
    return sent_;
  }
  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      sent_ = ok;
    }
    cv_.notify_one();
  }
  void OnDone() override {
    if (counted_) open_.fetch_sub(1);
    delete this;
  }

 private:
  std::atomic<int>& open_;
  const bool counted_;
  std::mutex mu_;
  std::condition_variable cv_;
  pb::JobEvent event_;    // guarded by mu_ until StartWrite, then gRPC's until OnWriteDone
  bool writing_ = false;  // guarded by mu_
  bool sent_ = false;     // guarded by mu_
};

grpc::ServerWriteReactor<pb::JobEvent>* GrpcAuditService::WatchJob(
    grpc::CallbackServerContext* ctx, const pb::WatchJobRequest* req) {
  grpc::Status refused = Authorize(ctx, "WatchJob");
  if (refused.ok()) refused = ToGrpc(CheckJobId("id", req->id()));
  // Each stream holds a watcher thread while it waits: a bounded number of them.
  if (refused.ok() && watchers_.fetch_add(1) >= kMaxWatchers) {
    watchers_.fetch_sub(1);
    refused = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                           absl::StrCat("more than ", kMaxWatchers,
                                        " WatchJob streams at once; poll GetJob instead"));
  }
  auto* watch = new JobWatch(watchers_, /*counted=*/refused.ok());
  if (!refused.ok()) {
    watch->Finish(refused);
    return watch;
  }
  // The call, its request and the reactor stay valid until Finish.
  auto run = [this, ctx, req, watch] { watch->Finish(DoWatchJob(ctx, req, *watch)); };
  if (!watch_threads_.Submit(std::move(run), [] { return false; })) {
    watch->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "no watcher thread"));
  }
  return watch;
}

grpc::Status GrpcAuditService::DoWatchJob(grpc::CallbackServerContext* ctx,
                                          const pb::WatchJobRequest* req, JobWatch& watch) {
  auto gone = [ctx] { return ctx->IsCancelled(); };
  absl::Status s = backend_.jobs().Watch(req->id(), [&](const JobEvent& e) {
    if (ctx->IsCancelled()) return false;
    pb::JobEvent msg;
    msg.set_phase(Text(e.phase));
    msg.set_done_units(e.done_units);
    msg.set_total_units(e.total_units);
    msg.set_message(Text(e.message));
    msg.set_done(e.done);
    if (e.done) {
      auto snapshot = backend_.jobs().Get(req->id());
      if (snapshot.ok()) FillJob(backend_, *snapshot, msg.mutable_job());
    }
    return watch.Write(msg);
  }, gone);
  return ToGrpc(s);
}

grpc::Status GrpcAuditService::DoGetJob(grpc::ServerContextBase* ctx, const pb::GetJobRequest* req,
                                        pb::Job* out) {
  if (grpc::Status s = Authorize(ctx, "GetJob"); !s.ok()) return s;
  if (auto s = CheckJobId("id", req->id()); !s.ok()) return ToGrpc(s);
  auto snapshot = backend_.jobs().Get(req->id());
  if (!snapshot.ok()) return ToGrpc(snapshot.status());
  FillJob(backend_, *snapshot, out);
  return grpc::Status::OK;
}

grpc::Status GrpcAuditService::DoCancelJob(const pb::CancelJobRequest* req, pb::Job* out) {
  if (auto s = CheckJobId("id", req->id()); !s.ok()) return ToGrpc(s);
  auto snapshot = backend_.jobs().Cancel(req->id());
  if (!snapshot.ok()) return ToGrpc(snapshot.status());
  FillJob(backend_, *snapshot, out);
  return grpc::Status::OK;
}

grpc::Status GrpcAuditService::DoGate(const Caller& caller, grpc::ServerContextBase* ctx,
                                      const pb::GateRequest* req, pb::GateResponse* out) {
  if (auto s = RequireNonEmpty("root", req->root()); !s.ok()) return ToGrpc(s);
  auto source = NormalizeDigest("source_manifest_root", req->source_manifest_root());
  if (!source.ok()) return ToGrpc(source.status());
  auto root_map = RootMapOf(req->root_map());
  if (!root_map.ok()) return ToGrpc(root_map.status());
  CallProgress progress(ctx);
  auto d = backend_.Gate({req->root(), req->policy(), *source, *root_map, caller.Invoker()},
                         progress);
  if (!d.ok()) {
    if (progress.Cancelled()) return progress.Why();
    return ToGrpc(d.status());
  }
  out->set_pass(d->pass);
  for (const auto& r : d->reasons) out->add_reasons(Text(r));
  out->set_record_id(d->record_id);
  out->set_decision_id(d->decision_id);
  out->set_manifest_root(d->manifest_root);
  out->set_decision_envelope(d->envelope);
  FillProof(d->proof, out->mutable_decision_proof());
  out->set_reused(d->reused);
  out->set_gate_policy(Text(d->policy_uri));
  out->set_source_manifest_root(Text(d->source_manifest_root));
  return grpc::Status::OK;
}

grpc::Status GrpcAuditService::DoQueryAudits(grpc::ServerContextBase* ctx,
                                             const pb::QueryAuditsRequest* req,
                                             pb::QueryAuditsResponse* out) {
  if (grpc::Status s = Authorize(ctx, "QueryAudits"); !s.ok()) return s;
  storage::QueryFilter f;
  auto digest = NormalizeDigest("digest", req->digest());
  if (!digest.ok()) return ToGrpc(digest.status());
  f.digest = *digest;
  auto root = NormalizePathFilter("root", req->root());
  if (!root.ok()) return ToGrpc(root.status());
  f.root = EncodeName(*root);  // records name roots in the name encoding
  if (auto s = CheckVerdict("verdict", req->verdict()); !s.ok()) return ToGrpc(s);
  f.verdict = req->verdict();
  f.policy = req->policy();
  auto since = ParseTimeField("since", req->since());
  if (!since.ok()) return ToGrpc(since.status());
  f.since = *since;
  auto until = ParseTimeField("until", req->until());
  if (!until.ok()) return ToGrpc(until.status());
  f.until = *until;
  auto limit = CheckLimit("limit", req->limit());
  if (!limit.ok()) return ToGrpc(limit.status());
  f.limit = *limit;
  if (auto s = CheckPageToken("page_token", req->page_token()); !s.ok()) return ToGrpc(s);
  f.page_token = req->page_token();
  auto type = PredicateTypeFilter("predicate_type", req->predicate_type());
  if (!type.ok()) return ToGrpc(type.status());
  f.predicate_type = *type;
  auto page = backend_.Query(f);
  if (!page.ok()) return ToGrpc(page.status());
  for (const auto& e : page->entries) FillSummary(e, out->add_audits());
  out->set_next_page_token(page->next_page_token);
  return grpc::Status::OK;
}

grpc::Status GrpcAuditService::DoGetRecord(grpc::ServerContextBase* ctx,
                                           const pb::GetRecordRequest* req, pb::Record* out) {
  if (grpc::Status s = Authorize(ctx, "GetRecord"); !s.ok()) return s;
  if (req->id() < 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "id: negative");
  auto e = backend_.GetRecord(static_cast<uint64_t>(req->id()));
  if (!e.ok()) return ToGrpc(e.status());
  out->set_id(req->id());
  out->set_envelope(e->envelope);
  FillSummary(*e, out->mutable_summary());
  return grpc::Status::OK;
}

grpc::Status GrpcAuditService::DoVerifyLog(const pb::VerifyLogRequest* req,
                                           pb::VerifyLogResponse* out) {
  auto v = backend_.VerifyLog(req->incremental());
  if (!v.ok()) return ToGrpc(v.status());
  out->set_ok(v->ok());
  out->set_entries(static_cast<int64_t>(v->entries));
  out->set_checkpoints(static_cast<int64_t>(v->checkpoints));
  for (const auto& p : v->problems) out->add_problems(Text(p));
  out->set_verified_from(static_cast<int64_t>(v->verified_from));
  return grpc::Status::OK;
}

grpc::Status GrpcAuditService::DoGetInclusionProof(grpc::ServerContextBase* ctx,
                                                   const pb::GetInclusionProofRequest* req,
                                                   pb::InclusionProof* out) {
  if (grpc::Status s = Authorize(ctx, "GetInclusionProof"); !s.ok()) return s;
  if (req->id() < 0) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "id: negative");
  auto p = backend_.InclusionProof(static_cast<uint64_t>(req->id()));
  if (!p.ok()) return ToGrpc(p.status());
  FillProof(*p, out);
  return grpc::Status::OK;
}

}  // namespace ckpt::daemon
