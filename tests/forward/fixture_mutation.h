// Mutations of a copied fixture for forward tests: one NVFP4 scale of an expert off by a
// power of two.
#ifndef CKPT_TESTS_FORWARD_FIXTURE_MUTATION_H_
#define CKPT_TESTS_FORWARD_FIXTURE_MUTATION_H_

#include <filesystem>
#include <fstream>
#include <string>

#include "core/checkpoint.h"
#include "gtest/gtest.h"

namespace ckpt::forward {

// Multiplies one E4M3 weight_scale (a power of two, as transcodes write) of an active group
// of `module` in `root` by 2, or by 1/2 at the top of the E4M3 range.
inline void ScaleOneByPowerOfTwo(const std::filesystem::path& root, const std::string& module) {
  auto ckpt = Checkpoint::Open(root.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto scale = (*ckpt)->Find(module + ".weight_scale");
  auto packed = (*ckpt)->Find(module + ".weight_packed");
  ASSERT_TRUE(scale && packed);
  ASSERT_EQ(scale->info->dtype, DType::kF8_E4M3);
  // The first 16-block of row 0 with a nonzero nibble.
  const auto p = packed->bytes();
  const uint64_t row_bytes = packed->info->shape[1];
  uint64_t block = 0;
  for (;; ++block) {
    ASSERT_LT(block * 8, row_bytes);
    bool active = false;
    for (int k = 0; k < 8; ++k) active |= (p[block * 8 + k] & 0x77) != 0;
    if (active) break;
  }
  const uint64_t offset = scale->file->data_start() + scale->info->begin + block;
  const std::string path = scale->file->path();
  const uint8_t old = scale->bytes()[block];
  const int exp = (old >> 3) & 0xF, man = old & 7;
  uint8_t mutated;
  if (exp == 0) {
    mutated = static_cast<uint8_t>((old & 0x80) | (man < 4 ? man << 1 : 0x08));  // subnormal x2
  } else {
    mutated = static_cast<uint8_t>(exp < 14 ? old + 8 : old - 8);  // exponent +1 or -1
  }
  ckpt->reset();
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  const char byte = static_cast<char>(mutated);
  f.write(&byte, 1);
}

}  // namespace ckpt::forward

#endif  // CKPT_TESTS_FORWARD_FIXTURE_MUTATION_H_
