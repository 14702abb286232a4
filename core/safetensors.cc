#include "core/safetensors.h"

#include <algorithm>
#include <array>

#include "absl/strings/str_cat.h"
#include "core/io/file_system.h"
#include "core/text/json_parse.h"
#include "core/text/name_encoding.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using nlohmann::json;

constexpr std::array<std::pair<std::string_view, DType>, 22> kDTypes = {{
    {"BOOL", DType::kBool}, {"U8", DType::kU8}, {"I8", DType::kI8},
    {"F8_E5M2", DType::kF8_E5M2}, {"F8_E4M3", DType::kF8_E4M3}, {"F8_E8M0", DType::kF8_E8M0},
    {"F8_E4M3FNUZ", DType::kF8_E4M3FNUZ}, {"F8_E5M2FNUZ", DType::kF8_E5M2FNUZ},
    {"I16", DType::kI16}, {"U16", DType::kU16}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
    {"I32", DType::kI32}, {"U32", DType::kU32}, {"F32", DType::kF32}, {"I64", DType::kI64},
    {"U64", DType::kU64}, {"F64", DType::kF64}, {"C64", DType::kC64}, {"F4", DType::kF4},
    {"F6_E2M3", DType::kF6_E2M3}, {"F6_E3M2", DType::kF6_E3M2},
}};

absl::Status Invalid(const std::string& label, const std::string& msg) {
  return absl::InvalidArgumentError(absl::StrCat(label, ": ", msg));
}

// Reads a JSON array of non-negative integers that fit in u64 (serde's usize on 64-bit).
bool ReadU64Array(const json& j, std::vector<uint64_t>* out) {
  if (!j.is_array()) return false;
  out->clear();
  for (const json& v : j) {
    if (!v.is_number_unsigned()) return false;
    out->push_back(v.get<uint64_t>());
  }
  return true;
}

bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}

absl::StatusOr<TensorInfo> ParseEntry(std::string name, const json& j, const std::string& label) {
  auto bad = [&](const std::string& what) {
    return Invalid(label, absl::StrCat("tensor '", name, "': ", what));
  };
  if (!j.is_object()) return bad("entry is not a JSON object");
  TensorInfo t;
  auto dt = j.find("dtype");
  if (dt == j.end() || !dt->is_string()) return bad("missing or non-string dtype");
  std::optional<DType> dtype = ParseDType(dt->get_ref<const std::string&>());
  if (!dtype) return bad(absl::StrCat("unknown dtype '", dt->get<std::string>(), "'"));
  t.dtype = *dtype;
  auto sh = j.find("shape");
  if (sh == j.end() || !ReadU64Array(*sh, &t.shape)) {
    return bad("shape must be an array of non-negative integers");
  }
  std::vector<uint64_t> offs;
  auto of = j.find("data_offsets");
  if (of == j.end() || !ReadU64Array(*of, &offs) || offs.size() != 2) {
    return bad("data_offsets must be two non-negative integers");
  }
  t.begin = offs[0];
  t.end = offs[1];
  t.name = std::move(name);
  return t;
}

// Element count times dtype bits must be a whole number of bytes equal to end - begin.
absl::Status CheckSize(const TensorInfo& t, const std::string& label) {
  uint64_t n = 1;
  for (uint64_t d : t.shape) {
    if (!CheckedMul(n, d, &n)) {
      return Invalid(label, absl::StrCat("tensor '", t.name, "': element count overflows u64"));
    }
  }
  uint64_t bits;
  if (!CheckedMul(n, static_cast<uint64_t>(DTypeBits(t.dtype)), &bits)) {
    return Invalid(label, absl::StrCat("tensor '", t.name, "': bit size overflows u64"));
  }
  if (bits % 8 != 0) {
    return Invalid(label, absl::StrCat("tensor '", t.name, "': ", n, " elements of ",
                                       DTypeName(t.dtype), " are not a whole number of bytes"));
  }
  if (t.end < t.begin || t.end - t.begin != bits / 8) {
    return Invalid(label, absl::StrCat("tensor '", t.name, "': data_offsets [", t.begin, ", ",
                                       t.end, ") hold ", t.end - t.begin, " bytes but ",
                                       DTypeName(t.dtype), " shape implies ", bits / 8));
  }
  return absl::OkStatus();
}

// Tensor names are recorded in the name encoding (docs/evidence.md, "Name encoding"), where
// "a\u0000b" records as "a%00b": a header holding both names would be ambiguous in a record.
// The JSON lexer has already checked UTF-8, so only a NUL makes a name need escaping.
absl::Status CheckRecordedNames(const std::vector<TensorInfo>& tensors, const std::string& label) {
  const bool any_nul = std::any_of(tensors.begin(), tensors.end(), [](const TensorInfo& t) {
    return t.name.find('\0') != std::string::npos;
  });
  if (!any_nul) return absl::OkStatus();
  std::vector<std::string> names;
  names.reserve(tensors.size());
  for (const TensorInfo& t : tensors) names.push_back(t.name);
  absl::Status s = CheckNoEncodingCollisions(names);
  return s.ok() ? s : Invalid(label, absl::StrCat("tensor names: ", s.message()));
}

}  // namespace

std::optional<DType> ParseDType(std::string_view s) {
  for (const auto& [name, d] : kDTypes) {
    if (name == s) return d;
  }
  return std::nullopt;
}

std::string DTypeName(DType d) {
  for (const auto& [name, v] : kDTypes) {
    if (v == d) return std::string(name);
  }
  return "?";
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&out, i ? ", " : "", shape[i]);
  return out + "]";
}

int DTypeBits(DType d) {
  switch (d) {
    case DType::kF4: return 4;
    case DType::kF6_E2M3: case DType::kF6_E3M2: return 6;
    case DType::kI16: case DType::kU16: case DType::kF16: case DType::kBF16: return 16;
    case DType::kI32: case DType::kU32: case DType::kF32: return 32;
    case DType::kI64: case DType::kU64: case DType::kF64: case DType::kC64: return 64;
    default: return 8;
  }
}

uint64_t TensorInfo::num_elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;  // validated against overflow when parsed
  return n;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(std::span<const uint8_t> bytes,
                                                         uint64_t file_size,
                                                         const std::string& label,
                                                         const SafetensorsLimits& limits) {
  if (file_size < 8 || bytes.size() < 8) {
    return Invalid(label, absl::StrCat("header too small: file has ", file_size,
                                       " bytes, the 8-byte length prefix does not fit"));
  }
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  if (n > limits.max_header_bytes) {
    return Invalid(label, absl::StrCat("header too large: length prefix at offset 0 says ", n,
                                       " bytes, the limit is ", limits.max_header_bytes));
  }
  if (n > file_size - 8) {
    return Invalid(label, absl::StrCat("header too large: length prefix says ", n,
                                       " bytes but only ", file_size - 8, " follow it"));
  }
  if (bytes.size() < 8 + n) {
    return absl::InternalError(absl::StrCat(label, ": caller passed a truncated header"));
  }
  std::string_view text(reinterpret_cast<const char*>(bytes.data()) + 8, n);
  JsonLimits json_limits;
  json_limits.max_depth = limits.max_json_depth;
  json_limits.max_top_level_entries = limits.max_entries + 1;  // the tensors and __metadata__
  SafetensorsHeader header;
  header.header_len = n;
  // Entries are checked as they are read: the header never exists as one JSON document.
  absl::Status parsed = ParseBoundedJsonObject(
      text, absl::StrCat(label, ": header"), json_limits,
      [&](std::string key, json value) -> absl::Status {
        if (std::string_view(key) != "__metadata__") {
          absl::StatusOr<TensorInfo> t = ParseEntry(std::move(key), value, label);
          if (!t.ok()) return t.status();
          header.tensors.push_back(*std::move(t));
          return absl::OkStatus();
        }
        if (!value.is_object()) return Invalid(label, "__metadata__ is not a JSON object");
        for (auto& [mk, mv] : value.get_ref<json::object_t&>()) {
          if (!mv.is_string()) {
            return Invalid(label, absl::StrCat("__metadata__ value for '", mk,
                                               "' is not a string"));
          }
          header.metadata.emplace(mk, std::move(mv.get_ref<std::string&>()));
        }
        return absl::OkStatus();
      });
  if (!parsed.ok()) return parsed;
  if (absl::Status s = CheckRecordedNames(header.tensors, label); !s.ok()) return s;
  std::sort(header.tensors.begin(), header.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
            });
  uint64_t expected_start = 0;
  for (const TensorInfo& t : header.tensors) {
    if (t.begin != expected_start) {
      return Invalid(label, absl::StrCat("tensor '", t.name, "': invalid offset: data_offsets [",
                                         t.begin, ", ", t.end, ") should start at ",
                                         expected_start, " (entries must tile the buffer)"));
    }
    if (absl::Status s = CheckSize(t, label); !s.ok()) return s;
    expected_start = t.end;
  }
  const uint64_t buffer_len = file_size - 8 - n;
  if (expected_start != buffer_len) {
    return absl::DataLossError(absl::StrCat(
        label, ": incomplete metadata, file not fully covered: tensors cover ", expected_start,
        " bytes of data but the file holds ", buffer_len, " after the header (offset ", 8 + n,
        ")"));
  }
  return header;
}

namespace {

// A standalone file: its whole content, or only the 8-byte length and the header.
absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenStandalone(const std::string& path,
                                                                const SafetensorsLimits& limits,
                                                                bool whole) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
  absl::StatusOr<std::unique_ptr<io::Directory>> d = io::RealFileSystem().OpenRoot(dir);
  if (!d.ok()) return d.status();
  absl::StatusOr<std::unique_ptr<io::RandomAccessFile>> file = (*d)->OpenFile(name);
  if (!file.ok()) return file.status();
  absl::StatusOr<io::FileIdentity> id = (*file)->Identity();
  if (!id.ok()) return id.status();
  uint64_t keep = id->size;
  if (!whole && id->size >= 8) {
    uint8_t len[8];
    if (absl::Status s = io::ReadExactly(**file, 0, len, path); !s.ok()) return s;
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len[i];
    // A length past the limit or the file is refused by the parser, from the prefix alone.
    keep = n <= limits.max_header_bytes && n <= id->size - 8 ? 8 + n : 8;
  }
  auto content = std::make_shared<std::vector<uint8_t>>(std::min(keep, id->size));
  if (absl::Status s = io::ReadExactly(**file, 0, *content, path); !s.ok()) return s;
  absl::StatusOr<SafetensorsHeader> header =
      ParseSafetensorsHeader(*content, id->size, path, limits);
  if (!header.ok()) return header.status();
  return std::make_unique<SafetensorsFile>(path, *std::move(header), std::move(content),
                                           id->size);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(
    const std::string& path, const SafetensorsLimits& limits) {
  return OpenStandalone(path, limits, /*whole=*/true);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::OpenHeader(
    const std::string& path, const SafetensorsLimits& limits) {
  return OpenStandalone(path, limits, /*whole=*/false);
}

SafetensorsFile::SafetensorsFile(std::string path, SafetensorsHeader header,
                                 std::shared_ptr<const std::vector<uint8_t>> content,
                                 uint64_t file_size)
    : path_(std::move(path)),
      header_(std::move(header)),
      content_(std::move(content)),
      file_size_(file_size),
      lent_(new std::atomic<const uint8_t*>[header_.tensors.size()]) {
  for (size_t i = 0; i < header_.tensors.size(); ++i) {
    by_name_.emplace(header_.tensors[i].name, &header_.tensors[i]);
    lent_[i].store(nullptr, std::memory_order_relaxed);
  }
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : it->second;
}

std::span<const uint8_t> SafetensorsFile::Bytes(const TensorInfo& t) const {
  const uint64_t begin = data_start() + t.begin;
  if (content_ != nullptr && content_->size() >= begin + t.num_bytes()) {
    return std::span<const uint8_t>(*content_).subspan(begin, t.num_bytes());
  }
  const uint8_t* lent = lent_[&t - header_.tensors.data()].load(std::memory_order_acquire);
  if (lent == nullptr) return {};
  return std::span<const uint8_t>(lent, t.num_bytes());
}

void SafetensorsFile::Lend(const TensorInfo& t, const uint8_t* bytes) const {
  lent_[&t - header_.tensors.data()].store(bytes, std::memory_order_release);
}

void SafetensorsFile::Reclaim(const TensorInfo& t) const {
  lent_[&t - header_.tensors.data()].store(nullptr, std::memory_order_release);
}

}  // namespace ckpt
