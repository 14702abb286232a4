#include "core/quant/x4t_sidecar.h"

#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/quant/quant_weight.h"
#include "core/quant/x4t_codec.h"

namespace ckpt::quant {
namespace {

const TensorInfo* Need(const SafetensorsFile& f, const std::string& name, DType dtype,
                       size_t rank, std::string* error) {
  const TensorInfo* t = f.Find(name);
  if (t == nullptr) {
    *error = name + ": missing";
  } else if (t->dtype != dtype || t->shape.size() != rank) {
    *error = absl::StrCat(name, ": must be ", DTypeName(dtype), " of rank ", rank);
    t = nullptr;
  }
  return t;
}

int64_t ReadI64(std::span<const uint8_t> b, uint64_t i) {
  int64_t v;
  std::memcpy(&v, b.data() + 8 * i, 8);
  return v;
}

}  // namespace

absl::StatusOr<X4TExpertMatrix> ReadX4TSidecarMatrix(const SafetensorsFile& f,
                                                     const std::string& matrix, uint64_t slot) {
  std::string err;
  const TensorInfo* packed = Need(f, matrix + ".packed", DType::kU8, matrix == "w2" ? 4 : 3, &err);
  const TensorInfo* fixed = packed ? Need(f, matrix + ".scale_fixed", DType::kU8, 2, &err) : nullptr;
  const TensorInfo* exc = fixed ? Need(f, matrix + ".scale_exceptions", DType::kU8, 1, &err) : nullptr;
  const TensorInfo* off =
      exc ? Need(f, matrix + ".scale_exception_offsets", DType::kI64, 1, &err) : nullptr;
  if (off == nullptr) return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", err));
  const std::vector<uint64_t>& ps = packed->shape;
  const uint64_t experts = ps[0];
  const bool w2 = matrix == "w2";
  if (w2 && ps[3] != 16) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": w2.packed must be [E, in/32, out, 16]"));
  }
  const uint64_t rows = w2 ? ps[2] : ps[1], cols = w2 ? ps[1] * 32 : ps[2] * 2;
  if (slot >= experts || fixed->shape[0] != experts || off->shape[0] != experts + 1 ||
      rows > UINT32_MAX || cols % 32 != 0 || fixed->shape[1] != X4TFixedStreamBytes(rows, cols / 32)) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", matrix, " slot ", slot,
                                                   ": tensors disagree on experts or geometry"));
  }
  std::span<const uint8_t> offsets = f.Bytes(*off);
  // Every slot's [begin, end) must lie inside the exception stream, not only the last one's.
  const int64_t begin = ReadI64(offsets, slot), end = ReadI64(offsets, slot + 1);
  const int64_t total = ReadI64(offsets, experts);
  if (ReadI64(offsets, 0) != 0 || begin < 0 || end < begin || end > total ||
      exc->num_bytes() % 4 != 0 || static_cast<uint64_t>(total) != exc->num_bytes() / 4) {
    return absl::DataLossError(absl::StrCat(f.path(), ": ", matrix, " slot ", slot, ": ", matrix,
                                            ".scale_exception_offsets are not prefix sums of the "
                                            "exception stream"));
  }
  const uint64_t per = rows * cols / 2;
  std::span<const uint8_t> p = f.Bytes(*packed).subspan(slot * per, per);
  X4TExpertMatrix m;
  m.rows = static_cast<uint32_t>(rows);
  m.cols = static_cast<uint32_t>(cols);
  m.weight_packed = w2 ? UnpermuteGroupMajor(p, rows, cols / 32) : std::vector<uint8_t>(p.begin(), p.end());
  absl::StatusOr<std::vector<uint8_t>> plane = DecodeX4TScalePlane(
      f.Bytes(*fixed).subspan(slot * fixed->shape[1], fixed->shape[1]),
      f.Bytes(*exc).subspan(4 * begin, 4 * (end - begin)), m.rows, m.cols / 32);
  if (!plane.ok()) {
    return absl::Status(plane.status().code(), absl::StrCat(f.path(), ": ", matrix, " slot ",
                                                            slot, ": ", plane.status().message()));
  }
  m.weight_scale = *std::move(plane);
  return m;
}

void CheckX4TSidecar(const SafetensorsFile& f, const nlohmann::json& tc, FindingList* out) {
  const std::map<std::string, std::string>& md = f.metadata();
  auto meta = [&](const char* key) {
    auto it = md.find(key);
    return it == md.end() ? std::string() : it->second;
  };
  auto bad = [&](const std::string& code, const std::string& msg) {
    out->Add({code, f.path(), -1, -1, msg, {}});
  };
  const std::pair<const char*, std::string> expected[] = {
      {"schema", kX4TSidecarSchema},
      {"version", "2"},
      {"matrix_order", "w1,w3,w2"},
      {"w2_packed_layout", kW2GroupMajorLayout},
      {"exact_mxfp4_reconstruction", "true"}};
  for (const auto& [key, want] : expected) {
    if (meta(key) != want) bad("sidecar-metadata", absl::StrCat(key, " '", meta(key), "', expected '", want, "'"));
  }
  const std::string codec = meta("scale_codec");
  if (codec != kX4TScaleCodec && codec != "x4t-adjacent-pair-fixed-stream-v1") {
    bad("sidecar-metadata", "scale_codec '" + codec + "'");
  }
  uint64_t layer = 0, experts = 0, capacity = 0;
  const uint64_t layers = tc.value("num_hidden_layers", uint64_t{0});
  if (!absl::SimpleAtoi(meta("layer"), &layer) || layer < tc.value("first_k_dense_replace", uint64_t{0}) ||
      (layers && layer >= layers)) {
    bad("sidecar-geometry", "layer '" + meta("layer") + "' is not an MoE layer of the config");
  }
  const uint64_t routed = tc.value("n_routed_experts", uint64_t{0});
  if (!absl::SimpleAtoi(meta("experts"), &experts) || (routed && experts != routed)) {
    bad("sidecar-geometry", absl::StrCat("experts '", meta("experts"), "', config n_routed_experts ", routed));
  }
  if (!absl::SimpleAtoi(meta("expert_capacity"), &capacity) || capacity < experts) {
    bad("sidecar-geometry", "expert_capacity '" + meta("expert_capacity") + "' below experts");
  }
  const TensorInfo* ids = f.Find("expert_ids");
  if (ids == nullptr || ids->dtype != DType::kI32 || ids->shape != std::vector<uint64_t>{experts}) {
    bad("sidecar-tensor", "expert_ids must be I32 [experts]");
  }
  const uint64_t inter = tc.value("moe_intermediate_size", uint64_t{0});
  const uint64_t in = tc.value("moe_latent_size", tc.value("hidden_size", uint64_t{0}));
  for (const char* m : {"w1", "w3", "w2"}) {
    const TensorInfo* packed = f.Find(std::string(m) + ".packed");
    if (packed == nullptr || packed->shape.empty() || packed->shape[0] != experts) {
      bad("sidecar-tensor", std::string(m) + ".packed missing or not [experts, ...]");
      continue;
    }
    for (uint64_t e = 0; e < experts; ++e) {
      absl::StatusOr<X4TExpertMatrix> x = ReadX4TSidecarMatrix(f, m, e);
      if (!x.ok()) {
        bad("sidecar-tensor", std::string(x.status().message()));
        break;
      }
      const bool w2 = std::string(m) == "w2";
      if (inter && in && (x->rows != (w2 ? in : inter) || x->cols != (w2 ? inter : in))) {
        bad("sidecar-geometry", absl::StrCat(m, ": [", x->rows, ", ", x->cols, "] disagrees with config"));
        break;
      }
    }
  }
}

}  // namespace ckpt::quant
