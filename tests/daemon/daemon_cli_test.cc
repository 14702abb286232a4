// The shipped binaries together: ckpt-auditd on a loopback port, driven by `ckpt-audit submit`
// and `ckpt-audit gate`, checking the exit codes CI relies on.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <fcntl.h>

#include <chrono>
#include <regex>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

extern char** environ;

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CliResult;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::RunCli;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

class DaemonCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_ = CopyFixture("mini-kimi-mxfp4", dir_);
    dst_ = CopyFixture("mini-kimi-nvfp4", dir_);
    CliResult key = RunCli("keys generate --out " + (dir_ / "key.pem").string(), dir_.path());
    ASSERT_EQ(key.rc, 0) << key.err;
    std::string daemon = std::string(CKPT_BINARY_DIR) + "/services/daemon/ckpt-auditd";
    std::vector<std::string> args = {daemon, "--listen", "127.0.0.1:0",
                                     "--db", (dir_ / "ev.db").string(),
                                     "--key", (dir_ / "key.pem").string(),
                                     "--allow-root", dir_.path().string()};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    std::string log = (dir_ / "daemon.log").string();
    posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ASSERT_EQ(posix_spawn(&pid_, daemon.c_str(), &actions, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&actions);
    // The daemon prints the port it bound; wait for it (bounded).
    std::regex port_re("serving on port ([0-9]+)");
    for (int i = 0; i < 200 && server_.empty(); ++i) {
      auto text = ::ckpt::testing::ReadAll(log);
      std::string s(text.begin(), text.end());
      std::smatch m;
      if (std::regex_search(s, m, port_re)) server_ = "127.0.0.1:" + m[1].str();
      else std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_FALSE(server_.empty()) << "ckpt-auditd did not start";
  }
  void TearDown() override {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status = 0;
      ::waitpid(pid_, &status, 0);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "daemon did not stop cleanly";
    }
  }
  CliResult Cli(const std::string& args) {
    return RunCli(args + " --server " + server_, dir_.path());
  }

  TempDir dir_;
  fs::path src_, dst_;
  pid_t pid_ = -1;
  std::string server_;
};

TEST_F(DaemonCliTest, SubmitThenGateExitCodes) {
  CliResult gate0 = Cli("gate " + dst_.string());
  EXPECT_EQ(gate0.rc, 1) << gate0.err;  // nothing audited yet
  EXPECT_THAT(gate0.out, HasSubstr("no audit record"));

  CliResult submit = Cli("submit " + dst_.string() + " --source " + src_.string() + " --json");
  ASSERT_EQ(submit.rc, 0) << submit.err;
  auto j = nlohmann::json::parse(submit.out);
  EXPECT_EQ(j.at("verdict"), "pass");

  CliResult gate = Cli("gate " + dst_.string() + " --json");
  ASSERT_EQ(gate.rc, 0) << gate.err;
  auto g = nlohmann::json::parse(gate.out);
  EXPECT_TRUE(g.at("pass").get<bool>());
  EXPECT_EQ(g.at("record_id"), j.at("record_id"));
}

TEST_F(DaemonCliTest, ErrorsExitTwo) {
  CliResult outside = Cli("gate /");
  EXPECT_EQ(outside.rc, 2);
  EXPECT_THAT(outside.err, HasSubstr("PERMISSION_DENIED"));
  CliResult missing = Cli("submit " + (dir_ / "nope").string());
  EXPECT_EQ(missing.rc, 2);
  CliResult unreachable = RunCli("gate " + dst_.string() + " --server 127.0.0.1:1", dir_.path());
  EXPECT_EQ(unreachable.rc, 2);
  EXPECT_THAT(unreachable.err, HasSubstr("UNAVAILABLE"));
}

}  // namespace
}  // namespace ckpt
