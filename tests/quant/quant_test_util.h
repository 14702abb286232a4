// Helpers for quant tests: mutate tensors inside a copied checkpoint's shards in place.
#ifndef CKPT_TESTS_QUANT_QUANT_TEST_UTIL_H_
#define CKPT_TESTS_QUANT_QUANT_TEST_UTIL_H_

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "core/checkpoint.h"
#include "gtest/gtest.h"

namespace ckpt::quant::testing {

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

}  // namespace ckpt::quant::testing

#endif  // CKPT_TESTS_QUANT_QUANT_TEST_UTIL_H_
