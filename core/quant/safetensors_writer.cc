#include "core/quant/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant {
namespace {

// Position in the reference implementation's Dtype enum, whose derived order the writer sorts
// by (descending): BOOL F4 F6_E2M3 F6_E3M2 U8 I8 F8_E5M2 F8_E4M3 F8_E8M0 F8_E4M3FNUZ
// F8_E5M2FNUZ I16 U16 F16 BF16 I32 U32 F32 C64 F64 I64 U64.
int DTypeRank(DType d) {
  static constexpr DType kOrder[] = {
      DType::kBool, DType::kF4, DType::kF6_E2M3, DType::kF6_E3M2, DType::kU8, DType::kI8,
      DType::kF8_E5M2, DType::kF8_E4M3, DType::kF8_E8M0, DType::kF8_E4M3FNUZ,
      DType::kF8_E5M2FNUZ, DType::kI16, DType::kU16, DType::kF16, DType::kBF16, DType::kI32,
      DType::kU32, DType::kF32, DType::kC64, DType::kF64, DType::kI64, DType::kU64};
  for (int i = 0; i < static_cast<int>(std::size(kOrder)); ++i) {
    if (kOrder[i] == d) return i;
  }
  return -1;
}

absl::Status WriteFully(int fd, const uint8_t* p, uint64_t n, const std::string& path) {
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<uint64_t>(n, 1u << 30));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return absl::DataLossError(absl::StrCat(path, ": write: ", std::strerror(errno)));
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

TensorToWrite TensorToWrite::Borrowed(const TensorInfo& info, std::span<const uint8_t> bytes) {
  return {info.name, info.dtype, info.shape, bytes, {}};
}

TensorToWrite TensorToWrite::Owned(std::string name, DType dtype, std::vector<uint64_t> shape,
                                   std::vector<uint8_t> bytes) {
  return {std::move(name), dtype, std::move(shape), {}, std::move(bytes)};
}

absl::StatusOr<SafetensorsLayout> LayOutSafetensors(
    const std::string& path, std::vector<TensorEntry> tensors,
    const std::map<std::string, std::string>& metadata, TensorOrder order) {
  if (order == TensorOrder::kReference) {
    std::sort(tensors.begin(), tensors.end(), [](const TensorEntry& a, const TensorEntry& b) {
      const int ra = DTypeRank(a.dtype), rb = DTypeRank(b.dtype);
      return ra != rb ? ra > rb : a.name < b.name;
    });
  }
  std::set<std::string_view> names;
  // Built by hand: the reference header keeps "dtype, shape, data_offsets" in that order, and
  // nlohmann would sort the keys.
  std::string header = "{";
  if (!metadata.empty()) header += "\"__metadata__\":" + DumpJson(nlohmann::json(metadata)) + ",";
  SafetensorsLayout layout;
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorEntry& t = tensors[i];
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": duplicate tensor ", t.name));
    }
    uint64_t elements = 1;
    for (uint64_t d : t.shape) elements *= d;
    const uint64_t bits = elements * DTypeBits(t.dtype);
    if (bits % 8 != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", t.name, " is not a whole number of bytes"));
    }
    absl::StrAppend(&header, i ? "," : "", DumpJson(nlohmann::json(t.name)), ":{\"dtype\":\"",
                    DTypeName(t.dtype), "\",\"shape\":", DumpJson(nlohmann::json(t.shape)),
                    ",\"data_offsets\":[", offset, ",", offset + bits / 8, "]}");
    layout.offsets.push_back(offset);
    layout.sizes.push_back(bits / 8);
    offset += bits / 8;
  }
  header += "}";
  header.append((8 - header.size() % 8) % 8, ' ');
  for (int i = 0; i < 8; ++i) {
    layout.prefix.push_back(static_cast<uint8_t>(header.size() >> (8 * i)));
  }
  layout.prefix.insert(layout.prefix.end(), header.begin(), header.end());
  for (uint64_t& o : layout.offsets) o += layout.prefix.size();
  layout.file_size = layout.prefix.size() + offset;
  layout.tensors = std::move(tensors);
  return layout;
}

absl::Status WriteSafetensors(const std::string& path, std::vector<TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata) {
  std::vector<TensorEntry> entries;
  std::map<std::string, std::span<const uint8_t>> data;
  for (const TensorToWrite& t : tensors) {
    entries.push_back({t.name, t.dtype, t.shape});
    data[t.name] = t.data();
  }
  absl::StatusOr<SafetensorsLayout> layout = LayOutSafetensors(path, std::move(entries), metadata);
  if (!layout.ok()) return layout.status();
  for (size_t i = 0; i < layout->tensors.size(); ++i) {
    const std::string& name = layout->tensors[i].name;
    if (data[name].size() != layout->sizes[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": ", name, " has ", data[name].size(), " bytes for its shape"));
    }
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return absl::DataLossError(absl::StrCat(path, ": open: ", std::strerror(errno)));
  absl::Status s = WriteFully(fd, layout->prefix.data(), layout->prefix.size(), path);
  for (const TensorEntry& t : layout->tensors) {
    if (s.ok()) s = WriteFully(fd, data[t.name].data(), data[t.name].size(), path);
  }
  if (s.ok() && ::fsync(fd) != 0) {
    s = absl::DataLossError(absl::StrCat(path, ": fsync: ", std::strerror(errno)));
  }
  ::close(fd);
  return s;
}

}  // namespace ckpt::quant
