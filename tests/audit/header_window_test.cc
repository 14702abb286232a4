// Safetensors headers count against the memory window (docs/audit-engine.md, "Memory"): a
// header is counted when its 8-byte length has been read, before its bytes are allocated, and
// the two trees of a pair audit share one window. The attack: eight files with large headers
// (about 100 MB each in the outside review, scaled down here) took gigabytes of memory in an
// audit whose window was far smaller.
#include <malloc.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/audit/audit_checks.h"
#include "core/audit/forward_check.h"
#include "core/io/tree_image.h"
#include "core/quant/safetensors_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/audit/fault_fs.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace ckpt::audit {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::FaultDirectory;
using ::ckpt::testing::ReadHook;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1ull << 20;

// `files` safetensors files of one small tensor each, with a header of about `header` bytes
// (a metadata string), in a new directory `name`; returns it.
fs::path WriteBigHeaders(const TempDir& tmp, const std::string& name, int files,
                         uint64_t header) {
  const fs::path root = tmp / name;
  fs::create_directory(root);
  WriteAll(root / "config.json", std::string("{}"));
  for (int i = 1; i <= files; ++i) {
    std::vector<quant::TensorToWrite> t;
    t.push_back(quant::TensorToWrite::Owned("t", DType::kU8, {8}, std::vector<uint8_t>(8, 1)));
    const std::string file = "model-0000" + std::to_string(i) + "-of-0000" +
                             std::to_string(files) + ".safetensors";
    absl::Status s = quant::WriteSafetensors((root / file).string(), std::move(t),
                                             {{"pad", std::string(header, 'p')}});
    EXPECT_TRUE(s.ok()) << s;
  }
  return root;
}

// A directory whose every file read adds its length to `*read`.
std::shared_ptr<const io::Directory> Counting(const fs::path& root,
                                              std::shared_ptr<std::atomic<uint64_t>> read) {
  return FaultDirectory::Open(root.string(),
                              {"", [](int) {}, [read](uint64_t, size_t n) { *read += n; }});
}

TEST(HeaderWindowTest, EightLargeHeadersAreRefusedBeforeTheyAreRead) {
  TempDir tmp;
  const fs::path root = WriteBigHeaders(tmp, "big", 8, 2 * kMiB);
  auto read = std::make_shared<std::atomic<uint64_t>>(0);
  AuditOptions o;
  o.root = root.string();
  o.root_dir = Counting(root, read);
  o.memory_window = 6 * kMiB;
  o.threads = 8;
  auto rec = RunAudit(o, NoProgress());
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kResourceExhausted) << rec.status();
  EXPECT_THAT(std::string(rec.status().message()), ::testing::ContainsRegex(
                                          "\\.safetensors: its (parsed )?safetensors header of "));
  EXPECT_THAT(rec.status().message(), HasSubstr("memory window of 6291456 bytes"));
  EXPECT_THAT(rec.status().message(), HasSubstr("--memory-window"));
  // Every byte read was read into memory the window counted (8-byte length prefixes aside).
  EXPECT_LE(read->load(), o.memory_window);
  EXPECT_GT(read->load(), 2 * kMiB);  // headers that fit were read
}

// Each tree's headers fit the window alone (4 x 2 MiB, and as much again parsed: the metadata
// string), not together.
TEST(HeaderWindowTest, APairAuditsTwoTreesInOneWindow) {
  TempDir tmp;
  const fs::path derived = WriteBigHeaders(tmp, "derived", 4, 2 * kMiB);
  const fs::path source = WriteBigHeaders(tmp, "source", 4, 2 * kMiB);
  auto read = std::make_shared<std::atomic<uint64_t>>(0);
  AuditOptions o;
  o.root = derived.string();
  o.root_dir = Counting(derived, read);
  o.source = source.string();
  o.source_dir = Counting(source, read);
  o.memory_window = 24 * kMiB;
  auto rec = RunAudit(o, NoProgress());
  ASSERT_FALSE(rec.ok());
  EXPECT_EQ(rec.status().code(), absl::StatusCode::kResourceExhausted) << rec.status();
  EXPECT_THAT(rec.status().message(), HasSubstr(source.string()));
  EXPECT_THAT(rec.status().message(), HasSubstr("safetensors header of "));
  EXPECT_LE(read->load(), o.memory_window);
  EXPECT_GT(read->load(), 8 * kMiB);  // the derived tree's headers were read
}

// The forward command reads through the same engine: its two trees' headers share the window
// too (it used to open each tree with a window of its own).
TEST(HeaderWindowTest, AForwardReadsBothTreesHeadersInOneWindow) {
  TempDir tmp;
  const fs::path derived = WriteBigHeaders(tmp, "derived", 4, 2 * kMiB);
  const fs::path source = WriteBigHeaders(tmp, "source", 4, 2 * kMiB);
  forward::ForwardAuditOptions o;
  o.root = derived.string();
  o.source = source.string();
  o.memory_window = 24 * kMiB;
  auto r = RunForward("", o, forward::CpuDevice());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr(source.string()));
  EXPECT_THAT(r.status().message(), HasSubstr("safetensors header of "));
}

// A read that only hashes (fingerprint) parses each header and drops its bytes, keeping the
// parsed entries (here the metadata string, 4 MiB with its spare capacity): the raw headers in
// flight at once share what the parsed ones leave of the window, so a window that holds every
// parsed header and one raw header reads them all, and a header larger than the window is
// refused before it is read.
TEST(HeaderWindowTest, HashingOnlyHoldsRawHeadersInTheWindowWhileParsing) {
  TempDir tmp;
  const fs::path root = WriteBigHeaders(tmp, "hash", 8, 2 * kMiB);
  ReadOptions o;
  o.keep = ReadOptions::Keep::kNothing;
  o.threads = 8;
  o.memory_window = 36 * kMiB;
  auto image = ReadTree(root.string(), o);
  ASSERT_TRUE(image.ok()) << image.status();
  for (const ImageFile& f : (*image)->files) {
    EXPECT_TRUE(f.sha256.has_value()) << f.path;
    EXPECT_TRUE(f.header_status.ok()) << f.header_status;
    EXPECT_EQ(f.content, nullptr);
  }
  // The parsed headers stay counted; the raw ones were given back.
  EXPECT_GT((*image)->kept_bytes, 16 * kMiB);
  EXPECT_LE((*image)->kept_bytes, o.memory_window);

  o.memory_window = 1 * kMiB;
  auto refused = ReadTree(root.string(), o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("memory window of 1048576 bytes"));
}

// This process's resident memory, in KiB, after giving freed heap back to the system.
long OwnRssKiB() {
  ::malloc_trim(0);
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6));
  }
  return -1;
}

// The peak resident memory of `ckpt-audit ARGS` run in a child process, in KiB. The child is
// forked from this process, so the peak is at least what the fork copied (at most OwnRssKiB()).
long ChildPeakRssKiB(const std::vector<std::string>& args, const fs::path& xdg) {
  const std::string bin = std::string(::ckpt::testing::kBinaryDir) + "/services/cli/ckpt-audit";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("XDG_DATA_HOME", xdg.c_str(), 1);
    ::setenv("XDG_CONFIG_HOME", xdg.c_str(), 1);  // no config file of the developer's
    ::setenv("XDG_STATE_HOME", xdg.c_str(), 1);
    std::FILE* null = std::fopen("/dev/null", "w");
    ::dup2(::fileno(null), 1);
    ::dup2(::fileno(null), 2);
    std::vector<char*> argv = {const_cast<char*>(bin.c_str())};
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  struct rusage usage {};
  EXPECT_EQ(::wait4(pid, &status, 0, &usage), pid);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 127);
  return usage.ru_maxrss;
}

// The review's measurement, scaled down: in a 16 MiB window (where one 12 MiB header and its
// parsed copy do not fit either), the audit of eight files with 12 MiB headers grows the process
// by less than the window over the audit of one such file. Before headers were counted, each
// of the eight was read and parsed (about 300 MB).
TEST(HeaderWindowTest, TheCliDoesNotGrowPastTheWindowOnLargeHeaders) {
  TempDir tmp;
  const fs::path one = WriteBigHeaders(tmp, "one", 1, 12 * kMiB);
  const fs::path eight = WriteBigHeaders(tmp, "eight", 8, 12 * kMiB);
  const long own = OwnRssKiB();
  const long base = ChildPeakRssKiB({"audit", one.string(), "--memory-window", "16777216"},
                                    tmp / "xdg");
  const long attack = ChildPeakRssKiB({"audit", eight.string(), "--memory-window", "16777216"},
                                      tmp / "xdg");
  std::printf("peak RSS: test process %ld KiB, one header %ld KiB, eight headers %ld KiB\n",
              own, base, attack);
  // The audit of one header itself holds that header (12 MiB): the measurement is of the CLI,
  // not of what the fork copied from this process.
  EXPECT_GT(base, own + 12 * 1024);
  EXPECT_LT(attack, base + 16 * 1024) << "base " << base << " KiB, eight headers " << attack
                                      << " KiB";
}

}  // namespace
}  // namespace ckpt::audit
