// End-to-end tests of the evidence commands through the ckpt-audit binary: keys, audit (pass,
// fail, per-user defaults), verify, verify-log (clean and tampered, rolled back, forked, pinned),
// query, report, and the HTML report rendered by headless Chromium.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/evidence_log.h"
#include "storage/head_state.h"
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
  Result VerifyLog(const std::string& db, const std::string& extra = "") {
    return Run("verify-log --db " + db + " --trust " + Trust() + " " + extra);
  }
  // A log at `db` under origin kOrigin, signed with Key(), holding sample records [from, to).
  void BuildLog(const std::string& db, int from, int to) {
    auto key = evidence::SigningKey::Load(Key());
    ASSERT_TRUE(key.ok()) << key.status();
    auto log = storage::EvidenceLog::Open(db, true, kOrigin);
    ASSERT_TRUE(log.ok()) << log.status();
    for (int i = from; i < to; ++i) {
      ASSERT_TRUE((*log)->Append(testing::SampleEnvelope(*key, i), *key).ok());
    }
  }
  // "size N root HEX" of the tree at `size` of the log at `db`.
  std::string HeadAt(const std::string& db, uint64_t size) {
    auto log = storage::EvidenceLog::OpenReadOnly(db);
    return storage::DescribeHead({kOrigin, size, *(*log)->RootAt(size)});
  }
  // Where the CLI remembers kOrigin's head (log_heads.h).
  fs::path HeadFile() {
    return dir_ / "xdg-state" / "ckpt-audit" / "heads" /
           ToHex(Sha256Of(evidence::AsBytes(std::string(kOrigin))));
  }

  static constexpr char kOrigin[] = "rollback.test/log";
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
  EXPECT_THAT(changed.out, HasSubstr("subject changed: config.json"));
}

// A log is signed by one key (docs/evidence.md, "One key per log"): `audit --db shared.db`
// with another key than the one that signs it (here the per-user key, no --key) is refused,
// naming both keys, and appends nothing; the log still verifies, and its own key appends.
TEST_F(CliTest, AppendWithAnotherKeyThanTheLogsIsRefused) {
  MakeKey();
  const std::string root = Fixture("mini-kimi-mxfp4").string();
  ASSERT_EQ(Audit(root).rc, 0);
  auto size = [&] { return *(*storage::EvidenceLog::OpenReadOnly(Db()))->Size(); };
  const uint64_t before = size();
  auto key = evidence::SigningKey::Load(Key());
  ASSERT_TRUE(key.ok()) << key.status();

  Result other = Run("audit " + root + " --db " + Db() + " --json");  // the per-user key
  EXPECT_EQ(other.rc, 2) << other.out << other.err;
  EXPECT_THAT(other.err, HasSubstr("FAILED_PRECONDITION"));
  EXPECT_THAT(other.err, HasSubstr("its checkpoints are signed by key " +
                                   key->public_key().KeyId()));
  EXPECT_THAT(other.err, HasSubstr("give that log's key (--key)"));
  EXPECT_EQ(size(), before);
  EXPECT_EQ(VerifyLog(Db()).rc, 0);

  ASSERT_EQ(Audit(root).rc, 0);
  EXPECT_GT(size(), before);
  EXPECT_EQ(VerifyLog(Db()).rc, 0);
}

// `verify --require-pass` also requires the record's verdict to be pass: a valid, logged record
// of a failed audit exits 1 with it (0 without: the record is genuine).
TEST_F(CliTest, VerifyRequirePassExitsOneOnAFailedRecord) {
  MakeKey();
  Result pass = Audit(Fixture("mini-kimi-mxfp4").string());
  ASSERT_EQ(pass.rc, 0) << pass.err;
  Result fail = Audit(OverSpanCopy(dir_).string());
  ASSERT_EQ(fail.rc, 1) << fail.err;
  const auto id = [](const Result& r) {
    return std::to_string(nlohmann::json::parse(r.out)["record_id"].get<int>());
  };
  const std::string verify = "verify --db " + Db() + " --trust " + Trust() + " --id ";
  EXPECT_EQ(Run(verify + id(fail)).rc, 0);
  Result required = Run(verify + id(fail) + " --require-pass");
  EXPECT_EQ(required.rc, 1) << required.out << required.err;
  EXPECT_THAT(required.out, HasSubstr("[FAIL] verdict: the record says fail (--require-pass)"));
  Result passed = Run(verify + id(pass) + " --require-pass");
  EXPECT_EQ(passed.rc, 0) << passed.out << passed.err;
  EXPECT_THAT(passed.out, HasSubstr("[ok] verdict: the record says pass"));
}

// `--version` names the version, the commit, the build type and the CUDA architectures.
TEST_F(CliTest, VersionSaysWhatWasBuilt) {
  Result v = Run("--version");
  EXPECT_EQ(v.rc, 0) << v.err;
  for (const char* part : {"ckpt-audit ", "\ncommit ", "\nbuild type ", "\nCUDA architectures "}) {
    EXPECT_THAT(v.out, HasSubstr(part));
  }
}

// A failing check says why on the terminal: its first findings, and how many there are; a
// folder that is no checkpoint is exit 2 with the reason, and nothing is appended.
TEST_F(CliTest, FailingChecksPrintTheirFirstFindings) {
  MakeKey();
  const std::string log = " --db " + Db() + " --key " + Key();
  Result over = Run("audit " + OverSpanCopy(dir_).string() + log);
  EXPECT_EQ(over.rc, 1) << over.err;
  EXPECT_THAT(over.out, HasSubstr("scale_window           fail\n    over-span: ")) << over.out;
  fs::create_directories(dir_ / "readme-only");
  ::ckpt::testing::WriteAll(dir_ / "readme-only" / "README.md", std::string("# a model\n"));
  // A folder that is no checkpoint is an error, not a record (docs/audit-engine.md, "Not a
  // checkpoint").
  auto size = [&] { return *(*storage::EvidenceLog::OpenReadOnly(Db()))->Size(); };
  const uint64_t before = size();
  Result none = Run("audit " + (dir_ / "readme-only").string() + log);
  EXPECT_EQ(none.rc, 2) << none.out << none.err;
  EXPECT_THAT(none.err, HasSubstr("not a checkpoint the strict reader accepts: "));
  EXPECT_THAT(none.err, HasSubstr("readme-only has no config.json: a checkpoint folder holds"));
  EXPECT_EQ(size(), before);
}

// Every command that reads a log finds the per-user log `audit` writes by default, without --db.
TEST_F(CliTest, CommandsThatReadALogDefaultToThePerUserLog) {
  Result audited = Run("audit " + Fixture("mini-kimi-mxfp4").string() + " --json");
  ASSERT_EQ(audited.rc, 0) << audited.err;
  const std::string id =
      std::to_string(nlohmann::json::parse(audited.out)["record_id"].get<int>());
  Result q = Run("query --json");
  ASSERT_EQ(q.rc, 0) << q.err;
  EXPECT_EQ(nlohmann::json::parse(q.out)["records"].size(), 2u);  // the record, its test result
  Result vlog = Run("verify-log");
  EXPECT_EQ(vlog.rc, 0) << vlog.out << vlog.err;
  EXPECT_THAT(vlog.out, HasSubstr("LOG VERIFIED"));
  Result v = Run("verify --id " + id);
  EXPECT_EQ(v.rc, 0) << v.out << v.err;
  EXPECT_THAT(v.out, HasSubstr("VERIFIED"));
  Result proof = Run("proof --id " + id);
  EXPECT_EQ(proof.rc, 0) << proof.err;
  Result exported = Run("export --id " + id + " --format intoto-jsonl");
  EXPECT_EQ(exported.rc, 0) << exported.err;
  Result report = Run("report " + id + " --format json");
  EXPECT_EQ(report.rc, 0) << report.err;
}

// CKPT_AUDIT_DB and CKPT_AUDIT_KEY stand in for --db and --key (README.md, "Defaults"); a flag
// wins over them.
TEST_F(CliTest, EnvironmentNamesTheLogAndTheKey) {
  MakeKey();
  const fs::path env_db = dir_ / "env.db";
  const std::string env = "XDG_DATA_HOME='" + (dir_ / "xdg").string() + "' CKPT_AUDIT_DB='" +
                          env_db.string() + "' CKPT_AUDIT_KEY='" + Key() + "'";
  Result audited =
      ::ckpt::testing::RunCli("audit " + Fixture("mini-kimi-mxfp4").string(), dir_.path(), env);
  ASSERT_EQ(audited.rc, 0) << audited.err;
  EXPECT_THAT(audited.err, Not(HasSubstr("per-user")));  // neither default was used
  EXPECT_EQ(*(*storage::EvidenceLog::OpenReadOnly(env_db.string()))->Size(), 2u);
  EXPECT_FALSE(fs::exists(dir_ / "xdg" / "ckpt-audit" / "evidence.db"));
  Result q = ::ckpt::testing::RunCli("query --json", dir_.path(), env);
  ASSERT_EQ(q.rc, 0) << q.err;
  EXPECT_EQ(nlohmann::json::parse(q.out)["records"].size(), 2u);
  Result flag = ::ckpt::testing::RunCli("query --json --db " + Db(), dir_.path(), env);
  EXPECT_EQ(flag.rc, 2) << flag.out;  // --db names a log that does not exist
  // A RECORD file is also checked for inclusion in the log the environment names.
  const fs::path vsa = dir_ / "vsa.json";
  Result with_vsa = ::ckpt::testing::RunCli(
      "audit " + Fixture("mini-kimi-mxfp4").string() + " --vsa " + vsa.string(), dir_.path(), env);
  ASSERT_EQ(with_vsa.rc, 0) << with_vsa.err;
  Result record = ::ckpt::testing::RunCli("verify " + vsa.string() + " --trust " + Trust(),
                                          dir_.path(), env);
  EXPECT_EQ(record.rc, 0) << record.out << record.err;
  EXPECT_THAT(record.out, HasSubstr("is included in the signed tree"));
}

// The config file under XDG_CONFIG_HOME names the log, the key, the server and the token file;
// the environment wins over it and a flag over both (services/cli/settings.h). `config` shows
// each value and where it came from. A file others can write, an unknown setting and a relative
// path are refused, naming the file and the line.
TEST_F(CliTest, ConfigFileNamesTheLogAndTheKeyBelowTheEnvironment) {
  MakeKey();
  const fs::path file_db = dir_ / "file.db", env_db = dir_ / "env.db";
  const fs::path config = dir_ / "cfg" / "ckpt-audit" / "config";
  fs::create_directories(config.parent_path());
  auto write_config = [&](const std::string& text) {
    testing::WriteAll(config, text);
    fs::permissions(config, fs::perms::owner_read | fs::perms::owner_write);
  };
  write_config("# ckpt-audit settings\ndb = " + file_db.string() + "\n  key=" + Key() +
               "\nserver = audit.example:7433\ntoken-file = /etc/ckpt-audit/ci.token\n");
  const std::string env = "XDG_DATA_HOME='" + (dir_ / "xdg").string() + "' XDG_CONFIG_HOME='" +
                          (dir_ / "cfg").string() + "'";
  auto run = [&](const std::string& args, const std::string& more_env = "") {
    return ::ckpt::testing::RunCli(args, dir_.path(), env + " " + more_env);
  };
  Result audited = run("audit " + Fixture("mini-kimi-mxfp4").string());
  ASSERT_EQ(audited.rc, 0) << audited.err;
  EXPECT_THAT(audited.err, Not(HasSubstr("per-user")));
  EXPECT_EQ(*(*storage::EvidenceLog::OpenReadOnly(file_db.string()))->Size(), 2u);
  Result q = run("query --json");
  ASSERT_EQ(q.rc, 0) << q.err;
  EXPECT_EQ(nlohmann::json::parse(q.out)["records"].size(), 2u);

  Result shown = run("config --json");
  ASSERT_EQ(shown.rc, 0) << shown.err;
  std::map<std::string, nlohmann::json> by_name;
  auto read_settings = [&](const std::string& out) {
    const nlohmann::json j = nlohmann::json::parse(out);
    for (const auto& s : j["settings"]) by_name[s["name"].get<std::string>()] = s;
  };
  read_settings(shown.out);
  EXPECT_EQ(by_name["db"]["value"], file_db.string());
  EXPECT_EQ(by_name["db"]["source"], config.string() + ":2");
  EXPECT_EQ(by_name["key"]["source"], config.string() + ":3");
  EXPECT_EQ(by_name["server"]["value"], "audit.example:7433");
  EXPECT_EQ(by_name["token-file"]["value"], "/etc/ckpt-audit/ci.token");
  // The environment outranks the file: the log, and a token over the file's token file.
  Result env_shown =
      run("config --json", "CKPT_AUDIT_DB='" + env_db.string() + "' CKPT_AUDIT_TOKEN=secret-token");
  ASSERT_EQ(env_shown.rc, 0) << env_shown.err;
  read_settings(env_shown.out);
  EXPECT_EQ(by_name["db"]["value"], env_db.string());
  EXPECT_EQ(by_name["db"]["source"], "CKPT_AUDIT_DB");
  EXPECT_EQ(by_name["token-file"]["source"], "default");
  EXPECT_EQ(by_name["token"]["source"], "CKPT_AUDIT_TOKEN");
  EXPECT_THAT(env_shown.out, Not(HasSubstr("secret-token")));
  Result env_audit = run("audit " + Fixture("mini-kimi-mxfp4").string(),
                         "CKPT_AUDIT_DB='" + env_db.string() + "'");
  ASSERT_EQ(env_audit.rc, 0) << env_audit.err;
  EXPECT_EQ(*(*storage::EvidenceLog::OpenReadOnly(env_db.string()))->Size(), 2u);
  EXPECT_EQ(*(*storage::EvidenceLog::OpenReadOnly(file_db.string()))->Size(), 2u);
  // A part takes no log or key: neither the environment nor the file makes it refuse.
  Result part = run("audit " + Fixture("mini-kimi-mxfp4").string() + " --part 0/1 --part-key " +
                        Key() + " --out " + (dir_ / "part.json").string(),
                    "CKPT_AUDIT_DB='" + env_db.string() + "'");
  EXPECT_EQ(part.rc, 0) << part.err;

  fs::permissions(config, fs::perms::group_write, fs::perm_options::add);
  Result writable = run("query");
  EXPECT_EQ(writable.rc, 2);
  EXPECT_THAT(writable.err, HasSubstr(config.string()));
  write_config("db = " + file_db.string() + "\ndbb = /x\n");
  Result unknown = run("config");
  EXPECT_EQ(unknown.rc, 2);
  EXPECT_THAT(unknown.err, HasSubstr(config.string() + ":2: unknown setting 'dbb'"));
  write_config("db = evidence.db\n");
  Result relative = run("query");
  EXPECT_EQ(relative.rc, 2);
  EXPECT_THAT(relative.err, HasSubstr(":1: db must be an absolute path"));
  write_config("db = /a.db\ndb = /b.db\n");
  EXPECT_THAT(run("query").err, HasSubstr(":2: db is set twice"));
  write_config("db = /a.db\tx\x01\n");
  EXPECT_THAT(run("query").err, HasSubstr(":1: a control character"));
  // A byte order mark and comments after a value; a link to the file (a managed dotfile).
  const fs::path real = dir_ / "dotfiles" / "config";
  fs::create_directories(real.parent_path());
  write_config("");
  testing::WriteAll(real, "\xEF\xBB\xBF" "db = " + file_db.string() + "  # the team's log\n");
  fs::permissions(real, fs::perms::owner_read | fs::perms::owner_write);
  fs::remove(config);
  fs::create_symlink(real, config);
  Result linked = run("config --json");
  ASSERT_EQ(linked.rc, 0) << linked.err;
  read_settings(linked.out);
  EXPECT_EQ(by_name["db"]["value"], file_db.string());
}

// A .safetensors file given as the root is a one-file checkpoint: the record's root is the
// file, its subjects that file alone (nothing beside it, not even a config.json, is read), its
// scale tensors are checked, and verify --root checks the file. Any other file is not a
// checkpoint: exit 2, nothing appended.
TEST_F(CliTest, OneSafetensorsFileIsAOneFileCheckpoint) {
  MakeKey();
  const fs::path file = dir_ / "one" / "weights.safetensors";
  fs::create_directories(file.parent_path());
  fs::copy_file(Fixture("mini-gpt-oss-mxfp4") / "model.safetensors", file);
  testing::WriteAll(dir_ / "one" / "config.json", std::string("not read"));
  Result a = Audit(file.string());
  EXPECT_EQ(a.rc, 0) << a.err << a.out;
  Result js = Run("report --db " + Db() + " 0 --format json --trust " + Trust());
  ASSERT_EQ(js.rc, 0) << js.err;
  const auto statement = nlohmann::json::parse(js.out)["statement"];
  EXPECT_EQ(statement["predicate"]["root"], file.string());
  for (const auto& c : statement["predicate"]["checks"]) {
    if (c["name"] == "checkpoint_structure") EXPECT_EQ(c["details"]["layout"], "single-file");
    if (c["name"] == "scale_window") EXPECT_EQ(c["counts"]["tensors"], 16);
    if (c["name"] == "fingerprint") EXPECT_EQ(c["counts"]["files"], 1);
  }
  std::vector<std::string> names;
  for (const auto& s : statement["subject"]) names.push_back(s["name"]);
  EXPECT_THAT(names, ::testing::ElementsAre("weights.safetensors", "oms-manifest-root"));
  Result ok =
      Run("verify --db " + Db() + " --id 0 --root " + file.string() + " --trust " + Trust());
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err;
  Result inspect = Run("inspect " + file.string());
  EXPECT_EQ(inspect.rc, 0) << inspect.err;
  // A byte changed in the file after the audit: the record no longer matches it.
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x5a');
  }
  Result changed =
      Run("verify --db " + Db() + " --id 0 --root " + file.string() + " --trust " + Trust());
  EXPECT_EQ(changed.rc, 1) << changed.out;

  auto size = [&] { return *(*storage::EvidenceLog::OpenReadOnly(Db()))->Size(); };
  const uint64_t before = size();
  Result other = Audit((dir_ / "one" / "config.json").string());
  EXPECT_EQ(other.rc, 2) << other.out;
  EXPECT_THAT(other.err, HasSubstr("a file is a checkpoint only when it is a .safetensors file"));
  EXPECT_EQ(size(), before);
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
  EXPECT_THAT(changed.out, HasSubstr("source changed: config.json"));
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

// The rollback attack of issue 21 against the CLI: a log verified once, then its tail deleted with
// the triggers dropped and created again. verify-log verified such a log before; now it names the
// head it verified and the shorter one, and the commands that read or append refuse the log, so
// the next audit cannot get a deleted record's id.
TEST_F(CliTest, VerifyLogRemembersItsHeadAndRefusesARolledBackLog) {
  MakeKey();
  BuildLog(Db(), 0, 6);
  const std::string head6 = HeadAt(Db(), 6), head4 = HeadAt(Db(), 4);
  Result first = VerifyLog(Db());
  ASSERT_EQ(first.rc, 0) << first.out;
  ASSERT_TRUE(fs::exists(HeadFile()));
  struct stat st;
  ASSERT_EQ(::stat(HeadFile().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(storage::ReadHeadFile(HeadFile().string())->value().head.size, 6u);

  ASSERT_EQ(testing::RawDb(Db()).DeleteTail(4), SQLITE_OK);
  Result rolled = VerifyLog(Db());
  EXPECT_EQ(rolled.rc, 1) << rolled.out;
  EXPECT_THAT(rolled.out, HasSubstr("rolled back"));
  EXPECT_THAT(rolled.out, HasSubstr(head6));
  EXPECT_THAT(rolled.out, HasSubstr(head4));
  EXPECT_THAT(rolled.out, HasSubstr("LOG NOT VERIFIED"));
  // Another user (another state directory) has no memory of the log: the attack works there.
  Result fresh = testing::RunCli("verify-log --db " + Db() + " --trust " + Trust(), dir_.path(),
                                 "XDG_STATE_HOME='" + (dir_ / "other-user").string() + "'");
  EXPECT_EQ(fresh.rc, 0) << fresh.out;

  for (const std::string& reader : {"query --db " + Db(), "proof --db " + Db() + " --id 0",
                                    "report --db " + Db() + " 0 --trust " + Trust(),
                                    "verify --db " + Db() + " --id 0 --trust " + Trust()}) {
    Result r = Run(reader);
    EXPECT_EQ(r.rc, 2) << reader << "\n" << r.out;
    EXPECT_THAT(r.err, HasSubstr("rolled back")) << reader;
    EXPECT_THAT(r.err, HasSubstr(head6)) << reader;
  }
  Result audit = Audit(Fixture("mini-kimi-mxfp4").string());
  EXPECT_EQ(audit.rc, 2) << audit.out;
  EXPECT_THAT(audit.err, HasSubstr("rolled back"));
  auto log = storage::EvidenceLog::OpenReadOnly(Db());
  EXPECT_EQ(*(*log)->Size(), 4u);  // record id 4 was not given out again
}

// The same through `audit` alone: the writer remembers the head of every append, so a record id
// the log once gave out is never given out again.
TEST_F(CliTest, AuditAfterARollbackNeverReusesARecordId) {
  MakeKey();
  ASSERT_EQ(Audit(Fixture("mini-kimi-mxfp4").string()).rc, 0);
  Result second = Audit(Fixture("mini-kimi-nvfp4").string());
  ASSERT_EQ(second.rc, 0) << second.err;
  ASSERT_EQ(nlohmann::json::parse(second.out)["record_id"], 2);
  ASSERT_EQ(testing::RawDb(Db()).DeleteTail(2), SQLITE_OK);
  Result again = Audit(Fixture("mini-kimi-nvfp4").string());
  EXPECT_EQ(again.rc, 2) << again.out;
  EXPECT_THAT(again.err, HasSubstr("rolled back"));
  EXPECT_THAT(again.err, HasSubstr("size 4 root "));
  EXPECT_THAT(again.err, HasSubstr("size 2 root "));
}

// A fork: another log under the same origin, signed by the same key, with other entries. Of the
// same size it is "forked"; longer, "not consistent"; both name the two heads.
TEST_F(CliTest, VerifyLogDetectsAFork) {
  MakeKey();
  BuildLog(Db(), 0, 4);
  ASSERT_EQ(VerifyLog(Db()).rc, 0);
  const std::string fork = (dir_ / "fork.db").string();
  BuildLog(fork, 10, 14);
  Result forked = VerifyLog(fork, "--json");
  EXPECT_EQ(forked.rc, 1) << forked.out;
  std::string problems = nlohmann::json::parse(forked.out)["problems"].dump();
  EXPECT_THAT(problems, HasSubstr("forked"));
  EXPECT_THAT(problems, HasSubstr(HeadAt(Db(), 4)));
  EXPECT_THAT(problems, HasSubstr(HeadAt(fork, 4)));
  BuildLog(fork, 14, 15);
  Result longer = VerifyLog(fork);
  EXPECT_EQ(longer.rc, 1) << longer.out;
  EXPECT_THAT(longer.out, HasSubstr("not consistent"));
  EXPECT_THAT(longer.out, HasSubstr(HeadAt(fork, 5)));
  // The remembered head is still the first log's, which goes on verifying as it grows.
  BuildLog(Db(), 4, 6);
  EXPECT_EQ(VerifyLog(Db()).rc, 0);
  EXPECT_EQ(storage::ReadHeadFile(HeadFile().string())->value().head.size, 6u);
}

// An outside monitor pins a head it saw: a log consistent with it verifies, one that is not (a
// wrong root, a head beyond the log) fails naming both heads; the two flags go together.
TEST_F(CliTest, VerifyLogChecksAPinnedHead) {
  MakeKey();
  BuildLog(Db(), 0, 5);
  auto log = storage::EvidenceLog::OpenReadOnly(Db());
  const std::string root3 = ToHex(*(*log)->RootAt(3)), root5 = ToHex(*(*log)->RootAt(5));
  const std::string state = "XDG_STATE_HOME='" + (dir_ / "monitor").string() + "'";
  auto pin = [&](const std::string& size, const std::string& root) {
    return testing::RunCli("verify-log --db " + Db() + " --trust " + Trust() +
                               " --expect-size " + size + " --expect-tree-root " + root,
                           dir_.path(), state);
  };
  EXPECT_EQ(pin("3", root3).rc, 0);
  EXPECT_EQ(pin("5", root5).rc, 0);
  Result wrong = pin("3", root5);
  EXPECT_EQ(wrong.rc, 1) << wrong.out;
  EXPECT_THAT(wrong.out, HasSubstr("not consistent"));
  EXPECT_THAT(wrong.out, HasSubstr("size 3 root " + root5));
  EXPECT_THAT(wrong.out, HasSubstr("size 5 root " + root5));
  Result beyond = pin("7", root5);
  EXPECT_EQ(beyond.rc, 1) << beyond.out;
  EXPECT_THAT(beyond.out, HasSubstr("rolled back"));
  EXPECT_EQ(VerifyLog(Db(), "--expect-size 3").rc, 2);
  EXPECT_EQ(pin("3", "not-hex").rc, 2);
}

}  // namespace
}  // namespace ckpt
