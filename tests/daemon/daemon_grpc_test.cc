// End-to-end: a real ckpt-auditd service on a loopback port, driven by a gRPC client. Each
// finding of the daemon review has a test here that plays the attack or the misuse.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>
#include <set>
#include <thread>

#include "core/audit/audit_checks.h"
#include "core/evidence/dsse.h"
#include "core/fingerprint/fingerprint.h"
#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "services/daemon/grpc_service.h"
#include "storage/merkle.h"
#include "storage/tlog_checkpoint.h"
#include "tests/evidence/log_test_util.h"
#include "tests/core/hf_layouts.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

namespace fs = std::filesystem;
namespace pb = ckpt_audit::v1;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::RawDb;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

storage::Hash ToHash(const std::string& bytes) {
  storage::Hash h{};
  std::copy(bytes.begin(), bytes.end(), h.begin());
  return h;
}

// Where the data of the first tensor of `shard` whose name contains `part` starts.
uint64_t TensorOffset(const fs::path& shard, const std::string& part) {
  auto f = ckpt::SafetensorsFile::Open(shard.string());
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return 0;
  for (const auto& t : (*f)->tensors()) {
    if (t.name.find(part) != std::string::npos) return (*f)->data_start() + t.begin;
  }
  ADD_FAILURE() << "no tensor named *" << part << "* in " << shard;
  return 0;
}

// Multiplies one NVFP4 global scale by 2: the pair audit of `root` must then fail.
void BreakGlobalScale(const fs::path& root) {
  fs::path shard = root / "model-00001-of-00002.safetensors";
  uint64_t offset = TensorOffset(shard, "weight_global_scale");
  ASSERT_NE(offset, 0u);
  auto bytes = ::ckpt::testing::ReadAll(shard);
  float v;
  std::memcpy(&v, &bytes[offset], 4);
  v *= 2;
  std::memcpy(&bytes[offset], &v, 4);
  ::ckpt::testing::WriteAll(shard, bytes);
}

// Holds the first audit's worker in AuditFinished until released, so a job submitted
// meanwhile stays queued (one worker) for as long as the test needs.
class HoldFirstAudit final : public AuditObserver {
 public:
  void AuditFinished(std::string_view, double, uint64_t) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (finished_++ > 0) return;
    cv_.notify_all();
    cv_.wait(lock, [&] { return released_; });
  }
  void GateDecided(bool) override {}
  void Attached(std::string_view, std::string_view, const absl::Status&) override {}
  void WaitHeld() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return finished_ > 0; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int finished_ = 0;
  bool released_ = false;
};

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = CopyFixture("mini-kimi-mxfp4", dir_);
    dst_ = CopyFixture("mini-kimi-nvfp4", dir_);
    db_ = (dir_ / "evidence.db").string();
    key_ = *evidence::SigningKey::Generate();
    trust_.Add(key_->public_key());
    Start();
  }
  void TearDown() override {
    hold_.Release();  // a test that failed while holding the worker must not hang the stop
    Stop();
  }

  // Submits an audit; the job's id.
  std::string Submit(const fs::path& root, const fs::path& source,
                     const std::vector<std::pair<std::string, std::string>>& root_map = {},
                     const std::string& forward_layers = "") {
    pb::StartAuditRequest req;
    req.set_root(root.string());
    if (!source.empty()) req.set_source_root(source.string());
    req.set_forward_layers(forward_layers);
    for (const auto& [declared, actual] : root_map) {
      pb::RootMapping* m = req.add_root_map();
      m->set_declared(declared);
      m->set_actual(actual);
    }
    pb::Job job;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->StartAudit(&ctx, req, &job);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return job.id();
  }
  // Follows a job's stream to its end; the final job.
  pb::Job Wait(const std::string& id) {
    pb::WatchJobRequest watch;
    watch.set_id(id);
    grpc::ClientContext wctx;
    auto reader = stub_->WatchJob(&wctx, watch);
    pb::JobEvent e;
    pb::Job last;
    while (reader->Read(&e)) {
      if (e.done()) last = e.job();
    }
    EXPECT_TRUE(reader->Finish().ok());
    return last;
  }

  void Start() {
    BackendOptions options;
    options.db_path = db_;
    options.allowed_roots = {dir_.path().string()};
    options.decision_reuse = decision_reuse_;
    options.observer = observer_;
    auto backend = AuditBackend::Create(options, *key_, trust_);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    service_ = std::make_unique<GrpcAuditService>(*backend_, auth_, work_threads_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = pb::AuditService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  void Stop() {
    if (server_) server_->Shutdown();
    server_.reset();
    service_.reset();
    backend_.reset();
  }
  // Polls (at most 30 s, a loaded machine) until the service's work calls are as `reached`
  // wants them: the tests of busy work threads assert only once they are busy.
  void WaitForWork(const std::function<bool(const GrpcAuditService::WorkLoad&)>& reached) {
    for (int i = 0; i < 6000; ++i) {
      if (reached(service_->work_load())) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    FAIL() << "the work calls never reached the state this test waits for";
  }

  // Starts an audit and follows its stream to the end; returns the final job.
  pb::Job AuditAndWait(const fs::path& root, const fs::path& source,
                       std::vector<std::string>* phases = nullptr,
                       const std::string& forward_layers = "") {
    pb::WatchJobRequest watch;
    watch.set_id(Submit(root, source, {}, forward_layers));
    grpc::ClientContext wctx;
    auto reader = stub_->WatchJob(&wctx, watch);
    pb::JobEvent e;
    pb::Job last;
    while (reader->Read(&e)) {
      if (phases) phases->push_back(e.phase());
      if (e.done()) last = e.job();
    }
    EXPECT_TRUE(reader->Finish().ok());
    return last;
  }

  grpc::Status TryGate(const pb::GateRequest& req, pb::GateResponse* resp) {
    grpc::ClientContext ctx;
    return stub_->Gate(&ctx, req, resp);
  }
  pb::GateResponse Gate(const fs::path& root, const std::string& source_root_hex = "",
                        const std::string& policy = "") {
    pb::GateRequest req;
    req.set_root(root.string());
    req.set_source_manifest_root(source_root_hex);
    req.set_policy(policy);
    pb::GateResponse resp;
    grpc::Status s = TryGate(req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }
  grpc::Status Query(const pb::QueryAuditsRequest& q, pb::QueryAuditsResponse* out) {
    grpc::ClientContext ctx;
    return stub_->QueryAudits(&ctx, q, out);
  }

  // The decision in a gate answer must verify: signature, then inclusion against the signed
  // checkpoint it came with.
  void ExpectDecisionVerifies(const pb::GateResponse& g) {
    auto env = evidence::ParseEnvelope(g.decision_envelope());
    ASSERT_TRUE(env.ok()) << env.status();
    EXPECT_TRUE(evidence::VerifyEnvelope(*env, trust_).ok());
    const pb::InclusionProof& p = g.decision_proof();
    const std::string& note = p.checkpoint();
    auto head = storage::VerifyCheckpoint(note, note.substr(0, note.find('\n')), trust_);
    ASSERT_TRUE(head.ok()) << head.status();
    EXPECT_EQ(p.leaf_index(), g.decision_id());
    std::vector<storage::Hash> hashes;
    for (const auto& h : p.hashes()) hashes.push_back(ToHash(h));
    EXPECT_TRUE(storage::VerifyInclusion(storage::LeafHash(evidence::AsBytes(g.decision_envelope())),
                                         p.leaf_index(), head->size, hashes, head->root)
                    .ok());
  }

  // A signed evidence record of `root` exactly as it is now, with the given checks, bound to a
  // source whose OMS ROOT is `source_manifest_root` (as the engine binds a pair audit's source).
  std::string RecordOf(const fs::path& root, const std::map<std::string, std::string>& checks,
                       const std::string& source_manifest_root,
                       const std::string& policy = "scale-window") {
    auto fp = FingerprintTree(fs::canonical(root).string(), {}, NoProgress());
    EXPECT_TRUE(fp.ok());
    evidence::EvidenceRecord r;
    r.root = fs::canonical(root).string();
    r.subjects = *audit::SubjectsOf(*fp);
    r.source = evidence::SourceBinding{"/models/source", source_manifest_root,
                                       {{"model.safetensors", std::string(64, '0')}}};
    r.policy = audit::PolicyRefOf(*audit::PolicyByName(policy));
    for (const auto& [name, verdict] : checks) {
      evidence::CheckResult c;
      c.name = name;
      c.verdict = verdict == "pass" ? evidence::Verdict::kPass : evidence::Verdict::kFail;
      r.checks.push_back(c);
    }
    r.started_at = r.finished_at = evidence::Rfc3339Now();
    auto payload = evidence::RecordPayload(r);
    EXPECT_TRUE(payload.ok()) << payload.status();
    return *evidence::SignEnvelope(*payload, evidence::kInTotoPayloadType, *key_);
  }
  // Appends with the daemon stopped (one writer at a time), then starts it again.
  void AppendOffline(const std::vector<std::string>& envelopes) {
    Stop();
    {
      auto log = storage::EvidenceLog::Open(db_, /*create=*/false);
      ASSERT_TRUE(log.ok()) << log.status();
      for (const auto& e : envelopes) ASSERT_TRUE((*log)->Append(e, *key_).ok());
    }
    Start();
  }
  // dir_/huge: one 1 TiB sparse file, which a gate hashes until its deadline stops it.
  void MakeSparseTree() {
    fs::create_directory(dir_ / "huge");
    int fd = ::open((dir_ / "huge" / "blob.bin").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 1ll << 40), 0);
    ::close(fd);
  }
  uint64_t LogSize() {
    auto log = storage::EvidenceLog::OpenReadOnly(db_);
    return *(*log)->Size();
  }

  TempDir dir_;
  fs::path src_, dst_;
  AuditObserver* observer_ = nullptr;
  absl::Duration decision_reuse_ = absl::Minutes(1);
  HoldFirstAudit hold_;  // installed as observer_ by the tests that need a busy worker
  std::string db_;
  std::optional<evidence::SigningKey> key_;
  evidence::TrustStore trust_;
  const Authenticator auth_ = Authenticator::NoAuth();  // roles: daemon_auth_test.cc
  int work_threads_ = GrpcAuditService::kDefaultWorkThreads;
  std::unique_ptr<AuditBackend> backend_;
  std::unique_ptr<GrpcAuditService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::AuditService::Stub> stub_;
};

TEST_F(DaemonTest, PairAuditThenGatePassesAndProofVerifies) {
  std::vector<std::string> phases;
  pb::Job job = AuditAndWait(dst_, src_, &phases);
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.verdict(), "pass");
  // Plain directories: the record states no layout and no refs.
  EXPECT_EQ(job.layout(), "");
  EXPECT_EQ(job.source_layout(), "");
  EXPECT_EQ(job.model_ref(), "");
  EXPECT_EQ(job.source_ref(), "");
  // The phases the proto documents, and no others.
  const std::set<std::string> documented = {"queued", "read", "scale-window", "verify-pair",
                                            "done"};
  for (const auto& p : phases) EXPECT_TRUE(documented.count(p)) << p;
  EXPECT_EQ(phases.front(), "queued");
  EXPECT_EQ(phases.back(), "done");

  pb::GateResponse gate = Gate(dst_);
  EXPECT_TRUE(gate.pass());
  EXPECT_EQ(gate.record_id(), job.record_id());
  EXPECT_GT(gate.decision_id(), job.record_id());
  EXPECT_THAT(gate.gate_policy(), HasSubstr("ckpt-audit:gate/derived-lossless@1"));
  ASSERT_FALSE(gate.reasons().empty());
  EXPECT_THAT(gate.reasons(0), HasSubstr("passed"));
  ExpectDecisionVerifies(gate);

  // The record is findable by the content digest the gate computed.
  pb::QueryAuditsRequest q;
  q.set_digest(gate.manifest_root());
  pb::QueryAuditsResponse page;
  ASSERT_TRUE(Query(q, &page).ok());
  ASSERT_EQ(page.audits_size(), 3);  // the audit record, its test result, the gate decision

  // An inclusion proof of the audit record verifies against the signed checkpoint's root.
  pb::GetRecordRequest rr;
  rr.set_id(job.record_id());
  pb::Record rec;
  grpc::ClientContext rctx;
  ASSERT_TRUE(stub_->GetRecord(&rctx, rr, &rec).ok());
  pb::GetInclusionProofRequest pr;
  pr.set_id(job.record_id());
  pb::InclusionProof proof;
  grpc::ClientContext pctx;
  ASSERT_TRUE(stub_->GetInclusionProof(&pctx, pr, &proof).ok());
  std::vector<storage::Hash> hashes;
  for (const auto& h : proof.hashes()) hashes.push_back(ToHash(h));
  storage::Hash root = ToHash(proof.root_hash());
  storage::Hash leaf = storage::LeafHash(evidence::AsBytes(rec.envelope()));
  EXPECT_TRUE(storage::VerifyInclusion(leaf, proof.leaf_index(), proof.tree_size(), hashes, root)
                  .ok());
  leaf[0] ^= 1;  // a different entry must not verify
  EXPECT_FALSE(
      storage::VerifyInclusion(leaf, proof.leaf_index(), proof.tree_size(), hashes, root).ok());

  pb::VerifyLogResponse v;
  grpc::ClientContext vctx;
  ASSERT_TRUE(stub_->VerifyLog(&vctx, pb::VerifyLogRequest(), &v).ok());
  EXPECT_TRUE(v.ok()) << (v.problems_size() ? v.problems(0) : "");
  EXPECT_EQ(v.entries(), 3);  // the audit record, its test result, the gate decision
}

TEST_F(DaemonTest, GateFailsForContentNeverAudited) {
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  // Change one byte of the audited checkpoint: the old record no longer covers it.
  fs::path shard = dst_ / "model-00002-of-00002.safetensors";
  auto bytes = ::ckpt::testing::ReadAll(shard);
  bytes.back() ^= 0x01;
  ::ckpt::testing::WriteAll(shard, bytes);
  pb::GateResponse gate = Gate(dst_);
  EXPECT_FALSE(gate.pass());
  ASSERT_FALSE(gate.reasons().empty());
  EXPECT_THAT(gate.reasons(0), HasSubstr("no audit record"));
  EXPECT_EQ(gate.record_id(), -1);
  ExpectDecisionVerifies(gate);
  // Finding 10: a decision that rests on no record lists no input attestation.
  auto env = evidence::ParseEnvelope(gate.decision_envelope());
  auto vsa = nlohmann::json::parse(env->payload);
  EXPECT_TRUE(vsa["predicate"]["inputAttestations"].empty());
  EXPECT_EQ(vsa["predicate"]["verificationResult"], "FAILED");
}

// Issue 21, finding 1: one E8M0 scale byte set to 0xFF (a NaN scale) through a shared mapping
// whose page an earlier write had already dirtied. On ext4 the second write changes neither
// mtime nor ctime, and a gate that reused digests by stat identity kept passing the old bytes.
// The gate reads the bytes on disk now.
TEST_F(DaemonTest, GateSeesAScaleWrittenThroughAnAlreadyDirtiedSharedMapping) {
  ASSERT_EQ(AuditAndWait(src_, "").verdict(), "pass");
  ASSERT_TRUE(Gate(src_).pass());  // gated once before, as in the review
  const fs::path shard = src_ / "model-00001-of-00002.safetensors";
  const uint64_t offset = TensorOffset(shard, "weight_scale");
  ASSERT_NE(offset, 0u);
  int fd = ::open(shard.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const size_t size = fs::file_size(shard);
  auto* map = static_cast<uint8_t*>(
      ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(map, MAP_FAILED);
  map[offset] = map[offset];  // dirties the page; the bytes are those audited
  ASSERT_EQ(::msync(map, size, MS_SYNC), 0);
  map[offset] = map[offset];  // dirty again: this write moved the times, the next one need not
  pb::GateResponse before = Gate(src_);
  EXPECT_TRUE(before.pass()) << (before.reasons_size() ? before.reasons(0) : "");
  ASSERT_NE(map[offset], 0xFF);
  map[offset] = 0xFF;
  pb::GateResponse after = Gate(src_);
  EXPECT_FALSE(after.pass());
  EXPECT_NE(after.manifest_root(), before.manifest_root());
  ASSERT_GT(after.reasons_size(), 0);
  EXPECT_THAT(after.reasons(0), HasSubstr("no audit record"));
  ASSERT_EQ(::msync(map, size, MS_SYNC), 0);
  ::munmap(map, size);
  ::close(fd);
  EXPECT_FALSE(Gate(src_).pass());  // and for as long as the daemon runs
  // Audited, the content fails on the NaN scale, and the gate says so.
  ASSERT_EQ(AuditAndWait(src_, "").verdict(), "fail");
  pb::GateResponse audited = Gate(src_);
  EXPECT_FALSE(audited.pass());
  std::string all;
  for (const auto& r : audited.reasons()) all += r + "\n";
  EXPECT_THAT(all, HasSubstr("nan-scale"));
}

TEST_F(DaemonTest, FailedAuditMakesGateFailWithReasons) {
  BreakGlobalScale(dst_);
  pb::Job job = AuditAndWait(dst_, src_);
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.verdict(), "fail");
  pb::GateResponse gate = Gate(dst_);
  EXPECT_FALSE(gate.pass());
  EXPECT_EQ(gate.record_id(), job.record_id());
  ASSERT_GE(gate.reasons_size(), 2);
  EXPECT_THAT(gate.reasons(1), HasSubstr("failed"));
}

// Finding 2: an audit that skipped the lossless proof cannot decide a derived checkpoint's gate,
// whether it is the only record or newer than a failing pair audit.
TEST_F(DaemonTest, DerivedCheckpointNeedsAPassingPairAudit) {
  pb::Job alone = AuditAndWait(dst_, "");
  ASSERT_EQ(alone.verdict(), "pass");  // structure fine, scale-window skipped: overall pass
  pb::GateResponse g1 = Gate(dst_);
  EXPECT_FALSE(g1.pass());
  EXPECT_THAT(g1.reasons(0), HasSubstr("pair_verify"));
  EXPECT_THAT(g1.reasons(0), HasSubstr("1 did not run every required check"));

  BreakGlobalScale(dst_);
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "fail");
  ASSERT_EQ(AuditAndWait(dst_, "").verdict(), "pass");  // the downgrade attempt
  pb::GateResponse g2 = Gate(dst_);
  EXPECT_FALSE(g2.pass());
  EXPECT_THAT(g2.reasons(0), HasSubstr("failed"));
}

// An MXFP4 original passes on structure and scale-window, with no pair audit.
TEST_F(DaemonTest, Mxfp4OriginalPassesOnStructureAndScaleWindow) {
  ASSERT_EQ(AuditAndWait(src_, "").verdict(), "pass");
  pb::GateResponse g = Gate(src_);
  EXPECT_TRUE(g.pass()) << (g.reasons_size() ? g.reasons(0) : "");
  EXPECT_THAT(g.gate_policy(), HasSubstr("mxfp4-original"));
}

// A Hugging Face cache snapshot (docs/hf-layouts.md) is audited and gated in place; a link
// whose target leaves the allow-list is refused even though the root itself is allowed.
TEST_F(DaemonTest, HubSnapshotIsAuditedAndGatedAndItsLinksStayInTheAllowList) {
  auto hub = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir_ / "hub", "org/m",
                                      "0123456789abcdef0123456789abcdef01234567");
  pb::Job job = AuditAndWait(hub.snapshot, "");
  ASSERT_EQ(job.verdict(), "pass") << job.error_message();
  // The job shows the layout and model ref its signed record states, on the final WatchJob
  // event and from GetJob.
  EXPECT_EQ(job.layout(), "hf-cache-snapshot");
  EXPECT_EQ(job.model_ref(), "org/m@0123456789abcdef0123456789abcdef01234567");
  EXPECT_EQ(job.source_layout(), "");  // no source
  {
    pb::GetJobRequest get;
    get.set_id(job.id());
    pb::Job got;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->GetJob(&ctx, get, &got).ok());
    EXPECT_EQ(got.layout(), job.layout());
    EXPECT_EQ(got.model_ref(), job.model_ref());
    // After a restart too: read from the verified log, which the daemon verifies in the
    // background first (empty until then).
    Stop();
    Start();
    got.Clear();
    for (int i = 0; i < 1200 && got.layout().empty(); ++i) {  // at most 30 s
      grpc::ClientContext c;
      ASSERT_TRUE(stub_->GetJob(&c, get, &got).ok());
      if (got.layout().empty()) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    EXPECT_EQ(got.layout(), "hf-cache-snapshot");
    EXPECT_EQ(got.model_ref(), job.model_ref());
  }
  pb::GateResponse g = Gate(hub.snapshot);
  EXPECT_TRUE(g.pass()) << (g.reasons_size() ? g.reasons(0) : "");

  TempDir other;
  testing::WriteAll(other / "x.json", std::string("{}"));
  fs::create_directory_symlink(other.path(), hub.repo / "elsewhere");
  fs::create_symlink("../../elsewhere/x.json", hub.snapshot / "extra.json");
  pb::Job refused = AuditAndWait(hub.snapshot, "");
  EXPECT_EQ(refused.state(), pb::JOB_STATE_FAILED);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(refused.error_message(), HasSubstr("extra.json"));
  pb::GateRequest req;
  req.set_root(hub.snapshot.string());
  pb::GateResponse resp;
  EXPECT_EQ(TryGate(req, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// A newer failing record of the required scope revokes an older pass; with a pinned source,
// only records bound to that source are in scope.
TEST_F(DaemonTest, PinnedSourceAndRevocation) {
  const std::string a(64, 'a'), b(64, 'b');
  const std::map<std::string, std::string> pass = {{"checkpoint_structure", "pass"},
                                                   {"pair_verify", "pass"}};
  const std::map<std::string, std::string> fail = {{"checkpoint_structure", "pass"},
                                                   {"pair_verify", "fail"}};
  AppendOffline({RecordOf(dst_, pass, a)});
  EXPECT_TRUE(Gate(dst_).pass());
  EXPECT_TRUE(Gate(dst_, a).pass());
  pb::GateResponse other = Gate(dst_, b);
  EXPECT_FALSE(other.pass());
  EXPECT_THAT(other.reasons(0), HasSubstr("against source " + b));
  // Pins are normalised: upper case and a sha256: prefix name the same source.
  std::string upper = "SHA256:" + std::string(64, 'A');
  EXPECT_TRUE(Gate(dst_, upper).pass());

  // A newer failing pair audit against b says nothing about a: the unpinned gate still passes,
  // on the record against a, and names a (issue 21, finding 9; before, b's failure revoked it).
  AppendOffline({RecordOf(dst_, fail, b)});
  pb::GateResponse unpinned = Gate(dst_);
  EXPECT_TRUE(unpinned.pass());
  EXPECT_EQ(unpinned.source_manifest_root(), a);
  EXPECT_TRUE(Gate(dst_, a).pass());
  EXPECT_FALSE(Gate(dst_, b).pass());
  AppendOffline({RecordOf(dst_, fail, a)});  // against a: revokes the passes that rest on a
  EXPECT_FALSE(Gate(dst_, a).pass());
  EXPECT_FALSE(Gate(dst_).pass());
}

// Issue 21, finding 9, the attack as played: a scale-window pass and a marlin-safe pass against
// source a, then a newer failing pair audit against another source. Another source's failure is
// no lever to block a release; a failure of the content itself revokes under every policy.
// Unpinned passes name, in the signed decision, the source ROOT they rest on.
TEST_F(DaemonTest, RevocationFollowsWhatAFailureIsAbout) {
  const std::string a(64, 'a'), b(64, 'b');
  const std::map<std::string, std::string> pass = {{"checkpoint_structure", "pass"},
                                                   {"pair_verify", "pass"}};
  const std::map<std::string, std::string> pair_fail = {{"checkpoint_structure", "pass"},
                                                        {"pair_verify", "fail"}};
  const std::map<std::string, std::string> content_fail = {{"checkpoint_structure", "fail"},
                                                           {"pair_verify", "pass"}};
  AppendOffline({RecordOf(dst_, pass, a), RecordOf(dst_, pass, a, "marlin-safe"),
                 RecordOf(dst_, pair_fail, b)});
  for (const std::string policy : {"", "marlin-safe"}) {
    pb::GateResponse g = Gate(dst_, "", policy);
    EXPECT_TRUE(g.pass()) << policy << ": " << (g.reasons_size() ? g.reasons(0) : "");
    EXPECT_EQ(g.source_manifest_root(), a);
    ExpectDecisionVerifies(g);
    auto env = evidence::ParseEnvelope(g.decision_envelope());
    ASSERT_TRUE(env.ok());
    auto vsa = nlohmann::json::parse(env->payload);
    EXPECT_EQ(vsa["predicate"]["source"]["manifest_root"], a) << policy;
    EXPECT_THAT(vsa["predicate"]["policy"]["uri"].get<std::string>(), Not(HasSubstr("source=")));
  }
  EXPECT_FALSE(Gate(dst_, b).pass());

  AppendOffline({RecordOf(dst_, content_fail, b)});
  for (const std::string policy : {"", "marlin-safe"}) {
    for (const std::string& pin : {std::string(), a}) {
      pb::GateResponse g = Gate(dst_, pin, policy);
      EXPECT_FALSE(g.pass()) << policy << " pinned to '" << pin << "'";
      ASSERT_GT(g.reasons_size(), 0);
      EXPECT_THAT(g.reasons(0), HasSubstr("content itself"));
      EXPECT_EQ(g.source_manifest_root(), "");
    }
  }
}

// A pair audit through the daemon binds its source by content; a gate pinned to that source's
// OMS ROOT passes, pinned to another it does not.
TEST_F(DaemonTest, PairAuditDecidesAGatePinnedToItsSource) {
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  auto source = FingerprintTree(fs::canonical(src_).string(), {}, NoProgress());
  ASSERT_TRUE(source.ok());
  pb::GateResponse pinned = Gate(dst_, source->manifest.RootHex());
  EXPECT_TRUE(pinned.pass()) << (pinned.reasons_size() ? pinned.reasons(0) : "");
  EXPECT_THAT(pinned.gate_policy(), HasSubstr("&source=" + source->manifest.RootHex()));
  EXPECT_FALSE(Gate(dst_, std::string(64, 'c')).pass());
}

// Finding 3: index rows are not evidence. Rows inserted or changed with sqlite3 (triggers
// dropped, as the file's owner can) never make a gate pass, while running or after a restart:
// a subject row that files a passing record of other content under this content's ROOT, and a
// verdict column flipped to pass.
TEST_F(DaemonTest, IndexTablesCannotMakeAGatePass) {
  pb::Job other = AuditAndWait(src_, "");
  ASSERT_EQ(other.verdict(), "pass");
  pb::GateResponse never = Gate(dst_);  // dst_ was never audited
  ASSERT_FALSE(never.pass());
  fs::path broken = dir_ / "broken";
  fs::copy(dst_, broken, fs::copy_options::recursive);
  BreakGlobalScale(broken);
  pb::Job failing = AuditAndWait(broken, src_);
  ASSERT_EQ(failing.verdict(), "fail");
  {
    RawDb db(db_);
    db.DropTriggers();
    ASSERT_EQ(db.Exec("DROP TRIGGER subjects_of_newest"), SQLITE_OK);
    ASSERT_EQ(db.Exec(absl::StrCat("INSERT INTO subjects(seq, name, sha256) VALUES(",
                                   other.record_id(), ", 'oms-manifest-root', '",
                                   never.manifest_root(), "')")),
              SQLITE_OK);
    ASSERT_EQ(db.Exec(absl::StrCat("UPDATE entries SET verdict = 'pass' WHERE seq = ",
                                   failing.record_id())),
              SQLITE_OK);
  }
  for (int restart = 0; restart < 2; ++restart) {
    if (restart) {
      Stop();
      Start();
    }
    pb::GateResponse g1 = Gate(dst_);
    EXPECT_FALSE(g1.pass());
    EXPECT_EQ(g1.record_id(), -1);
    pb::GateResponse g2 = Gate(broken);
    EXPECT_FALSE(g2.pass());
    EXPECT_EQ(g2.record_id(), failing.record_id());
  }
}

// Rewriting an entry's bytes breaks the signed tree: gates are refused, not decided.
TEST_F(DaemonTest, GatesAreRefusedWhenTheLogDoesNotMatchItsCheckpoint) {
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  Stop();
  {
    RawDb db(db_);
    db.DropTriggers();
    db.SetBlob("UPDATE entries SET envelope = ? WHERE seq = 0",
               ::ckpt::testing::SampleEnvelope(*key_, 1));
  }
  Start();
  pb::GateRequest req;
  req.set_root(dst_.string());
  pb::GateResponse resp;
  grpc::Status s = TryGate(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), HasSubstr("signed checkpoint"));
}

// The envelope cache (audit_backend.h) keys on the log index and holds only bytes that matched
// the verified entry. A failing decision read back once, then rewritten in the database as a
// validly signed passing decision (of other content), with the record's verdict column flipped
// too: the running daemon still answers with the verified failing decision, and after a restart
// (no cache) the rewritten row breaks the signed tree, so gates are refused.
TEST_F(DaemonTest, RowRewrittenAfterACachedReadCannotChangeAGate) {
  fs::path broken = dir_ / "broken";
  fs::copy(dst_, broken, fs::copy_options::recursive);
  BreakGlobalScale(broken);
  pb::Job failing_audit = AuditAndWait(broken, src_);
  ASSERT_EQ(failing_audit.verdict(), "fail");
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  pb::GateResponse failing = Gate(broken);
  ASSERT_FALSE(failing.pass());
  pb::GateResponse reused = Gate(broken);  // read back from the log, checked, cached
  ASSERT_TRUE(reused.reused());
  ASSERT_EQ(reused.decision_envelope(), failing.decision_envelope());
  pb::GateResponse passing = Gate(dst_);
  ASSERT_TRUE(passing.pass());
  {
    RawDb db(db_);
    db.DropTriggers();
    db.SetBlob(absl::StrCat("UPDATE entries SET envelope = ? WHERE seq = ", failing.decision_id()),
               passing.decision_envelope());
    ASSERT_EQ(db.Exec(absl::StrCat("UPDATE entries SET verdict = 'pass' WHERE seq = ",
                                   failing_audit.record_id())),
              SQLITE_OK);
  }
  pb::GateResponse again = Gate(broken);
  EXPECT_FALSE(again.pass());
  EXPECT_TRUE(again.reused());
  EXPECT_EQ(again.decision_id(), failing.decision_id());
  EXPECT_EQ(again.decision_envelope(), failing.decision_envelope());
  ExpectDecisionVerifies(again);
  Stop();
  Start();
  pb::GateRequest req;
  req.set_root(broken.string());
  pb::GateResponse resp;
  grpc::Status s = TryGate(req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_FALSE(resp.pass());
}

// Finding 6: repeated gates on unchanged content read no file bytes and append nothing.
TEST_F(DaemonTest, RepeatedGateReusesItsDecision) {
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  pb::GateResponse first = Gate(dst_);
  ASSERT_TRUE(first.pass());
  EXPECT_FALSE(first.reused());
  uint64_t size = LogSize();
  GateRequest req{dst_.string(), "", "", {}};
  auto again = backend_->Gate(req, NoProgress());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->reused);
  EXPECT_EQ(again->decision_id, first.decision_id());
  EXPECT_GT(again->hashed_bytes, 0u);  // the bytes are read again (issue 21)
  EXPECT_EQ(LogSize(), size);
  pb::GateResponse third = Gate(dst_);
  EXPECT_TRUE(third.reused());
  ExpectDecisionVerifies(third);
  // A new audit of the same content changes what the decision rests on: a new decision.
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  pb::GateResponse fourth = Gate(dst_);
  EXPECT_FALSE(fourth.reused());
  EXPECT_GT(fourth.decision_id(), third.decision_id());
}

// Issue 21 item 3: clients refuse old decisions (`ckpt-audit gate --max-age`), so an identical
// decision is returned again only while it is recent; after that a gate signs a fresh one.
TEST_F(DaemonTest, GateReusesADecisionOnlyWhileItIsRecent) {
  Stop();
  decision_reuse_ = absl::Seconds(1);
  Start();
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  pb::GateResponse first = Gate(dst_);
  ASSERT_TRUE(first.pass());
  pb::GateResponse again = Gate(dst_);
  EXPECT_TRUE(again.reused());
  EXPECT_EQ(again.decision_id(), first.decision_id());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  pb::GateResponse later = Gate(dst_);
  EXPECT_TRUE(later.pass());
  EXPECT_FALSE(later.reused());
  EXPECT_GT(later.decision_id(), first.decision_id());
  ExpectDecisionVerifies(later);
}

// Finding 6: a gate stops when its caller's deadline passes (a 1 TiB sparse file would keep a
// core busy for minutes); TearDown's Shutdown waits for the handler to return.
TEST_F(DaemonTest, GateStopsAtTheCallersDeadline) {
  ASSERT_NO_FATAL_FAILURE(MakeSparseTree());
  pb::GateRequest req;
  req.set_root((dir_ / "huge").string());
  pb::GateResponse resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  grpc::Status s = stub_->Gate(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The handler has returned once the server can shut down; nothing was appended.
  Stop();
  EXPECT_EQ(LogSize(), 0u);
}

// Gates run on the work threads (grpc_service.h), reads on gRPC's own: with the only work
// thread hashing a 1 TiB sparse file, reads still answer at once, and the next gate waits its
// turn and is then decided.
TEST_F(DaemonTest, ReadsAnswerWhileEveryWorkThreadIsBusy) {
  Stop();
  work_threads_ = 1;
  Start();
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  ASSERT_NO_FATAL_FAILURE(MakeSparseTree());
  auto gate_with_deadline = [&](const fs::path& root, std::chrono::milliseconds deadline) {
    pb::GateRequest req;
    req.set_root(root.string());
    auto resp = std::make_shared<pb::GateResponse>();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + deadline);
    grpc::Status s = stub_->Gate(&ctx, req, resp.get());
    return std::make_pair(s, resp);
  };
  auto slow = std::async(std::launch::async, gate_with_deadline, dir_ / "huge",
                         std::chrono::milliseconds(3000));
  WaitForWork([](const auto& w) { return w.running == 1; });  // the slow gate is hashing
  auto next = std::async(std::launch::async, gate_with_deadline, dst_,
                         std::chrono::milliseconds(20000));
  WaitForWork([](const auto& w) { return w.waiting == 1; });  // the next one waits its turn
  for (int i = 0; i < 20; ++i) {
    pb::QueryAuditsResponse page;
    ASSERT_TRUE(Query({}, &page).ok());
    EXPECT_FALSE(page.audits().empty());
  }
  EXPECT_EQ(slow.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the reads waited for the gate";
  EXPECT_EQ(next.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "a second gate ran beside the first on one work thread";
  EXPECT_EQ(slow.get().first.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  auto [status, decided] = next.get();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_TRUE(decided->pass());
}

// Issue 21, finding 1: every gate reads its whole tree, so one caller's gates are bounded: at
// most kGatesRunningPerCaller of them take work threads, kGatesWaitingPerCaller more wait in the
// caller's lane, and one more is refused at once. The other work threads stay free for other
// work (before, one token's gates on a 1 TiB file filled all of them and VerifyLog waited).
TEST_F(DaemonTest, OneCallersGatesAreBoundedAndLeaveWorkThreadsFree) {
  ASSERT_NO_FATAL_FAILURE(MakeSparseTree());
  const auto until = std::chrono::system_clock::now() + std::chrono::seconds(4);
  auto gate = [&] {
    pb::GateRequest req;
    req.set_root((dir_ / "huge").string());
    pb::GateResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(until);
    return stub_->Gate(&ctx, req, &resp);
  };
  std::vector<std::future<grpc::Status>> admitted;
  for (size_t i = 0; i < GrpcAuditService::kGatesRunningPerCaller +
                             GrpcAuditService::kGatesWaitingPerCaller;
       ++i) {
    admitted.push_back(std::async(std::launch::async, gate));
  }
  WaitForWork([](const auto& w) {  // all of them admitted
    return w.running == GrpcAuditService::kGatesRunningPerCaller &&
           w.in_lanes == GrpcAuditService::kGatesWaitingPerCaller;
  });
  grpc::Status refused = gate();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(), HasSubstr("gates running"));
  pb::VerifyLogResponse v;
  grpc::ClientContext vctx;
  vctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
  grpc::Status verified = stub_->VerifyLog(&vctx, pb::VerifyLogRequest(), &v);
  EXPECT_TRUE(verified.ok()) << verified.error_message();
  EXPECT_LT(std::chrono::system_clock::now(), until) << "the test ran too slowly to tell";
  for (auto& f : admitted) {
    EXPECT_EQ(f.get().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
}

// A work call whose caller left or whose deadline passed while it waited for a work thread does
// nothing: no job is created for an audit request nobody will hear the answer to.
TEST_F(DaemonTest, QueuedWorkWhoseCallerLeftDoesNothing) {
  Stop();
  work_threads_ = 1;
  Start();
  ASSERT_THAT(AuditAndWait(dst_, src_).id(), ::testing::StartsWith("job-000001-"));
  ASSERT_NO_FATAL_FAILURE(MakeSparseTree());
  auto slow = std::async(std::launch::async, [&] {
    pb::GateRequest req;
    req.set_root((dir_ / "huge").string());
    pb::GateResponse resp;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
    return stub_->Gate(&ctx, req, &resp).error_code();
  });
  WaitForWork([](const auto& w) { return w.running == 1; });  // the only work thread hashing
  pb::StartAuditRequest req;
  req.set_root(dst_.string());
  req.set_source_root(src_.string());
  pb::Job job;
  grpc::ClientContext expiring;
  expiring.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  EXPECT_EQ(stub_->StartAudit(&expiring, req, &job).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);
  grpc::ClientContext leaving;
  auto left = std::async(std::launch::async,
                         [&] { return stub_->StartAudit(&leaving, req, &job).error_code(); });
  WaitForWork([](const auto& w) { return w.waiting == 2; });  // the expired call and this one
  leaving.TryCancel();
  EXPECT_EQ(left.get(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(slow.get(), grpc::StatusCode::DEADLINE_EXCEEDED);
  // The work thread took the two abandoned calls first, in order; had either started an
  // audit, this one would not be the second job.
  EXPECT_THAT(Submit(dst_, src_), ::testing::StartsWith("job-000002-"));
}

// The idle release (serving.h) closes the read connections no call holds: reads racing it
// still answer, from a reopened connection, and the pool never waits for a closed one.
TEST_F(DaemonTest, ReadsSurviveClosingIdleReaders) {
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  std::atomic<bool> done{false};
  std::thread closer([&] {
    while (!done) backend_->CloseIdleReaders();
  });
  std::vector<std::thread> readers;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        if (!backend_->Query({}).ok() || !backend_->GetRecord(0).ok()) ++failures;
      }
    });
  }
  for (auto& t : readers) t.join();
  done = true;
  closer.join();
  EXPECT_EQ(failures.load(), 0);
  backend_->CloseIdleReaders();
  auto page = backend_->Query({});
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_FALSE(page->entries.empty());
}

// Finding 7: VerifyLog runs on its own connection; reads and appends go on while it runs.
TEST_F(DaemonTest, ReadsProceedWhileVerifyLogRuns) {
  Stop();
  {
    auto log = storage::EvidenceLog::Open(db_, /*create=*/false);
    std::vector<std::string> many;
    for (int i = 0; i < 1000; ++i) many.push_back(::ckpt::testing::SampleEnvelope(*key_, i));
    ASSERT_TRUE((*log)->AppendBatch(many, *key_).ok());
  }
  Start();
  auto verifying = std::async(std::launch::async, [&] { return backend_->VerifyLog(false); });
  int reads_during = 0;
  storage::QueryFilter f;
  f.limit = 10;
  while (verifying.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    ASSERT_TRUE(backend_->Query(f).ok());
    ASSERT_TRUE(backend_->GetRecord(7).ok());
    if (verifying.wait_for(std::chrono::seconds(0)) != std::future_status::ready) ++reads_during;
  }
  auto full = verifying.get();
  ASSERT_TRUE(full.ok()) << full.status();
  EXPECT_TRUE(full->ok()) << full->problems[0];
  // Serialised behind the verification, at most a read that started before it could finish.
  EXPECT_GE(reads_during, 5);

  // Incremental: only what was appended since, through the consistency proof.
  ASSERT_EQ(AuditAndWait(dst_, src_).verdict(), "pass");
  pb::VerifyLogRequest inc;
  inc.set_incremental(true);
  pb::VerifyLogResponse v;
  grpc::ClientContext vctx;
  ASSERT_TRUE(stub_->VerifyLog(&vctx, inc, &v).ok());
  EXPECT_TRUE(v.ok()) << (v.problems_size() ? v.problems(0) : "");
  EXPECT_EQ(v.verified_from(), 1000);
  EXPECT_EQ(v.entries(), 1002);  // the record and its test result
  EXPECT_EQ(v.checkpoints(), 2);
}

// Finding 10: every request field is checked, and the error names the field.
TEST_F(DaemonTest, InvalidRequestFieldsAreNamed) {
  auto query_error = [&](const std::function<void(pb::QueryAuditsRequest&)>& set) {
    pb::QueryAuditsRequest q;
    set(q);
    pb::QueryAuditsResponse out;
    grpc::Status s = Query(q, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    return s.error_message();
  };
  EXPECT_THAT(query_error([](auto& q) { q.set_verdict("maybe"); }), HasSubstr("verdict"));
  EXPECT_THAT(query_error([](auto& q) { q.set_limit(-1); }), HasSubstr("limit"));
  EXPECT_THAT(query_error([](auto& q) { q.set_limit(1001); }), HasSubstr("limit"));
  EXPECT_THAT(query_error([](auto& q) { q.set_digest("abc"); }), HasSubstr("digest"));
  EXPECT_THAT(query_error([](auto& q) { q.set_since("yesterday"); }), HasSubstr("since"));
  EXPECT_THAT(query_error([](auto& q) { q.set_until("2026-13-01T00:00:00Z"); }),
              HasSubstr("until"));
  EXPECT_THAT(query_error([](auto& q) { q.set_root("relative/path"); }), HasSubstr("root"));
  EXPECT_THAT(query_error([](auto& q) { q.set_page_token("x"); }), HasSubstr("page_token"));
  EXPECT_THAT(query_error([](auto& q) { q.set_predicate_type("other"); }),
              HasSubstr("predicate_type"));

  pb::StartAuditRequest empty;
  pb::Job job;
  grpc::ClientContext c1;
  grpc::Status s1 = stub_->StartAudit(&c1, empty, &job);
  EXPECT_EQ(s1.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s1.error_message(), HasSubstr("root"));
  pb::GateRequest gate;
  pb::GateResponse resp;
  grpc::Status s2 = TryGate(gate, &resp);
  EXPECT_EQ(s2.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s2.error_message(), HasSubstr("root"));
  gate.set_root(dst_.string());
  gate.set_source_manifest_root("not-hex");
  EXPECT_THAT(TryGate(gate, &resp).error_message(), HasSubstr("source_manifest_root"));
  gate.set_source_manifest_root("");
  gate.set_policy("lenient");
  EXPECT_THAT(TryGate(gate, &resp).error_message(), HasSubstr("policy"));
  pb::GetJobRequest bad_id;
  bad_id.set_id("../etc");
  grpc::ClientContext c3;
  EXPECT_EQ(stub_->GetJob(&c3, bad_id, &job).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// StartAudit's block forward: every layer on the CPU into the signed record; bad forward fields
// are INVALID_ARGUMENT; a GPU request without a usable GPU is FAILED_PRECONDITION, never a CPU
// run, and queues nothing.
TEST_F(DaemonTest, ForwardLayersInAuditsAndGpuRequests) {
  pb::Job job = AuditAndWait(dst_, src_, nullptr, "all");
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.verdict(), "pass");
  EXPECT_EQ(job.forward_layers(), "all");
  auto log = storage::EvidenceLog::OpenReadOnly(db_);
  ASSERT_TRUE(log.ok());
  auto entry = (*log)->Get(static_cast<uint64_t>(job.record_id()));
  ASSERT_TRUE(entry.ok()) << entry.status();
  auto envelope = evidence::ParseEnvelope(entry->envelope);
  ASSERT_TRUE(envelope.ok());
  auto statement = nlohmann::json::parse(envelope->payload);
  const auto& forward = statement["predicate"]["block_forward"];
  EXPECT_EQ(forward["layers_run"], 2);
  EXPECT_EQ(forward["device"], "cpu");
  EXPECT_EQ(forward["summary"][1]["verdict"], "bit-identical");

  auto start = [&](const std::function<void(pb::StartAuditRequest&)>& set) {
    pb::StartAuditRequest req;
    req.set_root(dst_.string());
    req.set_source_root(src_.string());
    set(req);
    pb::Job out;
    grpc::ClientContext ctx;
    return stub_->StartAudit(&ctx, req, &out);
  };
  for (const auto& set : std::vector<std::function<void(pb::StartAuditRequest&)>>{
           [](auto& r) { r.set_forward_layers("1;2"); },
           [](auto& r) { r.set_forward_layers("all"); r.set_device("tpu"); },
           [](auto& r) { r.set_forward_layers("all"); r.set_emulate("sglang"); },
           [](auto& r) { r.set_device("cpu"); }}) {
    EXPECT_EQ(start(set).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // Parts need a daemon started with --executor slurm (docs/daemon.md "Slurm executor").
  grpc::Status parts = start([](auto& r) { r.set_parts(2); });
  EXPECT_EQ(parts.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(parts.error_message(), HasSubstr("--executor slurm"));
  const uint64_t size = LogSize();
  grpc::Status gpu = start([](auto& r) {
    r.set_forward_layers("all");
    r.set_device("cuda");
  });
  if (!gpu.ok()) {
    EXPECT_EQ(gpu.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << gpu.error_message();
    EXPECT_EQ(LogSize(), size);
    return;
  }
  // A GPU is here: the job ran on it and the record names it.
  for (int i = 0; i < 3000 && LogSize() < size + 2; ++i) {  // at most 60 s
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(LogSize(), size + 2) << "the GPU job did not log its record";
  auto gpu_log = storage::EvidenceLog::OpenReadOnly(db_);
  ASSERT_TRUE(gpu_log.ok());
  auto gpu_entry = (*gpu_log)->Get(size);
  ASSERT_TRUE(gpu_entry.ok()) << gpu_entry.status();
  auto gpu_statement = nlohmann::json::parse(evidence::ParseEnvelope(gpu_entry->envelope)->payload);
  const auto& predicate = gpu_statement["predicate"];
  EXPECT_EQ(predicate["block_forward"]["device"], "cuda");
  EXPECT_EQ(predicate["block_forward"]["verdict"], "bit-identical");
  EXPECT_FALSE(predicate["environment"]["gpu"]["name"].get<std::string>().empty());
  std::printf("[ measured ] daemon GPU job: %s on %s\n",
              predicate["block_forward"]["verdict"].get<std::string>().c_str(),
              predicate["environment"]["gpu"].dump().c_str());
}

// Finding 10: filters are normalised and compared as values, not as strings.
TEST_F(DaemonTest, QueryFiltersAreNormalised) {
  pb::Job job = AuditAndWait(dst_, src_);
  pb::GateResponse gate = Gate(dst_);
  auto count = [&](const std::function<void(pb::QueryAuditsRequest&)>& set) {
    pb::QueryAuditsRequest q;
    set(q);
    pb::QueryAuditsResponse out;
    grpc::Status s = Query(q, &out);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return out.audits_size();
  };
  std::string upper = gate.manifest_root();
  for (char& c : upper) c = static_cast<char>(std::toupper(c));
  // The record, its test result and the gate decision all name the content's ROOT.
  EXPECT_EQ(count([&](auto& q) { q.set_digest(upper); }), 3);
  EXPECT_EQ(count([&](auto& q) { q.set_digest("sha256:" + gate.manifest_root()); }), 3);
  std::string real = fs::canonical(dst_).string();
  std::string messy = real.substr(0, real.rfind('/')) + "/./" + dst_.filename().string() + "/";
  EXPECT_EQ(count([&](auto& q) { q.set_root(messy); }), 2);  // a test result names no root
  // The same instant written with an offset: everything is at or after "an hour ago".
  absl::Time hour_ago = absl::Now() - absl::Hours(1);
  std::string with_offset =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3S+02:00", hour_ago, absl::FixedTimeZone(2 * 3600));
  EXPECT_EQ(count([&](auto& q) { q.set_since(with_offset); }), 2);  // nor a time
  EXPECT_EQ(count([&](auto& q) { q.set_until(with_offset); }), 0);
  EXPECT_EQ(count([&](auto& q) { q.set_predicate_type("audit"); }), 1);
  EXPECT_EQ(count([&](auto& q) { q.set_predicate_type("gate"); }), 1);
  EXPECT_EQ(count([&](auto& q) { q.set_predicate_type("test-result"); }), 1);
  EXPECT_EQ(count([&](auto& q) { q.set_verdict("pass"); }), 3);
}

TEST_F(DaemonTest, UnknownJobAndRecordAreNotFoundWithoutServerPaths) {
  pb::GetJobRequest jr;
  jr.set_id("job-424242");
  pb::Job job;
  grpc::ClientContext ctx;
  EXPECT_EQ(stub_->GetJob(&ctx, jr, &job).error_code(), grpc::StatusCode::NOT_FOUND);
  pb::GetInclusionProofRequest pr;
  pr.set_id(5);
  pb::InclusionProof proof;
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->GetInclusionProof(&ctx2, pr, &proof).error_code(),
            grpc::StatusCode::NOT_FOUND);
  pb::GetRecordRequest rr;
  rr.set_id(5);
  pb::Record rec;
  grpc::ClientContext ctx3;
  grpc::Status s = stub_->GetRecord(&ctx3, rr, &rec);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(s.error_message(), Not(HasSubstr(db_)));
  EXPECT_THAT(s.error_message(), Not(HasSubstr(dir_.path().string())));
}

TEST_F(DaemonTest, RootOutsideAllowListIsDenied) {
  TempDir other;
  fs::path outside = CopyFixture("mini-kimi-nvfp4", other);
  pb::StartAuditRequest req;
  req.set_root(outside.string());
  pb::Job job;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->StartAudit(&ctx, req, &job);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s.error_message(), HasSubstr("outside the daemon's allowed roots"));
  // A symlink inside the allowed directory that points outside is denied too, without saying
  // where it points.
  fs::create_directory_symlink(outside, dir_ / "link");
  req.set_root((dir_ / "link").string());
  grpc::ClientContext ctx2;
  grpc::Status s2 = stub_->StartAudit(&ctx2, req, &job);
  EXPECT_EQ(s2.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(s2.error_message(), Not(HasSubstr(other.path().string())));
}

// Finding 8: X4T roots are mapped in Gate; the actual side must be allow-listed.
TEST_F(DaemonTest, RootMappingIsLimitedToTheAllowList) {
  fs::path x4t = CopyFixture("mini-kimi-x4t", dir_);
  pb::GateRequest req;
  req.set_root(x4t.string());
  auto* m = req.add_root_map();
  m->set_declared("/x4t");
  m->set_actual("/etc");
  pb::GateResponse resp;
  grpc::Status denied = TryGate(req, &resp);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(denied.error_message(), HasSubstr("root_map"));
  m->set_actual("relative");
  EXPECT_EQ(TryGate(req, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  m->set_actual(x4t.string());
  grpc::Status s = TryGate(req, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_FALSE(resp.pass());  // nothing audited; the X4T container takes the derived policy
  EXPECT_THAT(resp.gate_policy(), HasSubstr("derived-lossless"));
}

// Finding 8: an X4T container declares the absolute root it was built at; StartAudit's
// root_map says where it is mounted now, and the pair audit then passes.
TEST_F(DaemonTest, X4TPairAuditsWithARootMapping) {
  fs::path x4t = CopyFixture("mini-kimi-x4t", dir_);
  pb::Job unmapped = Wait(Submit(x4t, src_));
  ASSERT_EQ(unmapped.state(), pb::JOB_STATE_SUCCEEDED) << unmapped.error_message();
  EXPECT_EQ(unmapped.verdict(), "fail");  // checkpoint-root-mismatch
  pb::Job mapped = Wait(Submit(x4t, src_, {{"/x4t", x4t.string()}}));
  ASSERT_EQ(mapped.state(), pb::JOB_STATE_SUCCEEDED) << mapped.error_message();
  EXPECT_EQ(mapped.verdict(), "pass");
  pb::GateRequest gate;
  gate.set_root(x4t.string());
  pb::RootMapping* m = gate.add_root_map();
  m->set_declared("/x4t");
  m->set_actual(x4t.string());
  pb::GateResponse resp;
  ASSERT_TRUE(TryGate(gate, &resp).ok());
  EXPECT_TRUE(resp.pass()) << (resp.reasons_size() ? resp.reasons(0) : "");
  EXPECT_EQ(resp.record_id(), mapped.record_id());
}

// Finding 4: a job works on the directory that was checked when it was submitted. While it
// waits in the queue, the checked directory is moved away and a symlink to another tree takes
// its name; the job still audits the bytes of the directory it was given (and passes), where
// re-resolving the path would have audited the other tree (which fails).
TEST_F(DaemonTest, AQueuedJobAuditsTheDirectoryItWasGiven) {
  Stop();
  observer_ = &hold_;
  Start();
  const fs::path target = dir_ / "target", other = dir_ / "other";
  fs::copy(dst_, target, fs::copy_options::recursive);
  fs::copy(dst_, other, fs::copy_options::recursive);
  BreakGlobalScale(other);
  const std::string first = Submit(dst_, src_);
  hold_.WaitHeld();  // the one worker is busy: the next job stays queued
  const std::string queued = Submit(target, src_);
  fs::rename(target, dir_ / "moved");
  fs::create_directory_symlink(other, target);
  hold_.Release();
  pb::Job job = Wait(queued);
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.verdict(), "pass");
  EXPECT_EQ(job.root(), fs::canonical(dir_.path()).string() + "/target");
  EXPECT_EQ(Wait(first).verdict(), "pass");
}

// A watcher of a job that has no news (queued behind a busy worker) whose client leaves must
// not stay behind: before, its handler slept until the job's next event, holding a thread, and
// a server shutdown (SIGTERM) waited for it for ever.
TEST_F(DaemonTest, WatchersWhoLeftDoNotHoldTheServer) {
  Stop();
  observer_ = &hold_;
  Start();
  const std::string first = Submit(dst_, src_);
  hold_.WaitHeld();  // the one worker is busy: the next job stays queued, with no news
  const std::string queued = Submit(dst_, src_);
  for (int i = 0; i < 8; ++i) {
    pb::WatchJobRequest watch;
    watch.set_id(queued);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
    auto reader = stub_->WatchJob(&ctx, watch);
    pb::JobEvent e;
    int events = 0;
    while (reader->Read(&e)) ++events;
    EXPECT_EQ(events, 1);  // "queued"
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  // The server shuts down (as on SIGTERM, with a deadline) while the job is still queued.
  auto shutdown = std::async(std::launch::async, [&] {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  });
  const bool stopped = shutdown.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  EXPECT_TRUE(stopped) << "the server still waits for watchers whose clients left";
  hold_.Release();  // lets the stuck watchers see an event, so the test can end either way
  shutdown.wait();
}

// Each WatchJob stream holds a thread while it waits, so only so many may be open at once;
// one more is refused at once, and a stream whose client leaves gives its place back.
TEST_F(DaemonTest, WatchStreamsAreBounded) {
  Stop();
  observer_ = &hold_;
  Start();
  Submit(dst_, src_);
  hold_.WaitHeld();
  pb::WatchJobRequest watch;
  watch.set_id(Submit(dst_, src_));  // queued: its watchers wait
  struct Stream {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<pb::JobEvent>> reader;
  };
  std::vector<std::unique_ptr<Stream>> open;
  auto watch_one = [&] {
    auto s = std::make_unique<Stream>();
    s->reader = stub_->WatchJob(&s->ctx, watch);
    pb::JobEvent e;
    const bool waiting = s->reader->Read(&e);  // "queued", then the stream waits
    return std::make_pair(waiting, std::move(s));
  };
  for (int i = 0; i < GrpcAuditService::kMaxWatchers; ++i) {
    auto [waiting, s] = watch_one();
    ASSERT_TRUE(waiting) << i;
    open.push_back(std::move(s));
  }
  {
    auto [waiting, s] = watch_one();
    EXPECT_FALSE(waiting);
    EXPECT_EQ(s->reader->Finish().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  open.back()->ctx.TryCancel();  // one watcher leaves
  open.back()->reader->Finish().IgnoreError();
  open.pop_back();
  bool replaced = false;
  for (int i = 0; i < 50 && !replaced; ++i) {
    auto [waiting, s] = watch_one();
    if (waiting) {
      open.push_back(std::move(s));
      replaced = true;
    } else {
      s->reader->Finish().IgnoreError();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_TRUE(replaced) << "the place of the watcher who left was not given back";
  for (auto& s : open) s->ctx.TryCancel();
  for (auto& s : open) s->reader->Finish().IgnoreError();
  hold_.Release();
}

// Finding 4 (durability) through gRPC: CancelJob on a queued job, and ids answered from the
// database once the daemon restarts.
TEST_F(DaemonTest, CancelledAndFinishedJobsAnswerAfterARestart) {
  pb::Job done = AuditAndWait(dst_, src_);
  ASSERT_EQ(done.state(), pb::JOB_STATE_SUCCEEDED);
  pb::CancelJobRequest cancel;
  cancel.set_id(done.id());
  pb::Job out;
  grpc::ClientContext c1;
  EXPECT_EQ(stub_->CancelJob(&c1, cancel, &out).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  Stop();
  Start();
  pb::GetJobRequest get;
  get.set_id(done.id());
  grpc::ClientContext c2;
  ASSERT_TRUE(stub_->GetJob(&c2, get, &out).ok());
  EXPECT_EQ(out.state(), pb::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(out.record_id(), done.record_id());
  EXPECT_EQ(out.verdict(), "pass");
  pb::Job next = AuditAndWait(dst_, src_);
  EXPECT_NE(next.id(), done.id());
}

// Roots reached through symlinks whose real paths are not UTF-8, holding a file whose name is
// not UTF-8 either. proto3 strings must be UTF-8 and the record is JSON: the job's root and
// error message and the signed record carry the name encoding, and the daemon keeps answering.
// Before the encoding the worker died in nlohmann's dump() and took the daemon with it.
TEST_F(DaemonTest, NamesThatAreNotUtf8AreAuditedOverGrpc) {
  const fs::path odd = dir_ / "nv-\xFF";
  fs::rename(dst_, odd);
  ::ckpt::testing::WriteAll(odd / "notes-\xFF.txt", std::string("operator notes\n"));
  fs::create_directory_symlink(odd, dir_ / "nv-link");
  pb::Job job = AuditAndWait(dir_ / "nv-link", src_);
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.verdict(), "pass");
  EXPECT_THAT(job.root(), ::testing::EndsWith("/nv-%FF"));

  pb::GetRecordRequest rr;
  rr.set_id(job.record_id());
  pb::Record rec;
  grpc::ClientContext rctx;
  ASSERT_TRUE(stub_->GetRecord(&rctx, rr, &rec).ok());
  EXPECT_THAT(rec.summary().root(), ::testing::EndsWith("/nv-%FF"));
  auto envelope = evidence::ParseEnvelope(rec.envelope());
  ASSERT_TRUE(envelope.ok()) << envelope.status();
  auto statement = nlohmann::json::parse(envelope->payload);
  std::vector<std::string> subjects;
  for (const auto& s : statement["subject"]) subjects.push_back(s["name"]);
  EXPECT_THAT(subjects, ::testing::Contains("notes-%FF.txt"));
  EXPECT_THAT(statement["predicate"]["root"].get<std::string>(),
              ::testing::EndsWith("/nv-%FF"));

  // The gate computes the same encoded names, so the record decides it.
  pb::GateResponse gate = Gate(dir_ / "nv-link");
  EXPECT_TRUE(gate.pass()) << (gate.reasons_size() ? gate.reasons(0) : "");

  // A job that fails on such a path reports the path encoded in its error message.
  const fs::path bad = dir_ / "bad-\xFF";
  fs::create_directory(bad);
  ::ckpt::testing::WriteAll(bad / "config.json", std::string("{}"));
  fs::create_symlink("/etc/hostname", bad / "model.safetensors");
  fs::create_directory_symlink(bad, dir_ / "bad-link");
  pb::Job failed = AuditAndWait(dir_ / "bad-link", fs::path());
  ASSERT_EQ(failed.state(), pb::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error_message(), HasSubstr("/bad-%FF/model.safetensors"));

  // Still answering.
  pb::GetJobRequest get;
  get.set_id(job.id());
  pb::Job again;
  grpc::ClientContext gctx;
  ASSERT_TRUE(stub_->GetJob(&gctx, get, &again).ok());
  EXPECT_EQ(again.root(), job.root());
  pb::VerifyLogResponse log;
  grpc::ClientContext vctx;
  ASSERT_TRUE(stub_->VerifyLog(&vctx, pb::VerifyLogRequest(), &log).ok());
  EXPECT_TRUE(log.ok());
}

}  // namespace
}  // namespace ckpt::daemon
