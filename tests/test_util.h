// Helpers shared by tests: fixture paths and temporary copies that tests may mutate.
#ifndef CKPT_TESTS_TEST_UTIL_H_
#define CKPT_TESTS_TEST_UTIL_H_

#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_paths.h"

namespace ckpt::testing {

inline std::filesystem::path Fixture(const std::string& relative) {
  return std::filesystem::path(::ckpt::testing::kTestDataDir) / relative;
}

// Whether some mapping of this process holds `p` (/proc/self/maps).
inline bool IsMapped(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream range(line);
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    range >> std::hex >> begin >> dash >> end;
    if (begin <= at && at < end) return true;
  }
  return false;
}

// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl =
        (std::filesystem::temp_directory_path() / "ckpt-test-XXXXXX").string();
    path_ = ::mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& p) const { return path_ / p; }

 private:
  std::filesystem::path path_;
};

// Copies a fixture directory into `dst` with write permission, so the copy can be mutated.
inline std::filesystem::path CopyFixture(const std::string& name, const TempDir& dir) {
  namespace fs = std::filesystem;
  fs::path dst = dir / name;
  fs::copy(Fixture(name), dst, fs::copy_options::recursive);
  for (auto& e : fs::recursive_directory_iterator(dst)) {
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  fs::permissions(dst, fs::perms::owner_write, fs::perm_options::add);
  return dst;
}

// The bytes of every regular file under `root`.
inline uint64_t TreeBytes(const std::filesystem::path& root) {
  uint64_t n = 0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) n += e.file_size();
  }
  return n;
}

inline std::vector<uint8_t> ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

inline void WriteAll(const std::filesystem::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

inline void WriteAll(const std::filesystem::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

struct CliResult {
  int rc = -1;  // exit code, -1 if the process did not exit normally
  std::string out;
  std::string err;
};

// Runs the built `ckpt-audit` with `args` (shell words) and `env` (e.g. "XDG_DATA_HOME=/x")
// prefixed; `scratch` is a directory for the captured stderr and, unless `env` names others,
// the CLI's per-user state (XDG_STATE_HOME: the log heads it remembers) and config
// (XDG_CONFIG_HOME, where no config file is), never the real home's; the settings' variables
// of the caller's environment (CKPT_AUDIT_DB and the like) are unset, so only `env` sets them.
inline CliResult RunCli(const std::string& args, const std::filesystem::path& scratch,
                        const std::string& env = "") {
  std::filesystem::path err_file = scratch / "cli-stderr.txt";
  std::string cmd = "unset CKPT_AUDIT_DB CKPT_AUDIT_KEY CKPT_AUDIT_SERVER CKPT_AUDIT_TOKEN; "
                    "XDG_STATE_HOME='" +
                    (scratch / "xdg-state").string() + "' XDG_CONFIG_HOME='" +
                    (scratch / "xdg-config").string() + "' " + env + " '" +
                    std::string(::ckpt::testing::kBinaryDir) + "/services/cli/ckpt-audit' " + args +
                    " 2>'" + err_file.string() + "'";
  CliResult r;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) r.out.append(buf, n);
  int status = ::pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  auto err = ReadAll(err_file);
  r.err.assign(err.begin(), err.end());
  return r;
}

// A test that drives the CLI in a scratch directory of its own: a per-test XDG data home, an
// evidence database, a signing key and its trust file.
class CliWorkspace : public ::testing::Test {
 protected:
  CliResult Run(const std::string& args) {
    return RunCli(args, dir_.path(), "XDG_DATA_HOME='" + (dir_ / "xdg").string() + "'");
  }
  std::string Db() { return (dir_ / "log.db").string(); }
  std::string Key() { return (dir_ / "key.pem").string(); }
  std::string Trust() { return (dir_ / "trusted").string(); }
  void MakeKey() {
    CliResult r = Run("keys generate --out " + Key() + " --trust " + Trust());
    ASSERT_EQ(r.rc, 0) << r.err;
  }

  TempDir dir_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TEST_UTIL_H_
