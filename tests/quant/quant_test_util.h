// Helpers for quant tests: mutate tensors inside a copied checkpoint's shards in place, rewrite
// a one-shard checkpoint's tensors, read a tree back, make writes fail past a size.
#ifndef CKPT_TESTS_QUANT_QUANT_TEST_UTIL_H_
#define CKPT_TESTS_QUANT_QUANT_TEST_UTIL_H_

#include <sys/resource.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/checkpoint.h"
#include "core/quant/format.h"
#include "core/quant/safetensors_writer.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::quant::testing {

// The format detector's report on the checkpoint at `root`; failing to open it fails the test.
inline FormatReport Detect(const std::filesystem::path& root, const FormatOptions& options = {}) {
  auto c = Checkpoint::Open(root.string());
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? DetectFormat(**c, options) : FormatReport{};
}

// Findings counted by code, as JSON text.
inline std::string Codes(const FindingList& f) { return f.ToJson()["by_code"].dump(); }
inline std::string Codes(const FormatReport& r) { return Codes(r.findings); }

inline const std::string kExpert = "language_model.model.layers.1.block_sparse_moe.experts.";

// Rewrites the bytes of `tensor` inside the (copied, writable) checkpoint at `root` with
// `mutate`, using the shard header to find the tensor's file offset.
inline void MutateTensor(const std::filesystem::path& root, const std::string& tensor,
                         const std::function<void(uint8_t*, size_t)>& mutate) {
  auto ckpt = Checkpoint::Open(root.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto ref = (*ckpt)->Find(tensor);
  ASSERT_TRUE(ref.has_value()) << tensor;
  const uint64_t offset = ref->file->data_start() + ref->info->begin;
  std::vector<uint8_t> bytes(ref->bytes().begin(), ref->bytes().end());
  const std::string path = ref->file->path();
  ckpt->reset();
  mutate(bytes.data(), bytes.size());
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

// Rewrites the (copied) checkpoint's model.safetensors through `edit`, which may change a
// tensor's name or shape, or return false to drop it.
inline void RewriteTensors(const std::filesystem::path& dir,
                           const std::function<bool(TensorToWrite&)>& edit) {
  std::vector<TensorToWrite> out;
  {
    auto c = Checkpoint::Open(dir.string());
    ASSERT_TRUE(c.ok()) << c.status();
    for (const std::string& n : (*c)->TensorNames()) {
      const TensorRef t = *(*c)->Find(n);
      TensorToWrite w = TensorToWrite::Owned(n, t.info->dtype, t.info->shape,
                                             {t.bytes().begin(), t.bytes().end()});
      if (edit(w)) out.push_back(std::move(w));
    }
  }
  std::filesystem::remove(dir / "model.safetensors");
  ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), std::move(out),
                               {{"format", "pt"}})
                  .ok());
}

// Writes a single-file checkpoint into `dst` (created): `from`'s config.json and every tensor of
// `from` for which `take` gives a name (its own or a new one), plus `extra`.
inline void WriteCheckpointFrom(const std::filesystem::path& from,
                                const std::filesystem::path& dst,
                                const std::function<std::string(const std::string&)>& take,
                                std::vector<TensorToWrite> extra = {}) {
  auto src = Checkpoint::Open(from.string());
  ASSERT_TRUE(src.ok()) << src.status();
  for (const std::string& n : (*src)->TensorNames()) {
    const std::string name = take(n);
    if (name.empty()) continue;
    const TensorRef t = *(*src)->Find(n);
    extra.push_back(TensorToWrite::Borrowed(*t.info, t.bytes()));
    extra.back().name = name;
  }
  std::filesystem::create_directories(dst);
  std::filesystem::copy_file(from / "config.json", dst / "config.json");
  ASSERT_TRUE(WriteSafetensors((dst / "model.safetensors").string(), std::move(extra), {}).ok());
}

// Every file under `root` by relative path, with its bytes.
inline std::map<std::string, std::vector<uint8_t>> Files(const std::filesystem::path& root) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
    if (e.is_regular_file()) {
      out[std::filesystem::relative(e.path(), root).string()] = ::ckpt::testing::ReadAll(e.path());
    }
  }
  return out;
}

// Writes past `limit` bytes of any file fail with EFBIG (SIGXFSZ ignored) while it lives: a
// disk that fills up mid-shard.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t limit) {
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &old_);
    rlimit l = old_;
    l.rlim_cur = limit;
    ::setrlimit(RLIMIT_FSIZE, &l);
  }
  ~FileSizeLimit() {
    ::setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_;
  void (*old_handler_)(int);
};

}  // namespace ckpt::quant::testing

#endif  // CKPT_TESTS_QUANT_QUANT_TEST_UTIL_H_
