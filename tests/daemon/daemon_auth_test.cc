// Authentication and roles (services/daemon/auth.h, serving.h, address.h): the token file and
// its refusals, the method -> role table against the proto, the start-up rules, and a real
// AuditService on a loopback port called with no token, unknown tokens and each role. Records
// caused by an authenticated caller carry its identity.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "core/evidence/dsse.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "services/daemon/address.h"
#include "services/daemon/auth.h"
#include "services/daemon/call_pool.h"
#include "services/daemon/grpc_service.h"
#include "services/daemon/serving.h"
#include "tests/daemon/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt::daemon {
namespace {

namespace fs = std::filesystem;
namespace pb = ckpt_audit::v1;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::RawUnaryCall;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAreArray;

TEST(RoleTable, EveryAuditServiceMethodHasAnExplicitRole) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          pb::AuditService::service_full_name());
  ASSERT_NE(service, nullptr);
  std::vector<std::string> in_proto;
  for (int i = 0; i < service->method_count(); ++i) in_proto.push_back(service->method(i)->name());
  // The table may name methods another branch adds (CancelJob); the proto's must all be there.
  std::vector<std::string> table = AuditServiceMethodsInTable();
  for (const std::string& m : in_proto) {
    EXPECT_NE(std::find(table.begin(), table.end(), m), table.end()) << m << " has no role";
  }
  const std::string prefix = "/ckpt_audit.v1.AuditService/";
  EXPECT_EQ(RequiredRole(prefix + "QueryAudits"), Role::kReader);
  EXPECT_EQ(RequiredRole(prefix + "WatchJob"), Role::kReader);
  EXPECT_EQ(RequiredRole(prefix + "StartAudit"), Role::kAuditor);
  EXPECT_EQ(RequiredRole(prefix + "Gate"), Role::kGate);
  EXPECT_EQ(RequiredRole(prefix + "VerifyLog"), Role::kAdmin);
  EXPECT_EQ(RequiredRole("/grpc.health.v1.Health/Check"), std::nullopt);
  EXPECT_EQ(RequiredRole("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"),
            std::nullopt);
  // Unknown names are closed: a new method, a look-alike service, a case change.
  EXPECT_EQ(RequiredRole(prefix + "DeleteEverything"), Role::kAdmin);
  EXPECT_EQ(RequiredRole("/ckpt_audit.v2.AuditService/QueryAudits"), Role::kAdmin);
  EXPECT_EQ(RequiredRole(prefix + "queryaudits"), Role::kAdmin);
  EXPECT_FALSE(IsKnownMethod(prefix + "DeleteEverything"));
}

TEST(RoleTable, GrantsFollowTheRoleHierarchy) {
  const Role all[] = {Role::kReader, Role::kAuditor, Role::kGate, Role::kAdmin};
  for (Role held : all) {
    EXPECT_TRUE(RoleGrants(held, Role::kReader));
    EXPECT_TRUE(RoleGrants(Role::kAdmin, held));
  }
  EXPECT_FALSE(RoleGrants(Role::kReader, Role::kAuditor));
  EXPECT_FALSE(RoleGrants(Role::kGate, Role::kAuditor));
  EXPECT_FALSE(RoleGrants(Role::kAuditor, Role::kGate));
  EXPECT_FALSE(RoleGrants(Role::kAuditor, Role::kAdmin));
  EXPECT_FALSE(RoleGrants(Role::kGate, Role::kAdmin));
}

TEST(TokenFile, ParsesAndRefusesMalformedLines) {
  const std::string h(64, 'a');
  auto ok = TokenStore::Parse("# comment\n\nsha256:" + h + " gate ci-gate\n", "t");
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->entries().size(), 1u);
  EXPECT_EQ(ok->entries()[0].role, Role::kGate);
  EXPECT_EQ(ok->entries()[0].name, "ci-gate");
  struct Case {
    std::string text, why;
  } bad[] = {
      {"sha256:" + std::string(64, 'A') + " gate g", "lowercase hex"},
      {"sha256:" + std::string(63, 'a') + " gate g", "64 hex"},
      {"md5:" + h + " gate g", "64 hex"},
      {"sha256:" + h + " root g", "unknown role"},
      {"sha256:" + h + " gate", "expected"},
      {"sha256:" + h + " gate a b", "expected"},
      {"sha256:" + h + " gate bad/name", "name must"},
      {"sha256:" + h + " gate g\nsha256:" + std::string(64, 'b') + " admin g", "already used"},
      {"sha256:" + h + " gate g\nsha256:" + h + " admin h", "twice"},
  };
  for (const Case& c : bad) {
    auto s = TokenStore::Parse(c.text, "tokens");
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(s.status().message(), HasSubstr(c.why)) << c.text;
    EXPECT_THAT(s.status().message(), HasSubstr("tokens:")) << "names the file and line";
  }
}

TEST(TokenFile, LookupIsByHashOfTheWholeToken) {
  auto token = NewToken();
  ASSERT_TRUE(token.ok());
  auto other = NewToken();
  EXPECT_NE(*token, *other);
  auto store = TokenStore::Parse(TokenLine(*token, Role::kAuditor, "a"), "t");
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_NE(store->Find(*token), nullptr);
  EXPECT_EQ(store->Find(*token)->name, "a");
  EXPECT_EQ(store->Find(*other), nullptr);
  EXPECT_EQ(store->Find(token->substr(0, token->size() - 1)), nullptr);
  EXPECT_EQ(store->Find(*token + "x"), nullptr);
  EXPECT_EQ(store->Find(""), nullptr);
  // The hash itself is not a token.
  std::string line = TokenLine(*token, Role::kAuditor, "a");
  EXPECT_EQ(store->Find(line.substr(7, 64)), nullptr);
}

TEST(TokenFile, LoadRefusesFilesOthersCanWrite) {
  TempDir dir;
  fs::path f = dir / "tokens";
  auto token = NewToken();
  ASSERT_TRUE(AppendToken(f.string(), *token, Role::kAdmin, "root-ish").ok());
  struct stat st;
  ASSERT_EQ(::stat(f.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(TokenStore::Load(f.string()).ok());
  ::chmod(f.c_str(), 0644);  // readable hashes are fine
  EXPECT_TRUE(TokenStore::Load(f.string()).ok());
  for (mode_t mode : {0620, 0602, 0666}) {
    ::chmod(f.c_str(), mode);
    auto s = TokenStore::Load(f.string());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition) << mode;
    EXPECT_THAT(s.status().message(), HasSubstr("token file is writable by "));
    // `tokens add` refuses to extend such a file too.
    auto again = NewToken();
    EXPECT_FALSE(AppendToken(f.string(), *again, Role::kAdmin, "x").ok());
  }
  ::chmod(f.c_str(), 0600);
  // Owned by another (unprivileged) user: that user could rewrite it. Needs root to set up; CI
  // and the development VM run as root.
  if (::geteuid() == 0) {
    ASSERT_EQ(::chown(f.c_str(), 65534, 65534), 0);
    auto s = TokenStore::Load(f.string());
    EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(s.status().message(), HasSubstr("owned by uid 65534"));
    ASSERT_EQ(::chown(f.c_str(), 0, 0), 0);
  }
  EXPECT_EQ(TokenStore::Load((dir / "missing").string()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(TokenStore::Load(dir.path().string()).status().code(),
            absl::StatusCode::kInvalidArgument);  // not a regular file (core/io/small_file.h)
}

TEST(Address, LoopbackIsParsedNotGuessed) {
  for (const char* a : {"127.0.0.1:7433", "127.1.2.3:1", "localhost:0", "LOCALHOST:80",
                        "[::1]:7433", "[::ffff:127.0.0.1]:7433", "unix:/run/ckpt.sock"}) {
    EXPECT_TRUE(IsLoopbackAddress(a)) << a;
  }
  for (const char* a : {"0.0.0.0:7433", "[::]:7433", ":7433", "7433", "10.0.0.1:7433",
                        "192.168.1.1:7433", "example.com:7433", "127.0.0.1.nip.io:7433",
                        "localhost.evil:7433", "127.0.0.1", "127.0.0.1:", "127.0.0.1:99999",
                        "127.0.0.1:7433x", "[::1]", "[::1]7433", "::1:7433",
                        "dns:///127.0.0.1:7433", "ipv4:127.0.0.1:7433", "[::ffff:10.0.0.1]:1",
                        "127.0.0.1 :7433", "128.0.0.1:7433"}) {
    EXPECT_FALSE(IsLoopbackAddress(a)) << a;
  }
}

TEST(ServingRules, PlaintextOnlyOnLoopbackAndNeverWithoutAChoiceAboutAuth) {
  ServingOptions o;
  o.tokens = "tokens";
  EXPECT_TRUE(CheckServingOptions(o).ok());
  o.listen = "0.0.0.0:7433";
  absl::Status s = CheckServingOptions(o);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("without TLS"));
  o.client_ca = "ca.pem";  // whatever else is configured
  o.metrics_listen = "127.0.0.1:0";
  EXPECT_FALSE(CheckServingOptions(o).ok());
  o.client_ca.clear();
  o.tls_cert = "c.pem";
  EXPECT_THAT(CheckServingOptions(o).message(), HasSubstr("go together"));
  o.tls_key = "k.pem";
  EXPECT_TRUE(CheckServingOptions(o).ok());

  ServingOptions none;  // no tokens and no explicit choice
  EXPECT_THAT(CheckServingOptions(none).message(), HasSubstr("--insecure-no-auth"));
  none.insecure_no_auth = true;
  EXPECT_TRUE(CheckServingOptions(none).ok());
  none.listen = "[::]:7433";
  none.tls_cert = "c.pem";
  none.tls_key = "k.pem";  // TLS does not make an unauthenticated daemon acceptable off-host
  EXPECT_THAT(CheckServingOptions(none).message(), HasSubstr("only a loopback"));
  none.listen = "127.0.0.1:7433";
  none.tokens = "tokens";
  EXPECT_THAT(CheckServingOptions(none).message(), HasSubstr("exclude each other"));

  ServingOptions m;
  m.tokens = "tokens";
  m.metrics_listen = "0.0.0.0:9464";
  EXPECT_THAT(CheckServingOptions(m).message(), HasSubstr("--metrics-public"));
  m.metrics_public = true;
  EXPECT_TRUE(CheckServingOptions(m).ok());
  ServingOptions ca_only;
  ca_only.tokens = "tokens";
  ca_only.client_ca = "ca.pem";
  EXPECT_THAT(CheckServingOptions(ca_only).message(), HasSubstr("needs --tls-cert"));
}

// A real AuditService on a loopback port with one token per role.
class AuthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = CopyFixture("mini-kimi-mxfp4", dir_);
    dst_ = CopyFixture("mini-kimi-nvfp4", dir_);
    std::string lines;
    for (Role r : {Role::kReader, Role::kAuditor, Role::kGate, Role::kAdmin}) {
      auto t = NewToken();
      ASSERT_TRUE(t.ok());
      tokens_[r] = *t;
      lines += TokenLine(*t, r, "ci-" + std::string(RoleName(r))) + "\n";
    }
    auto store = TokenStore::Parse(lines, "test");
    ASSERT_TRUE(store.ok()) << store.status();
    auth_ = std::make_unique<Authenticator>(*std::move(store));
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
    service_ = std::make_unique<GrpcAuditService>(*backend_, *auth_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(port, 0);
    address_ = "127.0.0.1:" + std::to_string(port);
    stub_ = pb::AuditService::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }
  void TearDown() override {
    if (server_) server_->Shutdown();
  }

  // Calls every AuditService method with `authorization` headers; the status of each.
  std::map<std::string, grpc::StatusCode> CallAll(const std::vector<std::string>& authorization) {
    std::map<std::string, grpc::StatusCode> out;
    auto ctx = [&] {
      auto c = std::make_unique<grpc::ClientContext>();
      for (const auto& a : authorization) c->AddMetadata("authorization", a);
      return c;
    };
    pb::Job job;
    pb::StartAuditRequest start;
    start.set_root(dst_.string());
    start.set_source_root(src_.string());
    out["StartAudit"] = stub_->StartAudit(ctx().get(), start, &job).error_code();
    pb::GetJobRequest gj;
    gj.set_id("job-999999");
    out["GetJob"] = stub_->GetJob(ctx().get(), gj, &job).error_code();
    pb::WatchJobRequest wj;
    wj.set_id("job-999999");
    auto c = ctx();
    auto reader = stub_->WatchJob(c.get(), wj);
    pb::JobEvent e;
    while (reader->Read(&e)) {
    }
    out["WatchJob"] = reader->Finish().error_code();
    pb::GateRequest gate;
    gate.set_root(dst_.string());
    pb::GateResponse gr;
    out["Gate"] = stub_->Gate(ctx().get(), gate, &gr).error_code();
    pb::QueryAuditsResponse q;
    out["QueryAudits"] = stub_->QueryAudits(ctx().get(), pb::QueryAuditsRequest(), &q).error_code();
    pb::GetRecordRequest rr;
    rr.set_id(999);
    pb::Record rec;
    out["GetRecord"] = stub_->GetRecord(ctx().get(), rr, &rec).error_code();
    pb::GetInclusionProofRequest pr;
    pr.set_id(999);
    pb::InclusionProof proof;
    out["GetInclusionProof"] = stub_->GetInclusionProof(ctx().get(), pr, &proof).error_code();
    pb::VerifyLogResponse v;
    out["VerifyLog"] = stub_->VerifyLog(ctx().get(), pb::VerifyLogRequest(), &v).error_code();
    return out;
  }
  std::string Bearer(Role r) { return "Bearer " + tokens_[r]; }

  TempDir dir_;
  fs::path src_, dst_;
  std::map<Role, std::string> tokens_;
  std::unique_ptr<Authenticator> auth_;
  std::unique_ptr<AuditBackend> backend_;
  std::unique_ptr<GrpcAuditService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  std::unique_ptr<pb::AuditService::Stub> stub_;
};

TEST_F(AuthServiceTest, WithoutAKnownTokenEveryMethodIsUnauthenticated) {
  const std::vector<std::vector<std::string>> attempts = {
      {},                                         // no header
      {"Bearer ckpt_" + std::string(64, '0')},    // unknown token
      {"Bearer"},                                 // no token
      {tokens_[Role::kAdmin]},                    // no scheme
      {"Basic " + tokens_[Role::kAdmin]},         // wrong scheme
      {Bearer(Role::kAdmin) + "0"},               // a longer token
      {Bearer(Role::kReader), Bearer(Role::kAdmin)},  // two headers
  };
  for (const auto& headers : attempts) {
    for (const auto& [method, code] : CallAll(headers)) {
      EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED)
          << method << " with " << (headers.empty() ? "no header" : headers[0]);
    }
  }
  // Nothing reached the backend: no job, no record.
  auto page = backend_->Query({});
  ASSERT_TRUE(page.ok());
  EXPECT_TRUE(page->entries.empty());
}

// Every method the proto declares, called generically with an empty request and no token: a
// handler added without its Authorize line fails here, whatever it does.
TEST_F(AuthServiceTest, EveryMethodOfTheProtoChecksTheToken) {
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          pb::AuditService::service_full_name());
  ASSERT_NE(service, nullptr);
  grpc::GenericStub stub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method =
        "/" + service->full_name() + "/" + service->method(i)->name();
    EXPECT_EQ(RawUnaryCall(stub, method).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << method;
  }
}

TEST_F(AuthServiceTest, EachRoleGetsExactlyItsMethods) {
  using C = grpc::StatusCode;
  const C denied = C::PERMISSION_DENIED;
  auto allowed = [&](C c) { return c != denied && c != C::UNAUTHENTICATED; };
  struct Expect {
    Role role;
    std::set<std::string> may;
  } table[] = {
      {Role::kReader, {"GetJob", "WatchJob", "QueryAudits", "GetRecord", "GetInclusionProof"}},
      {Role::kAuditor,
       {"StartAudit", "GetJob", "WatchJob", "QueryAudits", "GetRecord", "GetInclusionProof"}},
      {Role::kGate, {"Gate", "GetJob", "WatchJob", "QueryAudits", "GetRecord",
                     "GetInclusionProof"}},
      {Role::kAdmin, {"StartAudit", "Gate", "VerifyLog", "GetJob", "WatchJob", "QueryAudits",
                      "GetRecord", "GetInclusionProof"}},
  };
  for (const Expect& e : table) {
    for (const auto& [method, code] : CallAll({Bearer(e.role)})) {
      if (e.may.count(method)) {
        EXPECT_TRUE(allowed(code)) << RoleName(e.role) << " " << method << " " << code;
      } else {
        EXPECT_EQ(code, denied) << RoleName(e.role) << " " << method;
      }
    }
  }
  // "bearer" is case-insensitive (RFC 6750 names the scheme case-insensitively).
  auto lower = CallAll({"bearer " + tokens_[Role::kReader]});
  EXPECT_EQ(lower["QueryAudits"], C::OK);
}

TEST_F(AuthServiceTest, RecordsCarryTheInvoker) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", Bearer(Role::kAuditor));
  pb::StartAuditRequest start;
  start.set_root(dst_.string());
  start.set_source_root(src_.string());
  pb::Job job;
  ASSERT_TRUE(stub_->StartAudit(&ctx, start, &job).ok());
  grpc::ClientContext wctx;
  wctx.AddMetadata("authorization", Bearer(Role::kAuditor));
  pb::WatchJobRequest watch;
  watch.set_id(job.id());
  auto reader = stub_->WatchJob(&wctx, watch);
  pb::JobEvent e;
  while (reader->Read(&e)) {
    if (e.done()) job = e.job();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_EQ(job.verdict(), "pass") << job.error_message();

  grpc::ClientContext gctx;
  gctx.AddMetadata("authorization", Bearer(Role::kGate));
  pb::GateRequest gate;
  gate.set_root(dst_.string());
  pb::GateResponse decision;
  ASSERT_TRUE(stub_->Gate(&gctx, gate, &decision).ok());
  ASSERT_TRUE(decision.pass());

  auto predicate = [&](int64_t id) {
    auto entry = backend_->GetRecord(static_cast<uint64_t>(id));
    EXPECT_TRUE(entry.ok());
    auto env = evidence::ParseEnvelope(entry->envelope);
    EXPECT_TRUE(env.ok());
    return nlohmann::json::parse(env->payload).at("predicate");
  };
  EXPECT_EQ(predicate(job.record_id()).value("invoker", ""), "auditor:ci-auditor");
  EXPECT_EQ(predicate(decision.decision_id()).value("invoker", ""), "gate:ci-gate");
}

// A caller without the role is refused before its call takes a place in the work threads'
// queue (grpc_service.h): with every work thread busy hashing a 1 TiB sparse file, refusals of
// Gate, StartAudit and VerifyLog still come at once.
TEST_F(AuthServiceTest, RefusedCallersNeverWaitForTheWorkThreads) {
  fs::create_directory(dir_ / "huge");
  {
    int fd = ::open((dir_ / "huge" / "blob.bin").c_str(), O_WRONLY | O_CREAT, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 1ll << 40), 0);
    ::close(fd);
  }
  // Two callers: one caller's gates take at most kGatesRunningPerCaller work threads.
  static_assert(2 * GrpcAuditService::kGatesRunningPerCaller ==
                GrpcAuditService::kDefaultWorkThreads);
  std::vector<std::future<grpc::StatusCode>> slow;
  for (int i = 0; i < GrpcAuditService::kDefaultWorkThreads; ++i) {
    slow.push_back(std::async(std::launch::async, [&, i] {
      grpc::ClientContext ctx;
      ctx.AddMetadata("authorization", Bearer(i % 2 == 0 ? Role::kGate : Role::kAdmin));
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(3));
      pb::GateRequest req;
      req.set_root((dir_ / "huge").string());
      pb::GateResponse resp;
      return stub_->Gate(&ctx, req, &resp).error_code();
    }));
  }
  for (int i = 0; i < 6000 && service_->work_load().running <
                                 static_cast<size_t>(GrpcAuditService::kDefaultWorkThreads);
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(service_->work_load().running,
            static_cast<size_t>(GrpcAuditService::kDefaultWorkThreads))
      << "every work thread hashing";
  std::map<std::string, grpc::StatusCode> no_token = CallAll({});
  std::map<std::string, grpc::StatusCode> reader = CallAll({Bearer(Role::kReader)});
  for (auto& f : slow) {
    EXPECT_EQ(f.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
        << "a refusal waited for the work threads";
  }
  for (const char* m : {"Gate", "StartAudit", "VerifyLog"}) {
    EXPECT_EQ(no_token[m], grpc::StatusCode::UNAUTHENTICATED) << m;
    EXPECT_EQ(reader[m], grpc::StatusCode::PERMISSION_DENIED) << m;
  }
  for (auto& f : slow) EXPECT_EQ(f.get(), grpc::StatusCode::DEADLINE_EXCEEDED);
}

// The idle release (serving.h): once per burst, only after the quiet ticks, never while calls
// start; what the daemon keeps for a burst is dropped each time.
TEST(IdleMemoryReleaser, ReleasesOnceAfterEachBurstAndNeverUnderLoad) {
  int released = 0;
  IdleMemoryReleaser r(3, [&] { ++released; });
  EXPECT_FALSE(r.Tick(0));  // no call yet: nothing to give back
  EXPECT_FALSE(r.Tick(0));
  EXPECT_FALSE(r.Tick(0));
  EXPECT_FALSE(r.Tick(0));
  for (uint64_t calls = 10; calls < 100; calls += 10) EXPECT_FALSE(r.Tick(calls));  // load
  EXPECT_FALSE(r.Tick(90));
  EXPECT_FALSE(r.Tick(90));
  EXPECT_EQ(released, 0);
  EXPECT_TRUE(r.Tick(90));  // third quiet tick
  EXPECT_EQ(released, 1);
  EXPECT_FALSE(r.Tick(90));  // once per burst
  EXPECT_FALSE(r.Tick(90));
  EXPECT_FALSE(r.Tick(91));  // a new call restarts the count
  EXPECT_FALSE(r.Tick(91));
  EXPECT_FALSE(r.Tick(91));
  EXPECT_TRUE(r.Tick(91));
  EXPECT_EQ(released, 2);
}

// The work threads (call_pool.h): everything submitted runs, in order, on the given threads; a
// full queue first lets out what is no longer wanted (run at once, on the submitting thread),
// then refuses instead of growing; the destructor runs what still waits.
TEST(CallPool, RunsInOrderMakesRoomFromAbandonedWorkAndRefusesWhenFull) {
  const std::thread::id caller = std::this_thread::get_id();
  std::mutex mu;
  std::vector<std::string> ran;
  auto record = [&](std::string what) {
    return [&, what] {
      std::lock_guard<std::mutex> lock(mu);
      ran.push_back(what + (std::this_thread::get_id() == caller ? "@caller" : ""));
    };
  };
  std::promise<void> release;
  std::shared_future<void> go = release.get_future().share();
  std::promise<void> blocking;
  std::atomic<bool> b_left{false};
  auto wanted = [] { return false; };
  {
    CallPool pool(1, /*max_waiting=*/2);
    ASSERT_TRUE(pool.Submit(
        [&] {
          blocking.set_value();
          go.wait();
        },
        wanted));
    blocking.get_future().wait();  // the one thread is busy: what follows waits
    EXPECT_TRUE(pool.Submit(record("a"), wanted));
    EXPECT_TRUE(pool.Submit(record("b"), [&] { return b_left.load(); }));
    EXPECT_FALSE(pool.Submit(record("x"), wanted));  // full, and both still wanted
    b_left = true;                                   // b's caller leaves
    EXPECT_TRUE(pool.Submit(record("c"), wanted));   // b makes room, answered at once
    EXPECT_FALSE(pool.Submit(record("y"), wanted));
    {
      std::lock_guard<std::mutex> lock(mu);
      EXPECT_EQ(ran, (std::vector<std::string>{"b@caller"}));
    }
    release.set_value();
  }
  EXPECT_EQ(ran, (std::vector<std::string>{"b@caller", "a", "c"}));
}

}  // namespace
}  // namespace ckpt::daemon
