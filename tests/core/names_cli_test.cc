// File and directory names that are not UTF-8, through the ckpt-audit binary: fingerprint,
// inspect, audit, report, query and verify all succeed and record the name encoding
// (docs/evidence.md, "Name encoding"); two names with one recorded form are refused. Before the
// encoding, `fingerprint --json` and `audit` died in nlohmann's dump() (exit 134).
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CliResult;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::Contains;
using ::testing::HasSubstr;
using ::testing::Not;

class NamesCliTest : public ::testing::Test {
 protected:
  // A copy of the MXFP4 fixture in a directory whose own name is not UTF-8, with a stray file
  // whose name is not UTF-8 either.
  void SetUp() override {
    root_ = dir_ / "ckpt-\xFF";
    fs::copy(Fixture("mini-kimi-mxfp4"), root_, fs::copy_options::recursive);
    for (auto& e : fs::recursive_directory_iterator(root_)) {
      fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    }
    fs::permissions(root_, fs::perms::owner_write, fs::perm_options::add);
    WriteAll(root_ / "notes-\xFF.txt", std::string("operator notes\n"));
  }

  CliResult Run(const std::string& args) {
    return ::ckpt::testing::RunCli(args, dir_.path(),
                                   "XDG_DATA_HOME='" + (dir_ / "xdg").string() + "'");
  }
  std::string Root() const { return "'" + root_.string() + "'"; }
  std::string Evidence() const {
    return " --db '" + (dir_ / "log.db").string() + "' --key '" + (dir_ / "key.pem").string() +
           "'";
  }
  std::string Trust() const { return " --trust '" + (dir_ / "trusted").string() + "'"; }

  TempDir dir_;
  fs::path root_;
};

std::vector<std::string> Strings(const nlohmann::json& array, const std::string& field) {
  std::vector<std::string> out;
  for (const auto& e : array) out.push_back(e.at(field).get<std::string>());
  return out;
}

TEST_F(NamesCliTest, FingerprintRecordsTheEncodedNames) {
  CliResult r = Run("fingerprint --json " + Root());
  ASSERT_EQ(r.rc, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_THAT(Strings(j["files"], "path"), Contains("notes-%FF.txt"));
  EXPECT_THAT(j["root"].get<std::string>(), ::testing::EndsWith("/ckpt-%FF"));
  EXPECT_THAT(Strings(j["manifest"]["resources"], "name"), Contains("notes-%FF.txt"));

  CliResult statement = Run("fingerprint --statement " + Root());
  ASSERT_EQ(statement.rc, 0) << statement.err;
  EXPECT_EQ(nlohmann::json::parse(statement.out)["subject"][0]["name"], "ckpt-%FF");

  CliResult text = Run("fingerprint " + Root());
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("notes-%FF.txt"));
  EXPECT_THAT(text.out, Not(HasSubstr("\xFF")));
}

TEST_F(NamesCliTest, InspectReportsTheEncodedRoot) {
  CliResult r = Run("inspect --json " + Root());
  ASSERT_EQ(r.rc, 0) << r.err;
  EXPECT_THAT(nlohmann::json::parse(r.out)["kind"].get<std::string>(), HasSubstr("/ckpt-%FF"));
  CliResult text = Run("inspect " + Root());
  ASSERT_EQ(text.rc, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("/ckpt-%FF"));
}

TEST_F(NamesCliTest, AuditSignsARecordThatNamesTheFileEncodedAndVerifies) {
  ASSERT_EQ(Run("keys generate --out '" + (dir_ / "key.pem").string() + "'" + Trust()).rc, 0);
  CliResult audit = Run("audit --json " + Root() + Evidence());
  ASSERT_TRUE(audit.rc == 0 || audit.rc == 1) << audit.rc << audit.err;
  const int id = nlohmann::json::parse(audit.out)["record_id"].get<int>();

  const std::string db = " --db '" + (dir_ / "log.db").string() + "'";
  CliResult report = Run("report" + db + " " + std::to_string(id) + " --format json" + Trust());
  ASSERT_EQ(report.rc, 0) << report.err;
  auto statement = nlohmann::json::parse(report.out)["statement"];
  EXPECT_THAT(Strings(statement["subject"], "name"), Contains("notes-%FF.txt"));
  EXPECT_THAT(statement["predicate"]["root"].get<std::string>(), ::testing::EndsWith("/ckpt-%FF"));

  // The raw root finds the record: query encodes it the way the record does.
  CliResult query = Run("query --json" + db + " --root " + Root());
  ASSERT_EQ(query.rc, 0) << query.err;
  EXPECT_EQ(nlohmann::json::parse(query.out)["records"].size(), 1u);

  // The recorded names match the files on disk again.
  CliResult verify = Run("verify" + db + " --id " + std::to_string(id) + " --root " + Root() +
                         Trust());
  EXPECT_EQ(verify.rc, 0) << verify.out << verify.err;
  EXPECT_THAT(verify.out, HasSubstr("digests match"));
}

TEST_F(NamesCliTest, TwoNamesWithOneRecordedFormAreRefused) {
  ASSERT_EQ(Run("keys generate --out '" + (dir_ / "key.pem").string() + "'" + Trust()).rc, 0);
  WriteAll(root_ / "notes-%FF.txt", std::string("a different file\n"));
  for (const std::string& command :
       {"fingerprint --json " + Root(), "audit " + Root() + Evidence()}) {
    SCOPED_TRACE(command);
    CliResult r = Run(command);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
    EXPECT_THAT(r.err, HasSubstr("\"notes-%FF.txt\""));
    EXPECT_THAT(r.err, HasSubstr("\"notes-\\xFF.txt\""));
  }
}

}  // namespace
}  // namespace ckpt
