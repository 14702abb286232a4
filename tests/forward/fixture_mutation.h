// Mutations of a copied fixture for forward tests: one NVFP4 scale of an expert off by a
// power of two; or a lossless rewrite of an expert's w3 (global scale and every block scale
// halved) that vLLM's w1/w3 global-scale collapse turns lossy (docs/formats.md §5).
#ifndef CKPT_TESTS_FORWARD_FIXTURE_MUTATION_H_
#define CKPT_TESTS_FORWARD_FIXTURE_MUTATION_H_

#include <filesystem>
#include <fstream>
#include <cstring>
#include <string>
#include <vector>

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

// Sets the E4M3 weight_scale of the first 16-block of row 0 of `module` that holds a nonzero
// nibble to NaN (0x7F): loading the module is then DATA_LOSS naming it.
inline void PoisonFirstActiveScale(const std::filesystem::path& root, const std::string& module) {
  auto ckpt = Checkpoint::Open(root.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto scale = (*ckpt)->Find(module + ".weight_scale");
  auto packed = (*ckpt)->Find(module + ".weight_packed");
  ASSERT_TRUE(scale && packed) << module;
  ASSERT_EQ(scale->info->dtype, DType::kF8_E4M3);
  const auto p = packed->bytes();
  uint64_t block = 0;
  for (;; ++block) {
    ASSERT_LT(block * 8, packed->info->shape[1]);
    bool active = false;
    for (int k = 0; k < 8; ++k) active |= (p[block * 8 + k] & 0x77) != 0;
    if (active) break;
  }
  const uint64_t offset = scale->file->data_start() + scale->info->begin + block;
  const std::string path = scale->file->path();
  ckpt->reset();
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  const char nan = 0x7F;
  f.write(&nan, 1);
}

// Writes `len` bytes at `offset` of the file `path`.
inline void Overwrite(const std::string& path, uint64_t offset, const void* data, size_t len) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(len));
  ASSERT_TRUE(f.good()) << path;
}

// Halves `module`'s F32 weight_global_scale (the NVFP4 divisor) and every nonzero E4M3
// weight_scale: each value e2m1 * scale / global is unchanged, so the pair stays lossless on
// disk, but the module's global scale no longer equals its sibling's. Requires every nonzero
// scale to be normal with a biased exponent >= 2 (true of transcoder output, whose scales are
// 2^0 .. 2^8), so that halving is exact.
inline void HalveGlobalAndBlockScales(const std::filesystem::path& root,
                                      const std::string& module) {
  auto ckpt = Checkpoint::Open(root.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto scale = (*ckpt)->Find(module + ".weight_scale");
  auto global = (*ckpt)->Find(module + ".weight_global_scale");
  ASSERT_TRUE(scale && global) << module;
  ASSERT_EQ(scale->info->dtype, DType::kF8_E4M3);
  ASSERT_EQ(global->info->dtype, DType::kF32);
  ASSERT_EQ(global->info->num_bytes(), 4u);
  std::vector<uint8_t> scales(scale->bytes().begin(), scale->bytes().end());
  for (uint8_t& b : scales) {
    if ((b & 0x7F) == 0) continue;
    const int exp = (b >> 3) & 0xF;
    ASSERT_GE(exp, 2) << module << ": a scale too small to halve exactly";
    ASSERT_FALSE(exp == 15 && (b & 7) == 7) << module << ": NaN scale";
    b = static_cast<uint8_t>(b - 8);
  }
  float g;
  std::memcpy(&g, global->bytes().data(), 4);
  g /= 2;
  const std::string scale_path = scale->file->path(), global_path = global->file->path();
  const uint64_t scale_at = scale->file->data_start() + scale->info->begin;
  const uint64_t global_at = global->file->data_start() + global->info->begin;
  ckpt->reset();
  Overwrite(scale_path, scale_at, scales.data(), scales.size());
  Overwrite(global_path, global_at, &g, 4);
}

}  // namespace ckpt::forward

#endif  // CKPT_TESTS_FORWARD_FIXTURE_MUTATION_H_
