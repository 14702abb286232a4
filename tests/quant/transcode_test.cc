// The NVFP4 transcoder: output equals the bundled NVFP4 fixture tensor for tensor, passes pair
// verification, and an over-span or NaN source fails without writing anything.
#include "core/quant/transcode.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "core/checkpoint.h"
#include "core/progress.h"
#include "core/quant/pair_verify.h"
#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using ::ckpt::quant::testing::FileSizeLimit;
using ::ckpt::quant::testing::Files;
using ::ckpt::quant::testing::kExpert;
using ::ckpt::quant::testing::MutateTensor;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::ReadAll;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

absl::StatusOr<TranscodeResult> Transcode(const fs::path& src, const fs::path& dst,
                                          TranscodeOptions options = {}) {
  return TranscodeToNvfp4(src.string(), dst.string(), options, NoProgress());
}

// Names in `dir` other than `keep`.
std::vector<std::string> LeftBehind(const fs::path& dir, const std::set<std::string>& keep) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!keep.count(e.path().filename().string())) out.push_back(e.path().filename().string());
  }
  return out;
}

TEST(Transcode, OutputEqualsTheNvfp4FixtureTensorForTensor) {
  TempDir dir;
  auto r = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(LeftBehind(dir.path(), {"out"}), IsEmpty());
  EXPECT_EQ(r->modules_transcoded, 96u);
  EXPECT_EQ(r->zero_groups_canonicalized, 2u * 4 * 3 * 3);
  auto got = Checkpoint::Open((dir / "out").string());
  auto want = Checkpoint::Open(Fixture("mini-kimi-nvfp4").string());
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok());
  ASSERT_EQ((*got)->TensorNames(), (*want)->TensorNames());
  for (const std::string& name : (*want)->TensorNames()) {
    auto a = (*got)->Find(name);
    auto b = (*want)->Find(name);
    EXPECT_EQ(a->info->dtype, b->info->dtype) << name;
    EXPECT_EQ(a->info->shape, b->info->shape) << name;
    EXPECT_TRUE(std::equal(a->bytes().begin(), a->bytes().end(), b->bytes().begin(),
                           b->bytes().end())) << name;
    EXPECT_EQ((*got)->RelativePath(*a->file), (*want)->RelativePath(*b->file)) << name;
  }
  EXPECT_EQ((*got)->config().at("quantization_config"),
            (*want)->config().at("quantization_config"));
  EXPECT_EQ((*got)->text_config().at("quantization_config"),
            (*want)->text_config().at("quantization_config"));
  // Shards are laid out as the reference writer lays them out: byte-identical files, and so is
  // the index.
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                        "model.safetensors.index.json"}) {
    EXPECT_EQ(ReadAll(dir / "out" / f), ReadAll(Fixture("mini-kimi-nvfp4") / f)) << f;
  }
  // config.json as the transcoder that held the whole tree wrote it (eb7f65a; the fixture's own
  // config comes from another writer): the streamed transcode writes the same bytes.
  EXPECT_EQ(ToHex(Sha256Of(ReadAll(dir / "out" / "config.json"))),
            "934bb31cf2c83d7559e43f1b437f6000797a94b13206a3b958cf1647c1819e12");
  // And it passes pair verification against its source.
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  auto v = VerifyPair(**src, **got, {}, NoProgress());
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_TRUE(v->lossless) << v->mismatches.ToJson().dump(2);
}

TEST(Transcode, OverSpanSourceFailsNamingTheGroupAndWritesNothing) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "9.w2";
  MutateTensor(root, m + ".weight_packed",
               [](uint8_t* p, size_t) { p[7 * 96 + 4 * 16 + 3] = 0x70; });
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[7 * 6 + 4] = 90; });
  auto r = Transcode(root, dir / "out");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string msg(r.status().message());
  EXPECT_NE(msg.find("over-span: " + m + " row 7 group 4"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(dir / "out"));
  // Neither the temporary directory nor the lock file is left behind.
  EXPECT_THAT(LeftBehind(dir.path(), {"mini-kimi-mxfp4"}), IsEmpty());
}

TEST(Transcode, NaNScaleSourceFails) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "3.w1";
  MutateTensor(root, m + ".weight_packed", [](uint8_t* p, size_t) { p[0] = 0x33; });
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[0] = 0xFF; });
  auto r = Transcode(root, dir / "out");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(r.status().message()).find("nan-scale: " + m + " row 0 group 0"),
            std::string::npos) << r.status();
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// The fixture source is about 5 MB; a 240 KiB window is 20 times smaller, holds its headers
// (raw and parsed, about 180 KB) and a few fused groups (26 KB each), but not its largest
// tensors (embed_tokens, lm_head: 256 KiB of BF16), which are written through as they stream
// past, never held.
TEST(Transcode, SmallWindowGivesTheSameBytesAndStaysInIt) {
  TempDir dir;
  auto whole = Transcode(Fixture("mini-kimi-mxfp4"), dir / "whole");
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (unsigned threads : {1u, 3u}) {
    TranscodeOptions o;
    o.memory_window = 240 << 10;
    o.threads = threads;
    const fs::path out = dir / ("small-" + std::to_string(threads));
    auto small = Transcode(Fixture("mini-kimi-mxfp4"), out, o);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_LE(small->peak_kept_bytes, o.memory_window);
    EXPECT_GT(small->peak_kept_bytes, 0u);
    EXPECT_EQ(Files(out), Files(dir / "whole")) << threads;
    // Each byte of the source read once.
    EXPECT_EQ(small->bytes_read, whole->bytes_read);
  }
}

TEST(Transcode, OutputDigestsAreThoseOfTheFilesPublished) {
  TempDir dir;
  auto r = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_NE(r->output, nullptr);
  EXPECT_EQ(r->output->root, fs::canonical(dir / "out").string());
  std::map<std::string, std::string> stated;
  for (const ImageFile& f : r->output->files) stated[f.path] = ToHex(*f.sha256);
  std::map<std::string, std::string> disk;
  for (const auto& [name, bytes] : Files(dir / "out")) disk[name] = ToHex(Sha256Of(bytes));
  EXPECT_EQ(stated, disk);
}

TEST(Transcode, MissingParentIsNotFoundNamingIt) {
  TempDir dir;
  auto r = Transcode(Fixture("mini-kimi-mxfp4"), dir / "new" / "parent" / "out");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr((dir / "new" / "parent").string()));
  EXPECT_FALSE(fs::exists(dir / "new"));
}

TEST(Transcode, DiskFullMidShardNamesFileAndOffsetThenResumeIsByteIdentical) {
  TempDir dir;
  auto want = Transcode(Fixture("mini-kimi-mxfp4"), dir / "want");
  ASSERT_TRUE(want.ok()) << want.status();
  TranscodeOptions o;
  o.threads = 1;
  {
    FileSizeLimit limit(1 << 20);
    auto r = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out", o);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss) << r.status();
    const std::string msg(r.status().message());
    EXPECT_THAT(msg, HasSubstr(".out.transcode-tmp/model-0000")) << msg;
    EXPECT_THAT(msg, HasSubstr("-of-00002.safetensors: cannot write ")) << msg;
    EXPECT_THAT(msg, HasSubstr(" bytes at offset ")) << msg;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("--resume"));
  }
  EXPECT_FALSE(fs::exists(dir / "out"));
  ASSERT_TRUE(fs::is_directory(dir / ".out.transcode-tmp"));
  // Without --resume the leftover is refused, not reused or removed.
  auto again = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out", o);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInvalidArgument) << again.status();
  EXPECT_THAT(std::string(again.status().message()), HasSubstr("--resume"));
  o.resume = true;
  auto resumed = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out", o);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->shards_redone, 2u);  // the first cut short, the second never written
  EXPECT_EQ(Files(dir / "out"), Files(dir / "want"));
  EXPECT_THAT(LeftBehind(dir.path(), {"out", "want"}), IsEmpty());
}

TEST(Transcode, ResumeRefusesWhatIsNotThisRunsTemporaryDirectory) {
  TempDir dir;
  TranscodeOptions resume;
  resume.resume = true;
  auto none = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out", resume);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("no temporary directory"));

  // A link at the temporary name, fresh or resumed.
  fs::create_directory(dir / "elsewhere");
  fs::create_directory_symlink(dir / "elsewhere", dir / ".out.transcode-tmp");
  for (bool r : {false, true}) {
    TranscodeOptions o;
    o.resume = r;
    auto linked = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out", o);
    EXPECT_EQ(linked.status().code(), absl::StatusCode::kAlreadyExists) << linked.status();
    EXPECT_THAT(std::string(linked.status().message()), HasSubstr("symbolic link"));
  }
  EXPECT_TRUE(fs::is_empty(dir / "elsewhere"));
  fs::remove(dir / ".out.transcode-tmp");

  // A directory another run left (no run record), fresh or resumed: never touched.
  fs::create_directory(dir / ".out.transcode-tmp");
  fs::permissions(dir / ".out.transcode-tmp", fs::perms::owner_all);
  ::ckpt::testing::WriteAll(dir / ".out.transcode-tmp" / "theirs", std::string("x"));
  for (bool r : {false, true}) {
    TranscodeOptions o;
    o.resume = r;
    auto other = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out", o);
    EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists) << other.status();
    EXPECT_THAT(std::string(other.status().message()), HasSubstr("another run"));
  }
  EXPECT_EQ(ReadAll(dir / ".out.transcode-tmp" / "theirs").size(), 1u);
  fs::remove_all(dir / ".out.transcode-tmp");

  // An interrupted run of another source, and of this source changed since.
  auto src = CopyFixture("mini-kimi-mxfp4", dir);
  {
    FileSizeLimit limit(1 << 20);
    ASSERT_FALSE(Transcode(src, dir / "out").ok());
  }
  auto other_source = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out", resume);
  EXPECT_EQ(other_source.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(other_source.status().message()), HasSubstr("another run (source"));
  MutateTensor(src, kExpert + "0.w2.weight_packed", [](uint8_t* p, size_t) { p[0] ^= 0x10; });
  auto changed = Transcode(src, dir / "out", resume);
  EXPECT_EQ(changed.status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(changed.status().message()),
              HasSubstr("the source changed since the interrupted run: model-0000"));
  EXPECT_TRUE(fs::is_directory(dir / ".out.transcode-tmp"));
  EXPECT_FALSE(fs::exists(dir / "out"));
}

// --resume continues only a temporary directory this user alone can have written (docs/quant.md,
// "Resuming"): mode 0700 and owned by this user, every entry a regular file of this user with
// one link. Anything else is refused naming it, untouched, and a plain rerun does not suggest
// --resume for it.
TEST(Transcode, ResumeContinuesOnlyATemporaryDirectoryThisUserAloneWrote) {
  TempDir dir;
  auto src = CopyFixture("mini-kimi-mxfp4", dir);
  {
    FileSizeLimit limit(1 << 20);
    ASSERT_FALSE(Transcode(src, dir / "out").ok());
  }
  const fs::path tmp = dir / ".out.transcode-tmp";
  ASSERT_TRUE(fs::is_directory(tmp));
  const fs::path shard = tmp / "model-00001-of-00002.safetensors";
  ASSERT_TRUE(fs::is_regular_file(shard));
  TranscodeOptions resume;
  resume.resume = true;
  // Each way the directory could be someone else's, undone after it is tried.
  auto refused = [&](const std::string& what, const std::string& reason) {
    auto plain = Transcode(src, dir / "out");
    EXPECT_EQ(plain.status().code(), absl::StatusCode::kAlreadyExists) << what;
    EXPECT_THAT(std::string(plain.status().message()), Not(HasSubstr("--resume"))) << what;
    auto r = Transcode(src, dir / "out", resume);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << what << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(reason)) << what;
    EXPECT_FALSE(fs::exists(dir / "out")) << what;
  };
  fs::permissions(tmp, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec |
                           fs::perms::others_read | fs::perms::others_exec);
  refused("mode 0755", ".out.transcode-tmp has mode 0755, not 0700");
  fs::permissions(tmp, fs::perms::owner_all);
  fs::create_hard_link(shard, dir / "a-second-name");
  refused("a hard link", "model-00001-of-00002.safetensors has 2 links");
  fs::remove(dir / "a-second-name");
  ASSERT_EQ(::mkfifo((tmp / "fifo").c_str(), 0600), 0);
  refused("a FIFO", "/fifo is not a regular file");
  fs::remove(tmp / "fifo");
  fs::create_symlink(shard, tmp / "link");
  refused("a symbolic link", "/link is not a regular file");
  fs::remove(tmp / "link");
  if (::geteuid() == 0) {  // owners other than this user need root to make
    ASSERT_EQ(::chown(tmp.c_str(), 65534, 65534), 0);
    refused("another user's directory", ".out.transcode-tmp is owned by uid 65534, not by uid 0");
    ASSERT_EQ(::chown(tmp.c_str(), 0, 0), 0);
    ASSERT_EQ(::chown(shard.c_str(), 65534, 65534), 0);
    refused("another user's shard", "safetensors is owned by uid 65534, not by uid 0");
    ASSERT_EQ(::chown(shard.c_str(), 0, 0), 0);
  } else {
    std::printf("not root: the other-owner cases need root to chown, and are not run\n");
  }
  // The directory as the interrupted run left it is continued.
  auto resumed = Transcode(src, dir / "out", resume);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_FALSE(fs::exists(tmp));
}

TEST(Transcode, SecondTranscodeToTheSameDestinationIsRefused) {
  TempDir dir;
  const fs::path lock = dir / ".out.transcode.lock";
  ::ckpt::testing::WriteAll(lock, std::string());
  const int fd = ::open(lock.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);  // what a running transcode holds
  auto r = Transcode(Fixture("mini-kimi-mxfp4"), dir / "out");
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("another transcode"));
  EXPECT_FALSE(fs::exists(dir / ".out.transcode-tmp"));
  ::close(fd);
  EXPECT_TRUE(Transcode(Fixture("mini-kimi-mxfp4"), dir / "out").ok());
}

TEST(Transcode, RefusesExistingDestinationAndNonMxfp4Source) {
  TempDir dir;
  fs::create_directory(dir / "out");
  EXPECT_EQ(Transcode(Fixture("mini-kimi-mxfp4"), dir / "out").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Transcode(Fixture("mini-kimi-nvfp4"), dir / "out2").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir / "out2"));
}

}  // namespace
}  // namespace ckpt::quant
