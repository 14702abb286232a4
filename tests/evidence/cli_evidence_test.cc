// End-to-end tests of the evidence commands through the ckpt-audit binary: keys, audit (pass,
// fail, per-user defaults), verify, verify-log (clean and tampered), query, report, and the
// HTML report rendered by headless Chromium.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/evidence/log_test_util.h"
#include "tests/evidence/png_probe.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

using Result = ::ckpt::testing::CliResult;

class CliTest : public ::ckpt::testing::CliWorkspace {
 protected:
  Result Audit(const std::string& root, const std::string& extra = "") {
    return Run("audit " + root + " --db " + Db() + " --key " + Key() + " --json " + extra);
  }
};

// Makes layer 1 expert 0's w1 scale (row 0, group 0) tiny, so its span leaves the window.
fs::path OverSpanCopy(const TempDir& dir) {
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string tensor =
      "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_scale";
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.path().extension() != ".safetensors") continue;
    auto f = SafetensorsFile::Open(e.path().string());
    const TensorInfo* t = f.ok() ? (*f)->Find(tensor) : nullptr;
    if (t == nullptr) continue;
    uint64_t offset = (*f)->data_start() + t->begin;
    f->reset();
    std::fstream io(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    io.seekp(static_cast<std::streamoff>(offset));
    io.put(static_cast<char>(1));
    return root;
  }
  ADD_FAILURE() << "fixture tensor not found: " << tensor;
  return root;
}

TEST_F(CliTest, KeysGenerateShowAndRefuseLooseKey) {
  MakeKey();
  struct stat st;
  ASSERT_EQ(::stat(Key().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_TRUE(fs::exists(Key() + ".pub"));
  Result show = Run("keys show --key " + Key() + " --json");
  ASSERT_EQ(show.rc, 0) << show.err;
  auto j = nlohmann::json::parse(show.out);
  EXPECT_EQ(j["keyid"].get<std::string>().size(), 64u);
  auto trust = testing::ReadAll(Trust());
  EXPECT_EQ(std::string(trust.begin(), trust.end()), j["trust_line"].get<std::string>());
  EXPECT_EQ(Run("keys generate --out " + Key()).rc, 2);  // never overwrites a key
  ::chmod(Key().c_str(), 0644);
  Result loose = Run("keys show --key " + Key());
  EXPECT_EQ(loose.rc, 2);
  EXPECT_THAT(loose.err, HasSubstr("FAILED_PRECONDITION"));
}

TEST_F(CliTest, AuditVerifyQueryAndReport) {
  MakeKey();
  Result pass = Audit(Fixture("mini-kimi-mxfp4").string());
  ASSERT_EQ(pass.rc, 0) << pass.err;
  EXPECT_EQ(nlohmann::json::parse(pass.out)["verdict"], "pass");

  Result pair = Audit(Fixture("mini-kimi-nvfp4").string(),
                      "--source " + Fixture("mini-kimi-mxfp4").string() + " --forward-layer 1");
  ASSERT_EQ(pair.rc, 0) << pair.err;
  auto pj = nlohmann::json::parse(pair.out);
  EXPECT_EQ(pj["record_id"], 2);  // each audit logs its record and then its test result
  EXPECT_EQ(pj["test_result_id"], 3);
  ASSERT_EQ(pj["checks"].size(), 5u);
  EXPECT_EQ(pj["checks"][3]["name"], "pair_verify");
  EXPECT_EQ(pj["checks"][3]["verdict"], "pass");
  EXPECT_EQ(pj["checks"][4]["name"], "block_forward");
  EXPECT_EQ(pj["checks"][4]["verdict"], "pass");

  fs::path bad = OverSpanCopy(dir_);
  Result fail = Audit(bad.string());
  ASSERT_EQ(fail.rc, 1) << fail.out << fail.err;
  EXPECT_EQ(nlohmann::json::parse(fail.out)["verdict"], "fail");

  Result vlog = Run("verify-log --db " + Db() + " --trust " + Trust());
  EXPECT_EQ(vlog.rc, 0) << vlog.out;
  EXPECT_THAT(vlog.out, HasSubstr("6 entries, 6 signatures verified"));

  Result q = Run("query --db " + Db() + " --verdict fail --json");
  ASSERT_EQ(q.rc, 0) << q.err;
  auto qj = nlohmann::json::parse(q.out);
  ASSERT_EQ(qj["records"].size(), 2u);  // the failing record and its test result
  EXPECT_EQ(qj["records"][0]["id"], 5);
  EXPECT_EQ(qj["records"][0]["predicate_type"], "https://in-toto.io/attestation/test-result/v0.1");
  EXPECT_EQ(qj["records"][1]["id"], 4);
  Result page = Run("query --db " + Db() + " --limit 2 --json");
  auto page_j = nlohmann::json::parse(page.out);
  EXPECT_EQ(page_j["records"].size(), 2u);
  Result rest = Run("query --db " + Db() + " --limit 2 --json --page-token " +
                    page_j["next_page_token"].get<std::string>());
  EXPECT_EQ(nlohmann::json::parse(rest.out)["records"][0]["id"], 3);

  // The failing record names the tensor, row and group; the report shows them.
  Result md = Run("report --db " + Db() + " 4 --format md --trust " + Trust());
  ASSERT_EQ(md.rc, 0) << md.err;
  EXPECT_THAT(md.out, HasSubstr("over-span"));
  EXPECT_THAT(md.out, HasSubstr("layers.1.block_sparse_moe.experts.0.w1"));
  EXPECT_THAT(md.out, HasSubstr("signature | valid"));
  Result js = Run("report --db " + Db() + " 2 --format json --trust " + Trust());
  auto predicate = nlohmann::json::parse(js.out)["statement"]["predicate"];
  EXPECT_EQ(predicate["verdict"], "pass");
  EXPECT_EQ(predicate["pair_audit"]["verdict"], "lossless");
  EXPECT_EQ(predicate["block_forward"]["layers"][0]["layer"], 1);
  EXPECT_EQ(predicate["block_forward"]["summary"][0]["verdict"], "bit-identical");

  // verify: signature, subjects against the disk, inclusion under the signed checkpoint.
  Result ok = Run("verify --db " + Db() + " --id 4 --root " + bad.string() + " --trust " + Trust());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("included in the signed tree head of size 6"));
  testing::WriteAll(bad / "config.json", std::string("{}"));
  Result changed =
      Run("verify --db " + Db() + " --id 4 --root " + bad.string() + " --trust " + Trust());
  EXPECT_EQ(changed.rc, 1);
  EXPECT_THAT(changed.out, HasSubstr("subject config.json: digest differs"));
}

TEST_F(CliTest, PairRecordBindsTheSourceAndItsRefsAndVerifyChecksIt) {
  MakeKey();
  fs::path source = CopyFixture("mini-kimi-mxfp4", dir_);
  Result a = Audit(Fixture("mini-kimi-nvfp4").string(),
                   "--source " + source.string() +
                       " --model-ref org/derived@abc --source-ref org/source@def "
                       "--image-digest sha256:0123");
  ASSERT_EQ(a.rc, 0) << a.err;
  Result js = Run("report --db " + Db() + " 0 --format json --trust " + Trust());
  auto predicate = nlohmann::json::parse(js.out)["statement"]["predicate"];
  EXPECT_EQ(predicate["refs"]["model_ref"], "org/derived@abc");
  EXPECT_EQ(predicate["refs"]["source_ref"], "org/source@def");
  EXPECT_EQ(predicate["refs"]["image_digest"], "sha256:0123");
  EXPECT_EQ(predicate["source"]["files"].size(), 4u);
  EXPECT_EQ(predicate["source"]["manifest_root"].get<std::string>().size(), 64u);

  Result ok = Run("verify --db " + Db() + " --id 0 --source " + source.string() + " --trust " +
                  Trust());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("source: all 5 digests match"));
  // A source that is not the one the derived checkpoint was proved against does not verify.
  testing::WriteAll(source / "config.json", std::string("{}"));
  Result changed = Run("verify --db " + Db() + " --id 0 --source " + source.string() +
                       " --trust " + Trust());
  EXPECT_EQ(changed.rc, 1);
  EXPECT_THAT(changed.out, HasSubstr("source config.json: digest differs"));
  // A record without a source binds none (record 2: record 1 is the first audit's test result).
  ASSERT_EQ(Audit(Fixture("mini-kimi-mxfp4").string()).rc, 0);
  Result none = Run("verify --db " + Db() + " --id 2 --source " + source.string() +
                    " --trust " + Trust());
  EXPECT_EQ(none.rc, 1);
  EXPECT_THAT(none.out, HasSubstr("source: the record binds none"));
}

// An X4T container declares the absolute root it was built at (/x4t); mounted elsewhere, its
// pair audit fails the format contract unless --map-root says where it is, and the mapping used
// is in the signed record.
TEST_F(CliTest, X4TPairAuditTakesARootMapping) {
  MakeKey();
  fs::path x4t = CopyFixture("mini-kimi-x4t", dir_);
  const std::string source = " --source " + Fixture("mini-kimi-mxfp4").string();
  Result unmapped = Audit(x4t.string(), source);
  EXPECT_EQ(unmapped.rc, 1) << unmapped.err;
  const std::string real = fs::canonical(x4t).string();
  Result mapped = Audit(x4t.string(), source + " --map-root /x4t=" + real);
  ASSERT_EQ(mapped.rc, 0) << mapped.err;
  const int64_t id = nlohmann::json::parse(mapped.out)["record_id"];
  Result js =
      Run("report --db " + Db() + " " + std::to_string(id) + " --format json --trust " + Trust());
  const nlohmann::json report = nlohmann::json::parse(js.out);
  std::string listed;
  for (const auto& c : report["statement"]["predicate"]["checks"]) {
    if (c["name"] == "pair_verify") listed = c["details"]["root_map"].dump();
  }
  EXPECT_EQ(listed, "[\"/x4t=" + real + "\"]");
  EXPECT_EQ(Audit(x4t.string(), source + " --map-root x4t").rc, 2);  // not /DECLARED=/ACTUAL
}

TEST_F(CliTest, VsaFileVerifiesAgainstTheLog) {
  MakeKey();
  std::string vsa = (dir_ / "vsa.json").string();
  ASSERT_EQ(Audit(Fixture("mini-kimi-mxfp4").string(), "--vsa " + vsa).rc, 0);
  Result r = Run("verify " + vsa + " --db " + Db() + " --trust " + Trust() + " --json");
  EXPECT_EQ(r.rc, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("summarizes record 0"));
  auto bytes = testing::ReadAll(vsa);
  auto env = evidence::ParseEnvelope(std::string(bytes.begin(), bytes.end() - 1));  // drop \n
  ASSERT_TRUE(env.ok());
  EXPECT_THAT(env->payload, HasSubstr("https://slsa.dev/verification_summary/v1"));
  EXPECT_THAT(env->payload, HasSubstr("\"verificationResult\":\"PASSED\""));
}

TEST_F(CliTest, VerifyLogFailsOnTamperingAndUnknownTrust) {
  MakeKey();
  ASSERT_EQ(Audit(Fixture("mini-kimi-mxfp4").string()).rc, 0);
  ASSERT_EQ(Audit(Fixture("mini-kimi-nvfp4").string()).rc, 0);
  {
    testing::RawDb db(Db());
    db.DropTriggers();
    ASSERT_EQ(db.Exec("UPDATE entries SET verdict = 'fail' WHERE seq = 0"), SQLITE_OK);
  }
  Result r = Run("verify-log --db " + Db() + " --trust " + Trust() + " --json");
  EXPECT_EQ(r.rc, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_FALSE(j["ok"].get<bool>());
  EXPECT_THAT(j["problems"].dump(), HasSubstr("index columns differ"));

  EXPECT_EQ(Run("verify-log --db " + (dir_ / "missing.db").string() + " --trust " + Trust()).rc, 2);
}

TEST_F(CliTest, DefaultDatabaseAndKeyAreAnnouncedOnce) {
  Result first = Run("audit " + Fixture("mini-kimi-mxfp4").string());
  ASSERT_EQ(first.rc, 0) << first.err;
  EXPECT_THAT(first.err, HasSubstr("using the per-user evidence database"));
  EXPECT_THAT(first.err, HasSubstr("generated now"));
  fs::path home = dir_ / "xdg" / "ckpt-audit";
  EXPECT_TRUE(fs::exists(home / "evidence.db"));
  struct stat st;
  ASSERT_EQ(::stat((home / "audit-key.pem").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Result second = Run("audit " + Fixture("mini-kimi-nvfp4").string());
  ASSERT_EQ(second.rc, 0) << second.err;
  EXPECT_THAT(second.err, Not(HasSubstr("generated now")));
  // Default trust file was written with the generated key, so verify-log needs no --trust.
  Result v = Run("verify-log --db " + (home / "evidence.db").string());
  EXPECT_EQ(v.rc, 0) << v.out;
  EXPECT_THAT(v.out, HasSubstr("4 entries"));
}

TEST_F(CliTest, HtmlReportRendersInHeadlessChromium) {
  ASSERT_EQ(std::system("command -v chromium > /dev/null 2>&1"), 0)
      << "chromium is required for this test; deploy/install-deps.sh installs package 'chromium'";
  MakeKey();
  fs::path bad = OverSpanCopy(dir_);
  ASSERT_EQ(Audit(bad.string()).rc, 1);
  std::string html = (dir_ / "report.html").string();
  Result r = Run("report --db " + Db() + " 0 --format html -o " + html + " --trust " + Trust());
  ASSERT_EQ(r.rc, 0) << r.err;
  auto page = testing::ReadAll(html);
  std::string text(page.begin(), page.end());
  EXPECT_THAT(text, HasSubstr("<svg"));
  EXPECT_THAT(text, HasSubstr("Scale exponent span per layer"));
  EXPECT_THAT(text, HasSubstr("policy window 17"));

  std::string png = (dir_ / "report.png").string();
  std::string cmd = "chromium --headless --no-sandbox --disable-gpu --hide-scrollbars "
                    "--user-data-dir='" + (dir_ / "chromium").string() + "' --screenshot='" + png +
                    "' --window-size=1100,1400 'file://" + html + "' > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto bytes = testing::ReadAll(png);
  ASSERT_GT(bytes.size(), 10000u) << "screenshot missing or tiny";
  testing::PngPixels px = testing::DecodePng(bytes);
  ASSERT_TRUE(px.error.empty()) << px.error;
  EXPECT_EQ(px.width, 1100u);
  EXPECT_EQ(px.height, 1400u);
  EXPECT_GT(px.colours.size(), 50u) << "screenshot is (nearly) a single colour";
  uint64_t most = 0;
  for (const auto& [c, n] : px.colours) most = std::max(most, n);
  EXPECT_LT(most, uint64_t{px.width} * px.height * 95 / 100);
  // The failing verdict's red header (#c0392b) is on screen.
  auto red = px.colours.find(0xc0392b);
  ASSERT_NE(red, px.colours.end());
  EXPECT_GT(red->second, 20000u);
}

}  // namespace
}  // namespace ckpt
