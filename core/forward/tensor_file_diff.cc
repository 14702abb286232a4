#include "core/forward/tensor_file_diff.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/forward/result_diff.h"
#include "core/io/tree_stream.h"
#include "core/io/tree_walk.h"
#include "core/text/name_encoding.h"
#include "core/quant/codecs.h"
#include "core/safetensors.h"

namespace ckpt::forward {
namespace {

// Float dtypes in order of precision; 0 for anything else.
int FloatRank(DType d) {
  switch (d) {
    case DType::kF16:
    case DType::kBF16: return 1;
    case DType::kF32: return 2;
    case DType::kF64: return 3;
    default: return 0;
  }
}

double Value(DType d, const uint8_t* p) {
  switch (d) {
    case DType::kF16: {
      _Float16 h;
      std::memcpy(&h, p, 2);
      return static_cast<double>(h);
    }
    case DType::kBF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return quant::DecodeBF16(b);
    }
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    default: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
  }
}

// The bits of `v` rounded to dtype `d` (to nearest even; BF16 through F32, exact for F32 and
// BF16 inputs), on a line where adjacent values differ by one.
int64_t OrderedBitsIn(DType d, double v) {
  uint64_t bits, sign;
  switch (d) {
    case DType::kF16: {
      const _Float16 h = static_cast<_Float16>(v);
      uint16_t b;
      std::memcpy(&b, &h, 2);
      bits = b, sign = 0x8000;
      break;
    }
    case DType::kBF16:
      bits = quant::EncodeBF16(static_cast<float>(v)), sign = 0x8000;
      break;
    case DType::kF32:
      bits = std::bit_cast<uint32_t>(static_cast<float>(v)), sign = 0x80000000u;
      break;
    default:
      bits = std::bit_cast<uint64_t>(v), sign = uint64_t{1} << 63;
      break;
  }
  return (bits & sign) ? -static_cast<int64_t>(bits & ~sign) : static_cast<int64_t>(bits);
}

nlohmann::json Shape(const TensorInfo& t) {
  nlohmann::json s = nlohmann::json::array();
  for (uint64_t d : t.shape) s.push_back(d);
  return s;
}

// Compares two tensors of equal shape; nullopt when the dtypes cannot be compared.
std::optional<std::pair<TensorDiff, DType>> Compare(const TensorInfo& ta,
                                                    std::span<const uint8_t> a,
                                                    const TensorInfo& tb,
                                                    std::span<const uint8_t> b) {
  TensorDiff d;
  d.name = ta.name;
  d.elements = ta.num_elements();
  const int ra = FloatRank(ta.dtype), rb = FloatRank(tb.dtype);
  if (ra > 0 && rb > 0) {
    // The coarser dtype; BF16 against F16 has no coarser one: compare in F32 (both exact).
    DType in = ra < rb ? ta.dtype : tb.dtype;
    if (ra == rb && ta.dtype != tb.dtype) in = DType::kF32;
    const size_t wa = DTypeBits(ta.dtype) / 8, wb = DTypeBits(tb.dtype) / 8;
    for (uint64_t i = 0; i < d.elements; ++i) {
      const double x = Value(ta.dtype, a.data() + i * wa), y = Value(tb.dtype, b.data() + i * wb);
      const int64_t bx = OrderedBitsIn(in, x), by = OrderedBitsIn(in, y);
      const uint64_t ulps = bx > by ? static_cast<uint64_t>(bx) - static_cast<uint64_t>(by)
                                    : static_cast<uint64_t>(by) - static_cast<uint64_t>(bx);
      d.differing += ulps != 0;
      d.ulp_histogram[UlpBucket(ulps)]++;
      if (ulps != 0) d.max_abs_diff = std::max(d.max_abs_diff, std::abs(x - y));
    }
    return std::pair{d, in};
  }
  if (ta.dtype != tb.dtype || DTypeBits(ta.dtype) % 8 != 0) return std::nullopt;
  const size_t w = DTypeBits(ta.dtype) / 8;
  for (uint64_t i = 0; i < d.elements; ++i) {
    const bool same = std::memcmp(a.data() + i * w, b.data() + i * w, w) == 0;
    d.differing += !same;
    d.ulp_histogram[same ? 0 : kUlpBuckets - 1]++;
  }
  return std::pair{d, ta.dtype};
}

}  // namespace

namespace {

// The header of one tensor file, its data left for StreamTrees (core/io/tree_stream.h).
absl::StatusOr<std::shared_ptr<const TreeImage>> ReadHeader(const std::string& path,
                                                            const ReadOptions& read) {
  if (!absl::EndsWith(path, ".safetensors")) {
    return absl::InvalidArgumentError(
        absl::StrCat(EncodeName(path), ": diff compares .safetensors files"));
  }
  absl::StatusOr<TreeListing> listing = ListFile(path);
  if (!listing.ok()) return listing.status();
  auto image = ReadTree(*std::move(listing), read, NoProgress());
  if (!image.ok()) return image.status();
  const ImageFile& f = (*image)->files.front();
  if (f.safetensors == nullptr) return f.header_status;
  return image;
}

}  // namespace

absl::StatusOr<FileDiffResult> DiffTensorFiles(const std::string& path_a,
                                               const std::string& path_b,
                                               uint64_t memory_window) {
  // Both files are read once, in the window: each pair of tensors is compared as soon as both
  // are in memory, and freed.
  ReadOptions read;
  read.keep = ReadOptions::Keep::kStreamTensorData;
  read.file_digests = false;
  read.tensor_digests = false;
  read.memory_window = memory_window;
  auto image_a = ReadHeader(path_a, read);
  if (!image_a.ok()) return image_a.status();
  read.memory_window -= std::min(read.memory_window, (*image_a)->kept_bytes);
  auto image_b = ReadHeader(path_b, read);
  if (!image_b.ok()) return image_b.status();
  read.memory_window = memory_window;
  const SafetensorsFile& fa = *(*image_a)->files.front().safetensors;
  const SafetensorsFile& fb = *(*image_b)->files.front().safetensors;
  std::set<std::string> name_set;
  for (const TensorInfo& t : fa.tensors()) name_set.insert(t.name);
  for (const TensorInfo& t : fb.tensors()) name_set.insert(t.name);
  const std::vector<std::string> names(name_set.begin(), name_set.end());

  std::vector<nlohmann::json> entries(names.size());
  std::vector<char> equal_bits(names.size(), 0);  // a compared pair, bitwise equal
  std::vector<StreamWork> work;
  for (size_t i = 0; i < names.size(); ++i) {
    const TensorInfo* ta = fa.Find(names[i]);
    const TensorInfo* tb = fb.Find(names[i]);
    if (ta == nullptr || tb == nullptr) {
      entries[i] = {{"status", ta == nullptr ? "only_in_b" : "only_in_a"}};
    } else if (ta->shape != tb->shape) {
      entries[i] = {{"status", "shape_differs"}, {"shape_a", Shape(*ta)}, {"shape_b", Shape(*tb)}};
    } else {
      work.push_back({names[i], {{&fa, ta}, {&fb, tb}}, [&, i, ta, tb]() -> absl::Status {
        if (auto d = Compare(*ta, fa.Bytes(*ta), *tb, fb.Bytes(*tb)); !d) {
          entries[i] = {{"status", "dtype_not_comparable"},
                        {"dtype_a", DTypeName(ta->dtype)},
                        {"dtype_b", DTypeName(tb->dtype)}};
        } else {
          entries[i] = ToJson(d->first);
          entries[i]["status"] = "compared";
          entries[i]["dtype_a"] = DTypeName(ta->dtype);
          entries[i]["dtype_b"] = DTypeName(tb->dtype);
          entries[i]["compared_in"] = DTypeName(d->second);
          entries[i]["shape"] = Shape(*ta);
          equal_bits[i] = d->first.bitwise_equal();
        }
        return absl::OkStatus();
      }});
    }
  }
  auto streamed = StreamTrees({*image_a, *image_b}, std::move(work), read, NoProgress());
  if (!streamed.ok()) return streamed.status();
  for (const auto& image : streamed->images) {
    if (absl::Status s = image->CheckUnchanged(); !s.ok()) return s;
  }

  nlohmann::json tensors = nlohmann::json::object();
  uint64_t compared = 0, equal = 0, unmatched = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    nlohmann::json& entry = entries[i];
    if (entry["status"] == "compared") {
      ++compared;
      equal += equal_bits[i];
    } else {
      ++unmatched;
    }
    tensors[names[i]] = std::move(entry);
  }
  FileDiffResult r;
  r.identical = unmatched == 0 && equal == compared;
  r.report = {{"schema", "ckpt-audit.tensor-diff/1"},
              {"a", path_a},
              {"b", path_b},
              {"tensors", tensors},
              {"tensors_compared", compared},
              {"tensors_equal", equal},
              {"tensors_unmatched", unmatched},
              {"verdict", r.identical ? "identical" : "different"}};
  return r;
}

}  // namespace ckpt::forward
