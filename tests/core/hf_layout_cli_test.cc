// The README's two commands on Hugging Face layouts made as huggingface_hub makes them
// (docs/hf-layouts.md), through the ckpt-audit binary: `audit SNAPSHOT_DIR` and
// `audit --source SNAPSHOT_DIR LOCAL_DIR` pass with the model refs in the signed record;
// inspect and fingerprint name the layout; verify re-hashes a snapshot; an escaping link and a
// tampered blob are refused or fail.
#include <filesystem>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/core/hf_layouts.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::ckpt::testing::CliResult;

constexpr char kSourceCommit[] = "0123456789abcdef0123456789abcdef01234567";
constexpr char kDerivedCommit[] = "89abcdef0123456789abcdef0123456789abcdef";

class HfLayoutCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    hub_ = testing::MakeHubSnapshot("mini-kimi-mxfp4", dir_ / "hub", "org/mini-kimi-mxfp4",
                                    kSourceCommit);
    local_ = testing::MakeLocalDir("mini-kimi-nvfp4", dir_ / "mini-kimi-nvfp4", kDerivedCommit);
    CliResult k = Run("keys generate --out " + Key() + " --trust " + Trust());
    ASSERT_EQ(k.rc, 0) << k.err;
  }
  CliResult Run(const std::string& args) {
    return ::ckpt::testing::RunCli(args, dir_.path(),
                                   "XDG_DATA_HOME='" + (dir_ / "xdg").string() + "'");
  }
  std::string Db() { return (dir_ / "log.db").string(); }
  std::string Key() { return (dir_ / "key.pem").string(); }
  std::string Trust() { return (dir_ / "trusted").string(); }
  CliResult Audit(const std::string& args) {
    return Run("audit " + args + " --db " + Db() + " --key " + Key() + " --json");
  }
  nlohmann::json Predicate(int64_t id) {
    CliResult r = Run("report --db " + Db() + " " + std::to_string(id) + " --format json --trust " +
                   Trust());
    EXPECT_EQ(r.rc, 0) << r.err;
    auto j = nlohmann::json::parse(r.out, nullptr, false);
    return j.is_discarded() ? nlohmann::json() : j["statement"]["predicate"];
  }
  static nlohmann::json CheckNamed(const nlohmann::json& predicate, const std::string& name) {
    for (const auto& c : predicate["checks"]) {
      if (c["name"] == name) return c;
    }
    return nullptr;
  }
  std::string LastLine(const std::string& text) {
    std::string t = text.substr(0, text.find_last_not_of('\n') + 1);
    return t.substr(t.rfind('\n') + 1);
  }

  TempDir dir_;
  testing::HubSnapshot hub_;
  fs::path local_;
};

TEST_F(HfLayoutCliTest, InspectAndFingerprintNameTheLayout) {
  CliResult i = Run("inspect " + hub_.snapshot.string());
  ASSERT_EQ(i.rc, 0) << i.err;
  EXPECT_THAT(i.out, HasSubstr(std::string("layout: hf-cache-snapshot (model ref "
                                           "org/mini-kimi-mxfp4@") + kSourceCommit + ")"));
  CliResult j = Run("inspect --json " + local_.string());
  ASSERT_EQ(j.rc, 0) << j.err;
  auto ij = nlohmann::json::parse(j.out);
  EXPECT_EQ(ij["layout"], "hf-local-dir");
  EXPECT_EQ(ij["model_ref"], kDerivedCommit);

  CliResult snap = Run("fingerprint --no-tensors " + hub_.snapshot.string());
  CliResult plain = Run("fingerprint --no-tensors " + Fixture("mini-kimi-mxfp4").string());
  ASSERT_EQ(snap.rc, 0) << snap.err;
  EXPECT_THAT(LastLine(snap.out), ::testing::StartsWith("ROOT "));
  EXPECT_EQ(LastLine(snap.out), LastLine(plain.out));
  CliResult loc = Run("fingerprint --no-tensors --json " + local_.string());
  auto lj = nlohmann::json::parse(loc.out);
  EXPECT_EQ(lj["layout"], "hf-local-dir");
}

TEST_F(HfLayoutCliTest, AuditSnapshotRecordsTheModelRefAndVerifies) {
  CliResult a = Audit(hub_.snapshot.string());
  ASSERT_EQ(a.rc, 0) << a.err << a.out;
  auto out = nlohmann::json::parse(a.out);
  EXPECT_EQ(out["model_ref"], std::string("org/mini-kimi-mxfp4@") + kSourceCommit);
  nlohmann::json p = Predicate(out["record_id"].get<int64_t>());
  EXPECT_EQ(p["refs"]["model_ref"], std::string("org/mini-kimi-mxfp4@") + kSourceCommit);
  nlohmann::json layout = CheckNamed(p, "hf_layout");
  ASSERT_TRUE(layout.is_object());
  EXPECT_EQ(layout["verdict"], "pass");
  EXPECT_EQ(layout["details"]["layout"], "hf-cache-snapshot");
  EXPECT_EQ(layout["details"]["snapshot_is_main"], true);
  EXPECT_EQ(layout["counts"]["links_followed"], 4);
  CliResult text = Run("report --db " + Db() + " " + out["record_id"].dump() +
                    " --format text --trust " + Trust());
  EXPECT_THAT(text.out, HasSubstr("layout     hf-cache-snapshot"));
  EXPECT_THAT(text.out, HasSubstr(std::string("model ref  org/mini-kimi-mxfp4@") + kSourceCommit));

  CliResult v = Run("verify --db " + Db() + " --id " + out["record_id"].dump() + " --root " +
                 hub_.snapshot.string() + " --trust " + Trust());
  EXPECT_EQ(v.rc, 0) << v.out << v.err;
  CliResult v2 = Run("verify --db " + Db() + " --id " + out["record_id"].dump() + " --root " +
                  Fixture("mini-kimi-mxfp4").string() + " --trust " + Trust());
  EXPECT_EQ(v2.rc, 0) << v2.out << v2.err;  // the same subjects as the plain copy
}

TEST_F(HfLayoutCliTest, PairAuditSnapshotSourceLocalDirDerived) {
  CliResult a = Audit("--source " + hub_.snapshot.string() + " " + local_.string());
  ASSERT_EQ(a.rc, 0) << a.err << a.out;
  nlohmann::json p = Predicate(nlohmann::json::parse(a.out)["record_id"].get<int64_t>());
  EXPECT_EQ(p["verdict"], "pass");
  EXPECT_EQ(p["refs"]["model_ref"], kDerivedCommit);
  EXPECT_EQ(p["refs"]["source_ref"], std::string("org/mini-kimi-mxfp4@") + kSourceCommit);
  EXPECT_EQ(CheckNamed(p, "pair_verify")["verdict"], "pass");
  EXPECT_EQ(CheckNamed(p, "hf_layout")["details"]["layout"], "hf-local-dir");
  EXPECT_EQ(CheckNamed(p, "source_hf_layout")["details"]["layout"], "hf-cache-snapshot");
  EXPECT_EQ(p["source"]["files"].size(), 4u);
  for (const auto& c : p["checks"]) EXPECT_NE(c["verdict"], "fail") << c["name"];
  // Nothing of .cache/huggingface/ is a subject; the manifest names it as ignored.
  CliResult st = Run("report --db " + Db() + " 0 --format json --trust " + Trust());
  const auto subjects = nlohmann::json::parse(st.out)["statement"]["subject"];
  EXPECT_EQ(subjects.size(), 5u);  // 4 files and the OMS manifest ROOT
  for (const auto& s : subjects) {
    EXPECT_THAT(s["name"].get<std::string>(), ::testing::Not(HasSubstr(".cache")));
  }
  // Refs given on the command line are recorded as given.
  CliResult given = Audit("--source " + hub_.snapshot.string() + " " + local_.string() +
                       " --model-ref org/derived@v1");
  ASSERT_EQ(given.rc, 0) << given.err;
  const int64_t id = nlohmann::json::parse(given.out)["record_id"].get<int64_t>();
  EXPECT_EQ(Predicate(id)["refs"]["model_ref"], "org/derived@v1");
}

// A repo id names the snapshot the hub cache holds for it, found as the hf tool finds it
// (HF_HUB_CACHE, else HF_HOME/hub); the resolution is said, and the record names the
// snapshot's commit, which a branch or tag name does not pin. A path that exists is a path;
// what the cache lacks is named.
TEST_F(HfLayoutCliTest, RepoIdsResolveThroughTheHubCache) {
  const std::string xdg = "XDG_DATA_HOME='" + (dir_ / "xdg").string() + "'";
  const std::string home = xdg + " HF_HOME='" + dir_.path().string() + "'";
  auto run = [&](const std::string& env, const std::string& args) {
    return ::ckpt::testing::RunCli(args, dir_.path(), env);
  };
  CliResult i = run(home, "inspect org/mini-kimi-mxfp4");
  ASSERT_EQ(i.rc, 0) << i.err;
  EXPECT_THAT(i.out, HasSubstr(std::string("layout: hf-cache-snapshot (model ref "
                                           "org/mini-kimi-mxfp4@") + kSourceCommit + ")"));
  // HF_HUB_CACHE wins over HF_HOME, as in huggingface_hub.
  CliResult hub_cache = run(xdg + " HF_HOME=/nonexistent HF_HUB_CACHE='" +
                                (dir_ / "hub").string() + "'",
                            "inspect org/mini-kimi-mxfp4@" + std::string(kSourceCommit));
  EXPECT_EQ(hub_cache.rc, 0) << hub_cache.err;
  CliResult legacy = run(xdg + " HF_HOME=/nonexistent HUGGINGFACE_HUB_CACHE='" +
                             (dir_ / "hub").string() + "'",
                         "inspect org/mini-kimi-mxfp4");
  EXPECT_EQ(legacy.rc, 0) << legacy.err;

  testing::WriteAll(hub_.repo / "refs" / "v1", std::string(kSourceCommit) + "\n");
  CliResult a = run(home, "audit org/mini-kimi-mxfp4@v1 --db " + Db() + " --key " + Key() +
                              " --json");
  ASSERT_EQ(a.rc, 0) << a.err << a.out;
  EXPECT_THAT(a.err, HasSubstr("org/mini-kimi-mxfp4@v1 is the hub cache's snapshot " +
                               hub_.snapshot.string()));
  nlohmann::json p = Predicate(nlohmann::json::parse(a.out)["record_id"].get<int64_t>());
  EXPECT_EQ(p["refs"]["model_ref"], std::string("org/mini-kimi-mxfp4@") + kSourceCommit);
  EXPECT_EQ(p["root"], hub_.snapshot.string());

  CliResult absent = run(home, "inspect org/absent");
  EXPECT_EQ(absent.rc, 2);
  EXPECT_THAT(absent.err, HasSubstr("has no models--org--absent"));
  EXPECT_THAT(absent.err, HasSubstr("hf download org/absent"));
  CliResult no_ref = run(home, "inspect org/mini-kimi-mxfp4@nope");
  EXPECT_EQ(no_ref.rc, 2);
  EXPECT_THAT(no_ref.err, HasSubstr("has no refs/nope"));
  testing::WriteAll(hub_.repo / "refs" / "bad", "../../../etc\n");
  CliResult bad_ref = run(home, "inspect org/mini-kimi-mxfp4@bad");
  EXPECT_EQ(bad_ref.rc, 2);
  EXPECT_THAT(bad_ref.err, HasSubstr("does not hold a commit hash"));
  // Not a repo id: a revision that climbs out of refs/ is a path that does not exist.
  CliResult climb = run(home, "inspect org/mini-kimi-mxfp4@../../blobs");
  EXPECT_EQ(climb.rc, 2);
  EXPECT_THAT(climb.err, ::testing::Not(HasSubstr("hf-cache")));

  // A directory of that name here is what the argument means.
  fs::create_directories(dir_ / "org" / "mini-kimi-mxfp4");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir_.path());
  CliResult local = run(home, "inspect org/mini-kimi-mxfp4");
  fs::current_path(cwd);
  EXPECT_EQ(local.rc, 2);
  EXPECT_THAT(local.err, HasSubstr("no config.json"));
}

// The repository folder and its snapshots/ folder hold every snapshot: which one is meant is
// said, with the one refs/main names, instead of refusing the links inside.
TEST_F(HfLayoutCliTest, RepoAndSnapshotsFoldersNameTheSnapshotToAudit) {
  for (const fs::path& folder : {hub_.repo, hub_.repo / "snapshots"}) {
    CliResult r = Run("inspect " + folder.string());
    EXPECT_EQ(r.rc, 2) << folder;
    EXPECT_THAT(r.err, HasSubstr("audit one of its snapshots, " + hub_.repo.string() +
                                 "/snapshots/COMMIT (refs/main: snapshots/" + kSourceCommit + ")"))
        << r.err;
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("symbolic link")));
  }
}

TEST_F(HfLayoutCliTest, EscapingLinkRefusedAndTamperedBlobFails) {
  testing::WriteAll(dir_ / "secret.json", std::string("{}"));
  fs::create_symlink("../../../../secret.json", hub_.snapshot / "extra.json");
  CliResult refused = Audit(hub_.snapshot.string());
  EXPECT_EQ(refused.rc, 2);
  EXPECT_THAT(refused.err, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(refused.err, HasSubstr("extra.json -> ../../../../secret.json"));
  fs::remove(hub_.snapshot / "extra.json");

  const std::string blob = testing::HubBlobName(Fixture("mini-kimi-mxfp4/config.json"));
  testing::WriteAll(hub_.repo / "blobs" / blob, std::string("{\"tampered\": 1}"));
  CliResult failed = Audit(hub_.snapshot.string());
  EXPECT_EQ(failed.rc, 1) << failed.err;
  nlohmann::json p = Predicate(nlohmann::json::parse(failed.out)["record_id"].get<int64_t>());
  nlohmann::json layout = CheckNamed(p, "hf_layout");
  EXPECT_EQ(layout["verdict"], "fail");
  EXPECT_EQ(layout["findings"][0]["code"], "blob-digest-mismatch");
  EXPECT_EQ(layout["findings"][0]["path"], "config.json");
}

}  // namespace
}  // namespace ckpt
