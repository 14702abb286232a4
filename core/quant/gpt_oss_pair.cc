#include "core/quant/gpt_oss_pair.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/quant/codecs.h"
#include "core/quant/gpt_oss_layout.h"
#include "core/quant/pair_verify.h"
#include "core/text/json_dump.h"

namespace ckpt::quant {
namespace {

using gptoss::Dims;
using gptoss::Fused;

constexpr const char* kDerivedSuffixes[] = {"", "_weight_scale", "_weight_scale_2", "_input_scale"};

bool Active16(const uint8_t* p) {  // 8 packed bytes, any nonzero magnitude
  uint64_t w;
  std::memcpy(&w, p, 8);
  return (w & 0x7777777777777777ull) != 0;
}

// An F32 scalar stored 0-d (as ModelOpt writes it) or [1]; nullopt otherwise.
std::optional<float> Scalar(const TensorRef& t) {
  if (t.info->dtype != DType::kF32 || t.info->shape.size() > 1 || t.info->num_elements() != 1 ||
      t.bytes().size() != 4) {
    return std::nullopt;
  }
  float f;
  std::memcpy(&f, t.bytes().data(), 4);
  return f;
}

void Add(PairUnitOutcome* o, std::string code, std::string tensor, int64_t row, int64_t group,
         std::string message, std::map<std::string, int64_t> numbers = {}) {
  o->found.Add(
      {std::move(code), std::move(tensor), row, group, std::move(message), std::move(numbers)});
}

}  // namespace

std::vector<std::string> GptOssSourceTensors(const std::string& base) {
  return {base + "_blocks", base + "_scales"};
}

std::vector<std::string> GptOssDerivedTensors(const Checkpoint& derived, const std::string& base) {
  std::vector<std::string> out;
  for (const char* s : kDerivedSuffixes) {
    if (derived.Find(base + s)) out.push_back(base + s);
  }
  return out;
}

std::vector<std::string> GptOssExpertBases(const Checkpoint& source) {
  std::vector<std::string> out;
  for (const std::string& n : source.TensorNames()) {
    if (absl::EndsWith(n, "_blocks")) out.push_back(n.substr(0, n.size() - 7));
  }
  return out;
}

bool DeclaresModelOpt(const Checkpoint& derived) {
  const nlohmann::json& c = derived.config();
  if (c.contains("quantization_config") && c["quantization_config"].is_object() &&
      absl::StartsWith(c["quantization_config"].value("quant_method", ""), "modelopt")) {
    return true;
  }
  absl::StatusOr<std::span<const uint8_t>> bytes = derived.image().Content("hf_quant_config.json");
  if (!bytes.ok()) return false;
  absl::StatusOr<nlohmann::json> q = ParseJsonDocument(*bytes, "hf_quant_config.json");
  return q.ok() && q->is_object() && q->contains("producer") && (*q)["producer"].is_object() &&
         (*q)["producer"].value("name", "") == "modelopt";
}

absl::Status CompareGptOssUnit(const Checkpoint& source, const Checkpoint& derived,
                               const PairUnit& unit, PairUnitOutcome* o) {
  const std::string& base = unit.name;
  absl::StatusOr<Dims> d = gptoss::DimsFromConfig(source.text_config());
  if (!d.ok()) return d.status();
  const Fused f =
      absl::EndsWith(base, "." + gptoss::FusedName(Fused::kGateUp)) ? Fused::kGateUp : Fused::kDown;
  if (!absl::EndsWith(base, "." + gptoss::FusedName(f))) {
    return absl::InvalidArgumentError(
        absl::StrCat(base, "_blocks: not a gpt-oss gate_up_proj or down_proj tensor"));
  }
  const uint64_t E = d->experts, R = d->Rows(f), C = d->Cols(f), G = C / 32;
  const std::optional<TensorRef> sb = source.Find(base + "_blocks"),
                                 ss = source.Find(base + "_scales");
  // Shapes, not byte counts: the header parser bounds shape products, so the loops below stay
  // inside the tensors whatever the config says.
  if (!sb || !ss || sb->info->shape != std::vector<uint64_t>{E, R, G, 16} ||
      ss->info->shape != std::vector<uint64_t>{E, R, G} || sb->info->dtype != DType::kU8 ||
      ss->info->dtype != DType::kU8 || sb->bytes().size() != sb->info->num_bytes() ||
      ss->bytes().size() != ss->info->num_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(base, "_blocks/_scales: the source's config needs [", E, ", ", R, ", ", G,
                     ", 16] and [", E, ", ", R, ", ", G, "]"));
  }
  // The derived side's contract: names, dtypes and shapes of the ModelOpt export.
  const std::vector<gptoss::TensorSpec> want = gptoss::ModelOptTensors(
      base.substr(0, base.size() - gptoss::FusedName(f).size()), *d, f, true, DType::kBF16);
  std::optional<TensorRef> dt[3];
  for (int i = 0; i < 3; ++i) {
    dt[i] = derived.Find(want[i].name);
    if (!dt[i]) {
      Add(o, "missing-tensor", want[i].name, -1, -1, "absent from the derived checkpoint");
    } else if (i < 2 &&
               (dt[i]->info->dtype != want[i].dtype || dt[i]->info->shape != want[i].shape ||
                dt[i]->bytes().size() != dt[i]->info->num_bytes())) {
      Add(o, "derived-tensor-invalid", want[i].name, -1, -1,
          absl::StrCat(DTypeName(dt[i]->info->dtype), " ",
                       DumpJson(nlohmann::json(dt[i]->info->shape)),
                       ", ModelOpt's gpt-oss export is ", DTypeName(want[i].dtype), " ",
                       DumpJson(nlohmann::json(want[i].shape))));
      dt[i].reset();
    }
  }
  std::optional<float> s2;
  if (dt[2]) {
    s2 = Scalar(*dt[2]);
    if (!s2 || !std::isfinite(*s2) || !(*s2 > 0)) {
      Add(o, "derived-tensor-invalid", want[2].name, -1, -1,
          "weight_scale_2 must be one finite positive F32, 0-d or [1]");
      s2.reset();
    }
  }
  if (std::optional<TensorRef> in = derived.Find(want[3].name); in && !Scalar(*in)) {
    Add(o, "derived-tensor-invalid", want[3].name, -1, -1,
        "input_scale must be one F32, 0-d or [1]");
  }
  // [E, R, C/32, 16] is an [E*R, C] MXFP4 matrix: its scale bytes are counted as any source's.
  absl::StatusOr<Mxfp4View> v = Mxfp4View::Make(base, sb->bytes(), ss->bytes(), E * R, C);
  if (!v.ok()) return v.status();
  CountScaleBytes(*v, o);
  if (!dt[0] || !dt[1] || !s2) return absl::OkStatus();
  uint32_t bits;
  std::memcpy(&bits, &*s2, 4);
  o->global_bits = bits;

  const uint8_t* sp = sb->bytes().data();
  const uint8_t* sc = ss->bytes().data();
  const uint8_t* dp = dt[0]->bytes().data();
  const uint8_t* dc = dt[1]->bytes().data();
  const double global = *s2;
  for (uint64_t e = 0; e < E; ++e) {
    for (uint64_t r = 0; r < R; ++r) {
      for (uint64_t g = 0; g < G; ++g) {
        const gptoss::FusedElement first{e, r, g * 32};
        const uint64_t at = gptoss::Mxfp4Position(*d, f, first).code.byte;
        const uint8_t s = sc[gptoss::Mxfp4Position(*d, f, first).scale];
        const double want_scale = DecodeE8M0(s);
        uint8_t got[16];
        bool same_bytes = true;
        for (uint64_t i = 0; i < 16; ++i) {
          got[i] = dp[gptoss::ModelOptPosition(*d, f, {e, r, g * 32 + 2 * i}).code.byte];
          same_bytes &= got[i] == sp[at + i];
        }
        bool differs = false, zero_fixed = false;
        uint8_t dscale[2];
        for (uint64_t h = 0; h < 2; ++h) {
          dscale[h] = dc[gptoss::ModelOptPosition(*d, f, {e, r, g * 32 + 16 * h}).scale];
          const double got_scale = DecodeE4M3(dscale[h]) * global;
          if (same_bytes) {
            if (want_scale == got_scale) continue;
            (Active16(sp + at + 8 * h) ? differs : zero_fixed) = true;
            continue;
          }
          for (uint64_t i = 8 * h; i < 8 * h + 8; ++i) {
            const uint8_t a = sp[at + i], b = got[i];
            if (DecodeE2M1(LowNibble(a)) * want_scale != DecodeE2M1(LowNibble(b)) * got_scale ||
                DecodeE2M1(HighNibble(a)) * want_scale != DecodeE2M1(HighNibble(b)) * got_scale) {
              differs = true;
            }
          }
        }
        const std::string tensor = absl::StrCat(base, "[", e, "]");
        const std::string where =
            absl::StrCat("expert ", e, ", ", gptoss::ProjectionName(gptoss::ProjectionOfRow(f, r)),
                         " row ", gptoss::ProjectionRow(f, r), ", block ", g);
        if (!same_bytes) Add(o, "packed-bytes-differ", tensor, r, g, where + ": FP4 codes differ");
        if (differs) {
          Add(o, "value-differs", tensor, r, g, where + ": reconstructed values differ",
              {{"expert", e},
               {"source_scale_byte", s},
               {"derived_scale_byte_0", dscale[0]},
               {"derived_scale_byte_1", dscale[1]}});
        } else if (zero_fixed) {
          ++o->zero_canonicalized;
        }
      }
    }
  }
  o->packed_bytes = E * R * C / 2;
  o->value_blocks = E * R * G * 2;
  return absl::OkStatus();
}

}  // namespace ckpt::quant
