#include "tests/quant/modelopt_fixture.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint.h"
#include "core/quant/codecs.h"
#include "core/quant/quant_weight.h"
#include "core/quant/safetensors_writer.h"

namespace ckpt::quant::testing {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::vector<uint8_t> F32(float f) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &f, 4);
  return b;
}

json ReadJson(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

void WriteJson(const fs::path& p, const json& j) {
  std::ofstream out(p, std::ios::trunc);
  out << j.dump(2) << "\n";
}

std::vector<std::string> ExcludeList() {
  return {"*self_attn*",        "*shared_experts*",   "*routed_expert_*",
          "*block_sparse_moe.gate*", "*layernorm*",   "language_model.model.layers.0.mlp.*",
          "language_model.lm_head"};
}


// Writes `dst` from `src`: every tensor through `convert` (which appends what replaces it;
// returning false keeps the tensor as is), the index renamed, and ModelOpt's config files.
absl::Status WriteTree(
    const Checkpoint& src, const fs::path& src_root, const fs::path& dst,
    const ModelOptFixtureOptions& o,
    const std::function<absl::StatusOr<bool>(const SafetensorsFile&, const TensorInfo&,
                                             std::vector<TensorToWrite>*)>& convert) {
  fs::create_directories(dst);
  json index = ReadJson(src_root / "model.safetensors.index.json");
  json weight_map = json::object();
  uint64_t total = 0;
  for (const auto& shard : src.shards()) {
    const std::string file = fs::path(shard->path()).filename().string();
    std::vector<TensorToWrite> out;
    for (const TensorInfo& t : shard->tensors()) {
      std::vector<TensorToWrite> got;
      absl::StatusOr<bool> converted = convert(*shard, t, &got);
      if (!converted.ok()) return converted.status();
      if (!*converted) got.push_back(TensorToWrite::Borrowed(t, shard->Bytes(t)));
      if (!o.stray_global_on.empty() && t.name == o.stray_global_on + ".weight") {
        got.push_back(TensorToWrite::Owned(o.stray_global_on + kModelOptGlobalSuffix,
                                           DType::kF32, {}, F32(1.0f)));
      }
      for (TensorToWrite& w : got) {
        if (o.drop.count(w.name)) continue;
        weight_map[w.name] = file;
        total += w.data().size();
        out.push_back(std::move(w));
      }
    }
    if (absl::Status s = WriteSafetensors((dst / file).string(), std::move(out), shard->metadata());
        !s.ok()) {
      return s;
    }
  }
  index["weight_map"] = weight_map;
  index["metadata"]["total_size"] = total;  // recomputed, as the Kimi-K3 cast does
  WriteJson(dst / "model.safetensors.index.json", index);

  // The shapes ModelOpt's exporter writes (docs/formats.md §9).
  const std::vector<std::string> exclude = ExcludeList();
  const json producer = {{"name", "modelopt"}, {"version", "0.39.0"}};
  json config = src.config();
  config.erase("quantization_config");
  if (config.contains("text_config")) config["text_config"].erase("quantization_config");
  const bool w4a4 = o.quant_algo == "NVFP4";
  if (o.write_config_json) {
    json scheme = {{"dynamic", false}, {"num_bits", 4}, {"type", "float"}, {"group_size", 16}};
    json group = {{"weights", scheme}, {"targets", json::array({"Linear"})}};
    if (w4a4) group["input_activations"] = scheme;
    config["quantization_config"] = {{"config_groups", {{"group_0", group}}},
                                     {"ignore", exclude},
                                     {"quant_algo", o.quant_algo},
                                     {"producer", producer},
                                     {"quant_method", "modelopt"}};
  }
  WriteJson(dst / "config.json", config);
  if (o.write_hf_quant_config) {
    WriteJson(dst / "hf_quant_config.json",
              {{"producer", producer},
               {"quantization", {{"quant_algo", o.quant_algo},
                                 {"kv_cache_quant_algo", nullptr},
                                 {"group_size", 16},
                                 {"exclude_modules", exclude}}}});
  }
  return absl::OkStatus();
}

std::string ModuleOf(const std::string& name, const char* suffix) {
  return absl::EndsWith(name, suffix) ? name.substr(0, name.size() - strlen(suffix)) : "";
}

// The E2M1 code nearest to x (ties to the even code), sign kept.
uint8_t NearestE2M1(double x) {
  const double a = std::fabs(x);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - kE2M1Magnitude[c]), e = std::fabs(a - kE2M1Magnitude[best]);
    if (d < e || (d == e && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(best | (x < 0 ? 8 : 0));
}

}  // namespace

std::vector<std::string> MiniKimiExcludeModules() { return ExcludeList(); }

absl::Status WriteModelOptFixture(const fs::path& src, const fs::path& dst,
                                  const ModelOptFixtureOptions& o) {
  auto ckpt = Checkpoint::Open(src.string());
  if (!ckpt.ok()) return ckpt.status();
  if ((*ckpt)->config().value("quantization_config", json()).value("format", "") !=
      "nvfp4-pack-quantized") {
    return absl::InvalidArgumentError(src.string() + ": not compressed-tensors NVFP4");
  }
  const std::vector<uint64_t> scalar =
      o.scalars_as_1 ? std::vector<uint64_t>{1} : std::vector<uint64_t>{};
  return WriteTree(**ckpt, src, dst, o, [&](const SafetensorsFile& f, const TensorInfo& t,
                                             std::vector<TensorToWrite>* out)
                                             -> absl::StatusOr<bool> {
    if (std::string m = ModuleOf(t.name, kPackedSuffix); !m.empty()) {
      out->push_back(TensorToWrite::Borrowed(t, f.Bytes(t)));
      out->back().name = m + kModelOptWeightSuffix;
      return true;
    }
    const std::string m = ModuleOf(t.name, kGlobalScaleSuffix);
    if (m.empty()) return false;
    float g;
    std::memcpy(&g, f.Bytes(t).data(), 4);
    int e;
    if (!(g > 0) || std::frexp(g, &e) != 0.5f) {
      return absl::InvalidArgumentError(absl::StrCat(t.name, ": global ", g,
                                                     " is not a power of two"));
    }
    out->push_back(TensorToWrite::Owned(
        m + kModelOptGlobalSuffix, DType::kF32,
        m == o.odd_global_module ? o.odd_global_shape : scalar, F32(1.0f / g)));
    if (o.quant_algo == "NVFP4") {
      out->push_back(
          TensorToWrite::Owned(m + kModelOptInputScaleSuffix, DType::kF32, scalar, F32(1.0f)));
    }
    return true;
  });
}

absl::Status WriteModelOptCastOfMxfp4(const fs::path& src, const fs::path& dst) {
  auto ckpt = Checkpoint::Open(src.string());
  if (!ckpt.ok()) return ckpt.status();
  ModelOptFixtureOptions o;
  return WriteTree(**ckpt, src, dst, o, [&](const SafetensorsFile& f, const TensorInfo& t,
                                             std::vector<TensorToWrite>* out)
                                             -> absl::StatusOr<bool> {
    if (!ModuleOf(t.name, kScaleSuffix).empty()) return true;  // written with the packed
    const std::string m = ModuleOf(t.name, kPackedSuffix);
    if (m.empty()) return false;
    auto w = ResolveWeight(**ckpt, m);
    if (!w.ok()) return w.status();
    auto v = Mxfp4ViewOf(*w);
    if (!v.ok()) return v.status();
    // k_max over every group whose byte is > 0 (all-zero groups included), m = k_max - 8.
    int kmax = -127;
    for (uint8_t b : v->scales()) {
      if (b > 0) kmax = std::max(kmax, E8M0Exponent(b));
    }
    const int mexp = kmax - 8;
    std::vector<uint8_t> packed(v->codes().bytes().size()), scales(w->rows * w->cols / 16);
    for (uint64_t r = 0; r < w->rows; ++r) {
      for (uint64_t blk = 0; blk < w->cols / 16; ++blk) {
        const uint8_t sb = v->ScaleByte(r, blk / 2);
        const int k = E8M0Exponent(sb);
        int byte = sb == 0 ? -1 : EncodeE4M3PowerOfTwo(k - mexp);
        if (byte < 0) {
          // Out of range: data-derived amax, clamped to [2^-9, 448] (E4M3), then requantized.
          double amax = 0;
          for (uint64_t c = blk * 16; c < blk * 16 + 16; ++c) {
            amax = std::max(amax, std::fabs(v->Value(r, c)));
          }
          const double s = std::clamp(amax / (6.0 * std::ldexp(1.0, mexp)), std::ldexp(1.0, -9),
                                      448.0);
          const int e = std::clamp(static_cast<int>(std::floor(std::log2(s))), -9, 8);
          byte = EncodeE4M3PowerOfTwo(e);
        }
        scales[r * (w->cols / 16) + blk] = static_cast<uint8_t>(byte);
        const double unit = DecodeE4M3(static_cast<uint8_t>(byte)) * std::ldexp(1.0, mexp);
        for (uint64_t c = blk * 16; c < blk * 16 + 16; c += 2) {
          const bool same = byte == EncodeE4M3PowerOfTwo(k - mexp) && sb != 0;
          const uint8_t lo = same ? v->codes().Code(r, c) : NearestE2M1(v->Value(r, c) / unit);
          const uint8_t hi =
              same ? v->codes().Code(r, c + 1) : NearestE2M1(v->Value(r, c + 1) / unit);
          packed[r * (w->cols / 2) + c / 2] = static_cast<uint8_t>(lo | (hi << 4));
        }
      }
    }
    out->push_back(TensorToWrite::Owned(m + kModelOptWeightSuffix, DType::kU8,
                                        {w->rows, w->cols / 2}, std::move(packed)));
    out->push_back(TensorToWrite::Owned(m + kScaleSuffix, DType::kF8_E4M3,
                                        {w->rows, w->cols / 16}, std::move(scales)));
    out->push_back(TensorToWrite::Owned(m + kModelOptGlobalSuffix, DType::kF32, {},
                                        F32(static_cast<float>(std::ldexp(1.0, mexp)))));
    out->push_back(TensorToWrite::Owned(m + kModelOptInputScaleSuffix, DType::kF32, {}, F32(1.0f)));
    return true;
  });
}

void EditJson(const fs::path& file, const std::function<void(json&)>& edit) {
  json j = ReadJson(file);
  edit(j);
  WriteJson(file, j);
}

}  // namespace ckpt::quant::testing
