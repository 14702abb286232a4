// End-to-end: a real ckpt-auditd service on a loopback port, driven by a gRPC client.
#include <filesystem>

#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "core/evidence/dsse.h"
#include "core/safetensors.h"
#include "services/daemon/grpc_service.h"
#include "storage/merkle.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

namespace fs = std::filesystem;
namespace pb = ckpt_audit::v1;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = CopyFixture("mini-kimi-mxfp4", dir_);
    dst_ = CopyFixture("mini-kimi-nvfp4", dir_);
    auto key = evidence::SigningKey::Generate();
    ASSERT_TRUE(key.ok());
    evidence::TrustStore trust;
    trust.Add(key->public_key());
    BackendOptions options;
    options.db_path = (dir_ / "evidence.db").string();
    options.allowed_roots = {dir_.path().string()};
    auto backend = AuditBackend::Create(options, *key, std::move(trust));
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = *std::move(backend);
    service_ = std::make_unique<GrpcAuditService>(*backend_, auth_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    stub_ = pb::AuditService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Starts an audit and follows its stream to the end; returns the final job.
  pb::Job AuditAndWait(const fs::path& root, const fs::path& source, int* events) {
    pb::StartAuditRequest req;
    req.set_root(root.string());
    req.set_source_root(source.string());
    pb::Job job;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub_->StartAudit(&ctx, req, &job).ok());
    pb::WatchJobRequest watch;
    watch.set_id(job.id());
    grpc::ClientContext wctx;
    auto reader = stub_->WatchJob(&wctx, watch);
    pb::JobEvent e;
    pb::Job last;
    *events = 0;
    while (reader->Read(&e)) {
      ++*events;
      if (e.done()) last = e.job();
    }
    EXPECT_TRUE(reader->Finish().ok());
    return last;
  }

  pb::GateResponse Gate(const fs::path& root) {
    pb::GateRequest req;
    req.set_root(root.string());
    pb::GateResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub_->Gate(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  TempDir dir_;
  fs::path src_, dst_;
  const Authenticator auth_ = Authenticator::NoAuth();  // roles: daemon_auth_test.cc
  std::unique_ptr<AuditBackend> backend_;
  std::unique_ptr<GrpcAuditService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<pb::AuditService::Stub> stub_;
};

TEST_F(DaemonTest, PairAuditThenGatePassesAndProofVerifies) {
  int events = 0;
  pb::Job job = AuditAndWait(dst_, src_, &events);
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.verdict(), "pass");
  EXPECT_GT(events, 3);  // queued, progress..., done

  pb::GateResponse gate = Gate(dst_);
  EXPECT_TRUE(gate.pass());
  EXPECT_EQ(gate.record_id(), job.record_id());
  EXPECT_GT(gate.decision_id(), job.record_id());
  ASSERT_FALSE(gate.reasons().empty());
  EXPECT_THAT(gate.reasons(0), HasSubstr("passed"));

  // The record is findable by the content digest the gate computed.
  pb::QueryAuditsRequest q;
  q.set_digest(gate.manifest_root());
  pb::QueryAuditsResponse page;
  grpc::ClientContext qctx;
  ASSERT_TRUE(stub_->QueryAudits(&qctx, q, &page).ok());
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
  for (const auto& h : proof.hashes()) {
    storage::Hash x;
    ASSERT_EQ(h.size(), x.size());
    std::copy(h.begin(), h.end(), x.begin());
    hashes.push_back(x);
  }
  storage::Hash root;
  std::copy(proof.root_hash().begin(), proof.root_hash().end(), root.begin());
  const std::string& env = rec.envelope();
  storage::Hash leaf = storage::LeafHash(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(env.data()), env.size()));
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
  int events = 0;
  ASSERT_EQ(AuditAndWait(dst_, src_, &events).verdict(), "pass");
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
}

TEST_F(DaemonTest, FailedAuditMakesGateFailWithReasons) {
  // Scale one NVFP4 global scale by 2: the pair audit must fail, and so must the gate.
  auto f = ckpt::SafetensorsFile::Open((dst_ / "model-00001-of-00002.safetensors").string());
  ASSERT_TRUE(f.ok());
  const ckpt::TensorInfo* gs = nullptr;
  for (const auto& t : (*f)->tensors()) {
    if (t.name.find("weight_global_scale") != std::string::npos) {
      gs = &t;
      break;
    }
  }
  ASSERT_NE(gs, nullptr);
  uint64_t offset = (*f)->data_start() + gs->begin;
  f->reset();
  fs::path shard = dst_ / "model-00001-of-00002.safetensors";
  auto bytes = ::ckpt::testing::ReadAll(shard);
  float v;
  std::memcpy(&v, &bytes[offset], 4);
  v *= 2;
  std::memcpy(&bytes[offset], &v, 4);
  ::ckpt::testing::WriteAll(shard, bytes);

  int events = 0;
  pb::Job job = AuditAndWait(dst_, src_, &events);
  ASSERT_EQ(job.state(), pb::JOB_STATE_SUCCEEDED) << job.error_message();
  EXPECT_EQ(job.verdict(), "fail");
  pb::GateResponse gate = Gate(dst_);
  EXPECT_FALSE(gate.pass());
  EXPECT_EQ(gate.record_id(), job.record_id());
  ASSERT_GE(gate.reasons_size(), 2);
  EXPECT_THAT(gate.reasons(1), HasSubstr("failed"));
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
  // A symlink inside the allowed directory that points outside is denied too.
  fs::create_directory_symlink(outside, dir_ / "link");
  req.set_root((dir_ / "link").string());
  grpc::ClientContext ctx2;
  EXPECT_EQ(stub_->StartAudit(&ctx2, req, &job).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(DaemonTest, UnknownJobAndRecordAreNotFound) {
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
}

// Roots reached through symlinks whose real paths are not UTF-8, holding a file whose name is
// not UTF-8 either. proto3 strings must be UTF-8 and the record is JSON: the job's root and
// error message and the signed record carry the name encoding, and the daemon keeps answering.
// Before the encoding the worker died in nlohmann's dump() and took the daemon with it.
TEST_F(DaemonTest, NamesThatAreNotUtf8AreAuditedOverGrpc) {
  const fs::path odd = dir_ / "nv-\xFF";
  fs::rename(dst_, odd);
  testing::WriteAll(odd / "notes-\xFF.txt", std::string("operator notes\n"));
  fs::create_directory_symlink(odd, dir_ / "nv-link");
  int events = 0;
  pb::Job job = AuditAndWait(dir_ / "nv-link", src_, &events);
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

  // A job that fails on such a path reports the path encoded in its error message.
  const fs::path bad = dir_ / "bad-\xFF";
  fs::create_directory(bad);
  testing::WriteAll(bad / "config.json", std::string("{}"));
  fs::create_symlink("/etc/hostname", bad / "model.safetensors");
  fs::create_directory_symlink(bad, dir_ / "bad-link");
  pb::Job failed = AuditAndWait(dir_ / "bad-link", fs::path(), &events);
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
