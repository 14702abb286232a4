#include "core/quant/scale_window.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/parallel.h"
#include "core/quant/byte_scan.h"
#include "core/quant/codecs.h"
#include "core/quant/quant_weight.h"
#include "core/quant/x4t_container.h"

namespace ckpt::quant {
namespace {

// The per-tensor pass: histograms of scale bytes on active and all-zero groups.
struct TensorScan {
  TensorScaleStats stats;
  std::array<uint64_t, 256> active_hist{};
  std::array<uint64_t, 256> zero_hist{};
  FindingList nan{0};
  // MXFP4 codes and scales (owned for X4T, borrowed otherwise) for the listing pass.
  std::vector<uint8_t> owned_packed, owned_scale;
  std::span<const uint8_t> packed, scale;
};

// The hot loop keeps only min/max/count of active scale bytes (a histogram of active groups
// costs a dependent store per group); NaN locations are found by a second pass when present.
void ScanMxfp4(const PackedFp4& codes, std::span<const uint8_t> scale, size_t cap, TensorScan* s) {
  const uint64_t groups = codes.cols() / 32;
  s->stats.rows = codes.rows();
  s->stats.groups = codes.rows() * groups;
  s->nan = FindingList(cap);
  const uint8_t* packed = codes.bytes().data();
  uint32_t lo = 255, hi = 0;
  uint64_t active = 0, nan_active = 0;
  for (uint64_t r = 0; r < codes.rows(); ++r) {
    const uint8_t* row = packed + r * groups * 16;
    const uint8_t* sc = scale.data() + r * groups;
    // Fast path (nearly every row): all groups active and no NaN scale.
    if (RowAllActive(row, groups)) {
      uint8_t row_lo, row_hi;
      MinMaxBytes(sc, groups, &row_lo, &row_hi);
      if (row_hi != kE8M0NaN) {
        lo = std::min<uint32_t>(lo, row_lo);
        hi = std::max<uint32_t>(hi, row_hi);
        active += groups;
        continue;
      }
    }
    for (uint64_t g = 0; g < groups; ++g) {
      const uint32_t b = sc[g];
      if (GroupActive16(row + g * 16)) {
        ++active;
        nan_active += b == kE8M0NaN;
        lo = std::min(lo, b);
        hi = std::max(hi, b == kE8M0NaN ? 0u : b);
      } else {
        s->zero_hist[b]++;
      }
    }
  }
  s->stats.active_groups = active;
  s->stats.nan_scales_active = nan_active;
  if (active > nan_active) {
    s->stats.k_min = E8M0Exponent(static_cast<uint8_t>(lo));
    s->stats.k_max = E8M0Exponent(static_cast<uint8_t>(hi));
  }
  s->stats.nan_scales_zero = s->zero_hist[kE8M0NaN];
  for (uint64_t n : s->zero_hist) s->stats.zero_groups += n;
  if (nan_active == 0 && s->stats.nan_scales_zero == 0) return;
  for (uint64_t r = 0; r < codes.rows(); ++r) {
    for (uint64_t g = 0; g < groups; ++g) {
      if (scale[r * groups + g] != kE8M0NaN) continue;
      if (GroupActive16(packed + (r * groups + g) * 16)) {
        s->nan.Add({"nan-scale", s->stats.tensor, static_cast<int64_t>(r),
                    static_cast<int64_t>(g), "E8M0 0xFF (NaN) on a group with nonzero values", {}});
      } else {
        s->nan.Add({"nan-scale-zero-group", s->stats.tensor, static_cast<int64_t>(r),
                    static_cast<int64_t>(g), "E8M0 0xFF on an all-zero group (values are zero)", {}});
      }
    }
  }
}

// Appends to s->nan (which the caller sized).
void ScanNvfp4(const Nvfp4View& v, TensorScan* s) {
  const uint64_t blocks = v.blocks_per_row();
  s->stats.rows = v.rows();
  s->stats.groups = v.rows() * blocks;
  float g = v.global().value;
  uint32_t bits;
  std::memcpy(&bits, &g, 4);
  s->stats.global_scale_bits = bits;
  for (uint64_t r = 0; r < v.rows(); ++r) {
    for (uint64_t b = 0; b < blocks; ++b) {
      const uint8_t sb = v.ScaleByte(r, b);
      const bool nan = (sb & 0x7F) == 0x7F;
      const int64_t row = static_cast<int64_t>(r), block = static_cast<int64_t>(b);
      if (v.codes().AnyNonzero(r, b * 16, 16)) {
        s->active_hist[sb]++;
        if (nan) {
          s->nan.Add({"nan-scale", s->stats.tensor, row, block,
                      "E4M3 NaN scale (0x7F/0xFF) on a block with nonzero values", {}});
        } else if ((sb & 0x7F) == 0) {
          // ModelOpt never writes a zero block scale (docs/formats.md §9): the block's
          // nonzero codes all read as zero.
          s->nan.Add({"zero-block-scale", s->stats.tensor, row, block,
                      "E4M3 zero scale on a block with nonzero codes (its values are lost)", {}});
        }
      } else {
        s->zero_hist[sb]++;
        if (nan) {
          s->nan.Add({"nan-scale-zero-group", s->stats.tensor, row, block,
                      "E4M3 NaN scale on an all-zero block (0 * NaN is NaN in most kernels)", {}});
        }
      }
    }
  }
  for (int b = 0; b < 256; ++b) {
    if (!s->active_hist[b]) continue;
    s->stats.active_groups += s->active_hist[b];
    const double d = std::fabs(DecodeE4M3(static_cast<uint8_t>(b)));
    if ((b & 0x7F) == 0x7F) {
      s->stats.nan_scales_active += s->active_hist[b];
      continue;
    }
    if (d == 0) continue;
    const int k = std::ilogb(d);
    if (!s->stats.k_min || k < *s->stats.k_min) s->stats.k_min = k;
    if (!s->stats.k_max || k > *s->stats.k_max) s->stats.k_max = k;
  }
  for (uint64_t n : s->zero_hist) s->stats.zero_groups += n;
}

absl::Status ScanModule(const Checkpoint& ckpt, const std::string& module, size_t cap, TensorScan* s) {
  absl::StatusOr<QuantWeight> w = ResolveWeight(ckpt, module);
  if (!w.ok()) return w.status();
  s->stats.tensor = module;
  s->stats.kind = WeightKindName(w->kind);
  s->stats.fused_group = FusedGroupOf(module);
  switch (w->kind) {
    case WeightKind::kMxfp4: {
      absl::StatusOr<Mxfp4View> v = Mxfp4ViewOf(*w);
      if (!v.ok()) return v.status();
      s->packed = v->codes().bytes();
      s->scale = v->scales();
      ScanMxfp4(v->codes(), v->scales(), cap, s);
      return absl::OkStatus();
    }
    case WeightKind::kX4T: {
      absl::StatusOr<X4TExpertMatrix> m = ReadX4TExpertMatrix(*w);
      if (!m.ok()) return m.status();
      s->owned_packed = std::move(m->weight_packed);
      s->owned_scale = std::move(m->weight_scale);
      s->packed = s->owned_packed;
      s->scale = s->owned_scale;
      ScanMxfp4(PackedFp4(s->packed, w->rows, w->cols, NibbleOrder::kLowFirst), s->scale, cap, s);
      return absl::OkStatus();
    }
    case WeightKind::kNvfp4: {
      // The per-tensor scalars must be finite and positive: a zero, negative, NaN or infinite
      // weight or activation global makes every value of the tensor meaningless, and vLLM
      // checks neither (docs/formats.md §9).
      s->nan = FindingList(cap);
      for (const auto& [t, code] : {std::pair{w->global_scale, "bad-global-scale"},
                                    std::pair{w->input_global_scale, "bad-input-scale"}}) {
        if (!t) continue;
        absl::StatusOr<float> f = ReadScalarF32(*t);
        if (!f.ok()) return f.status();
        if (!(std::isfinite(*f) && *f > 0)) {
          s->nan.Add({code, t->info->name, -1, -1,
                      absl::StrCat("value ", *f, " (", GlobalRoleName(w->global_role),
                                   "): must be finite and > 0"), {}});
        }
      }
      if (s->nan.count("bad-global-scale") > 0) return absl::OkStatus();
      absl::StatusOr<Nvfp4View> v = Nvfp4ViewOf(*w);
      if (!v.ok()) return v.status();
      ScanNvfp4(*v, s);
      return absl::OkStatus();
    }
    case WeightKind::kPlain: break;
  }
  return absl::InvalidArgumentError(absl::StrCat(module, ": not a quantized weight"));
}

// Second pass, only over tensors that have over-span groups: list their coordinates.
uint64_t ListOverSpan(const TensorScan& s, int limit_k, FindingList* out) {
  uint64_t n = 0;
  const uint64_t groups = s.stats.groups / s.stats.rows;
  const uint64_t cols = groups * 32;
  PackedFp4 codes(s.packed, s.stats.rows, cols, NibbleOrder::kLowFirst);
  for (uint64_t r = 0; r < s.stats.rows; ++r) {
    for (uint64_t g = 0; g < groups; ++g) {
      const uint8_t b = s.scale[r * groups + g];
      if (b == kE8M0NaN || E8M0Exponent(b) >= limit_k) continue;
      if (!codes.AnyNonzero(r, g * 32, 32)) continue;
      ++n;
      out->Add({"over-span", s.stats.tensor, static_cast<int64_t>(r), static_cast<int64_t>(g),
                "active group below the E4M3 window of its fused k_max",
                {{"k", E8M0Exponent(b)}, {"k_max", *s.stats.pair_k_max}}});
    }
  }
  return n;
}

// gpt-oss native MXFP4: `X_blocks` U8 [E, R, G, 16] with `X_scales` U8 [E, R, G]; one unit
// per stacked tensor X, whose experts are its members, named "X[e]" (gate and up rows are
// interleaved in one expert slice). They share k_max: ModelOpt's gpt-oss export has one
// weight_scale_2 per stacked tensor (docs/quant.md "gpt-oss layouts").
absl::Status AddGptOssUnits(const Checkpoint& ckpt, std::vector<ScaleWindowUnit>* units,
                            size_t* order) {
  for (const std::string& n : ckpt.TensorNames()) {
    if (!absl::EndsWith(n, "_blocks")) continue;
    const std::string base = n.substr(0, n.size() - 7);
    std::optional<TensorRef> blocks = ckpt.Find(n), scales = ckpt.Find(base + "_scales");
    if (!scales) continue;  // reported by DetectFormat as missing-scale
    const std::vector<uint64_t>& b = blocks->info->shape;
    if (blocks->info->dtype != DType::kU8 || b.size() != 4 || b[3] != 16 ||
        scales->info->shape != std::vector<uint64_t>{b[0], b[1], b[2]}) {
      return absl::InvalidArgumentError(
          absl::StrCat(n, ": gpt-oss blocks must be U8 [E, R, G, 16] with scales [E, R, G]"));
    }
    ScaleWindowUnit& u = units->emplace_back();
    u.fused_group = base;
    u.tensors = {n, base + "_scales"};
    for (uint64_t e = 0; e < b[0]; ++e) {
      u.members.push_back(
          {(*order)++, absl::StrCat(base, "[", e, "]"), base, e, b[1] * b[2] * 16});
    }
  }
  return absl::OkStatus();
}

}  // namespace

// One member's scan (defined here: the header only carries it between Scan and Finish).
struct ScaleWindowPartial::Member {
  size_t order = 0;
  TensorScan scan;
  FindingList over_span{0};
};


std::vector<ScaleWindowMemberResult> MembersOf(const ScaleWindowPartial& partial) {
  std::vector<ScaleWindowMemberResult> out;
  for (const auto& m : partial.members) {
    out.push_back({m->order, m->scan.stats, m->scan.nan, m->over_span});
  }
  return out;
}

ScaleWindowPartial PartialOf(std::vector<ScaleWindowMemberResult> members) {
  ScaleWindowPartial partial;
  for (ScaleWindowMemberResult& r : members) {
    auto m = std::make_shared<ScaleWindowPartial::Member>();
    m->order = r.order;
    m->scan.stats = std::move(r.stats);
    m->scan.nan = std::move(r.nan);
    m->over_span = std::move(r.over_span);
    partial.members.push_back(std::move(m));
  }
  return partial;
}

nlohmann::json ScaleWindowConfig::ToJson() const {
  return {{"id", id()},
          {"name", name},
          {"version", version},
          {"max_span", max_span},
          {"marlin_span", marlin_span},
          {"marlin_min_scale_log2", marlin_min_scale_log2},
          {"max_listed", max_listed}};
}

nlohmann::json TensorScaleStats::ToJson() const {
  nlohmann::json j = {{"tensor", tensor},
                      {"kind", kind},
                      {"fused_group", fused_group},
                      {"rows", rows},
                      {"groups", groups},
                      {"active_groups", active_groups},
                      {"zero_groups", zero_groups},
                      {"zero_groups_out_of_window", zero_groups_out_of_window},
                      {"nan_scales_active", nan_scales_active},
                      {"nan_scales_zero", nan_scales_zero},
                      {"over_span_groups", over_span_groups},
                      {"span", span()}};
  if (k_min) j["k_min"] = *k_min;
  if (k_max) j["k_max"] = *k_max;
  if (pair_k_max) j["pair_k_max"] = *pair_k_max;
  if (global_scale_bits) {
    char hex[16];
    std::snprintf(hex, sizeof hex, "0x%08x", *global_scale_bits);
    j["global_scale_f32_bits"] = hex;
  }
  return j;
}

std::string VerdictName(ScaleWindowVerdict v) {
  switch (v) {
    case ScaleWindowVerdict::kLosslessTranscodable: return "lossless-transcodable";
    case ScaleWindowVerdict::kOverSpan: return "over-span";
    case ScaleWindowVerdict::kNaNScale: return "rejected-nan-scale";
    case ScaleWindowVerdict::kNotMxfp4: return "not-mxfp4";
    case ScaleWindowVerdict::kNoQuantizedTensors: return "no-quantized-tensors";
  }
  return "?";
}

const TensorScaleStats* ScaleWindowResult::Find(const std::string& tensor) const {
  for (const TensorScaleStats& t : tensors) {
    if (t.tensor == tensor) return &t;
  }
  return nullptr;
}

nlohmann::json ScaleWindowResult::ToJson() const {
  nlohmann::json ts = nlohmann::json::array();
  for (const TensorScaleStats& t : tensors) ts.push_back(t.ToJson());
  return {{"policy", config.ToJson()},
          {"verdict", VerdictName(verdict)},
          {"tensors", ts},
          {"zero_groups_out_of_window", zero_groups_out_of_window},
          {"over_span", over_span.ToJson()},
          {"nan_scales", nan_scales.ToJson()},
          {"hazards", hazards.ToJson()}};
}

std::string FusedGroupOf(const std::string& module) {
  const size_t dot = module.rfind('.');
  const std::string prefix = dot == std::string::npos ? "" : module.substr(0, dot + 1);
  const std::string last = dot == std::string::npos ? module : module.substr(dot + 1);
  if (last == "w1" || last == "w3") return prefix + "w13";
  // A routed expert's gate/up (DeepSeek-style names) is vLLM's fused-MoE w13 too, which takes
  // gate's global; a dense gate/up linear (shared experts included) takes the max.
  if (last == "gate_proj" || last == "up_proj") {
    return prefix + (absl::StrContains(prefix, ".experts.") ? "w13" : "gate_up");
  }
  if (last == "q_proj" || last == "k_proj" || last == "v_proj") return prefix + "qkv";
  return module;
}

absl::StatusOr<std::vector<ScaleWindowUnit>> ScaleWindowPolicy::Plan(
    const Checkpoint& ckpt) const {
  std::vector<ScaleWindowUnit> units;
  std::map<std::string, size_t> unit_of_group;
  size_t order = 0;
  for (const std::string& m : PackedModules(ckpt)) {
    const std::string group = FusedGroupOf(m);
    auto [it, fresh] = unit_of_group.emplace(group, units.size());
    if (fresh) units.push_back({group, {}, {}});
    ScaleWindowUnit& u = units[it->second];
    u.members.push_back(
        {order++, m, "", 0, ckpt.Find(PackedTensorOf(ckpt, m))->info->num_bytes()});
    for (std::string& t : ModuleTensorNames(ckpt, m)) u.tensors.push_back(std::move(t));
  }
  if (absl::Status s = AddGptOssUnits(ckpt, &units, &order); !s.ok()) return s;
  return units;
}

absl::StatusOr<ScaleWindowPartial> ScaleWindowPolicy::Scan(const Checkpoint& ckpt,
                                                           const ScaleWindowUnit& unit) const {
  ScaleWindowPartial part;
  for (const ScaleWindowUnit::Member& m : unit.members) {
    auto member = std::make_shared<ScaleWindowPartial::Member>();
    member->order = m.order;
    TensorScan& sc = member->scan;
    if (!m.gpt_oss_base.empty()) {
      const TensorRef blocks = *ckpt.Find(m.gpt_oss_base + "_blocks");
      const TensorRef scales = *ckpt.Find(m.gpt_oss_base + "_scales");
      const std::vector<uint64_t>& b = blocks.info->shape;
      const uint64_t per_packed = b[1] * b[2] * 16, per_scale = b[1] * b[2];
      if (blocks.bytes().size() != b[0] * per_packed || scales.bytes().size() != b[0] * per_scale) {
        return absl::InternalError(absl::StrCat(m.name, ": tensor bytes not in memory"));
      }
      sc.stats.tensor = m.name;
      sc.stats.kind = "mxfp4";
      sc.stats.fused_group = unit.fused_group;
      sc.packed = blocks.bytes().subspan(m.expert * per_packed, per_packed);
      sc.scale = scales.bytes().subspan(m.expert * per_scale, per_scale);
      ScanMxfp4(PackedFp4(sc.packed, b[1], b[2] * 32, NibbleOrder::kLowFirst), sc.scale,
                config_.max_listed, &sc);
    } else if (absl::Status s = ScanModule(ckpt, m.name, config_.max_listed, &sc); !s.ok()) {
      return s;
    }
    part.members.push_back(std::move(member));
  }
  // The fused group's shared k_max; then what depends on it, while the bytes are here.
  std::optional<int> kmax;
  for (const auto& m : part.members) {
    const std::optional<int>& k = m->scan.stats.k_max;
    if (k && (!kmax || *k > *kmax)) kmax = k;
  }
  for (const auto& m : part.members) {
    TensorScaleStats& t = m->scan.stats;
    t.pair_k_max = kmax;
    m->over_span = FindingList(config_.max_listed);
    if (t.kind == "nvfp4") continue;
    if (!t.pair_k_max) {
      t.zero_groups_out_of_window = t.zero_groups;
      continue;
    }
    const int low = *t.pair_k_max - config_.max_span;
    for (int b = 0; b < 255; ++b) {
      const int k = E8M0Exponent(b);
      if (k < low || k > *t.pair_k_max) t.zero_groups_out_of_window += m->scan.zero_hist[b];
    }
    // Only tensors whose smallest active exponent is out of the window are scanned again.
    if (t.k_min && *t.k_min < low) t.over_span_groups = ListOverSpan(m->scan, low, &m->over_span);
  }
  return part;
}

ScaleWindowResult ScaleWindowPolicy::Finish(std::vector<ScaleWindowPartial> parts) const {
  std::vector<ScaleWindowPartial::Member*> scans;
  for (ScaleWindowPartial& p : parts) {
    for (auto& m : p.members) scans.push_back(m.get());
  }
  std::sort(scans.begin(), scans.end(),
            [](const auto* a, const auto* b) { return a->order < b->order; });
  ScaleWindowResult result;
  result.config = config_;
  result.over_span = FindingList(config_.max_listed);
  result.nan_scales = FindingList(config_.max_listed);
  result.hazards = FindingList(config_.max_listed);
  // Fused NVFP4 tensors must agree on the global scale.
  std::map<std::string, std::vector<const TensorScaleStats*>> fused;
  for (const auto* s : scans) fused[s->scan.stats.fused_group].push_back(&s->scan.stats);
  for (const auto& [group, members] : fused) {
    if (members.size() < 2 || members[0]->kind != "nvfp4") continue;
    bool differ = false;
    for (const TensorScaleStats* t : members) {
      differ |= t->global_scale_bits != members[0]->global_scale_bits;
    }
    if (!differ) continue;
    const bool w13 = absl::EndsWith(group, ".w13");
    result.hazards.Add({w13 ? "vllm-w13-global-scale-collapse" : "vllm-fused-global-scale-max",
                        group, -1, -1,
                        w13 ? "w1/w3 global scales differ; vLLM loads both with w1's, "
                              "changing w3's values"
                            : "fused tensors' global scales differ; vLLM uses their max", {}});
  }
  bool any_mx = false;
  for (const auto* s : scans) {
    const TensorScaleStats& t = s->scan.stats;
    result.nan_scales.Merge(s->scan.nan);
    if (t.kind == "nvfp4") {
      const bool small = t.k_min && *t.k_min < config_.marlin_min_scale_log2;
      if (small || t.span() >= config_.marlin_span) {
        result.hazards.Add({"marlin-small-scale-folding", t.tensor, -1, -1,
                            "Marlin rescales layers whose block scales fall below 2^-6",
                            {{"span", t.span()}, {"k_min", t.k_min.value_or(0)}}});
      }
      result.tensors.push_back(t);
      continue;
    }
    any_mx = true;
    result.over_span.Merge(s->over_span);
    if (t.pair_k_max && t.span() >= config_.marlin_span) {
      result.hazards.Add({"marlin-small-scale-folding", t.tensor, -1, -1,
                          "after transcoding, block scales fall below 2^-6 (span >= 15)",
                          {{"span", t.span()}}});
    }
    result.zero_groups_out_of_window += t.zero_groups_out_of_window;
    result.tensors.push_back(t);
  }
  if (scans.empty()) {
    result.verdict = ScaleWindowVerdict::kNoQuantizedTensors;
  } else if (result.nan_scales.count("nan-scale") > 0) {
    result.verdict = ScaleWindowVerdict::kNaNScale;
  } else if (!any_mx) {
    result.verdict = ScaleWindowVerdict::kNotMxfp4;
  } else if (result.over_span.total() > 0) {
    result.verdict = ScaleWindowVerdict::kOverSpan;
  } else {
    result.verdict = ScaleWindowVerdict::kLosslessTranscodable;
  }
  return result;
}

absl::StatusOr<ScaleWindowResult> ScaleWindowPolicy::Check(const Checkpoint& ckpt,
                                                           Progress& progress,
                                                           unsigned threads) const {
  absl::StatusOr<std::vector<ScaleWindowUnit>> units = Plan(ckpt);
  if (!units.ok()) return units.status();
  uint64_t total = 0;
  for (const ScaleWindowUnit& u : *units) {
    for (const auto& m : u.members) total += m.bytes;
  }
  progress.Begin("scale-window", total);
  std::vector<ScaleWindowPartial> parts(units->size());
  absl::Status st = ParallelFor(units->size(), threads, [&](size_t i) {
    absl::StatusOr<ScaleWindowPartial> p = Scan(ckpt, (*units)[i]);
    if (!p.ok()) return p.status();
    parts[i] = *std::move(p);
    for (const auto& m : (*units)[i].members) progress.Advance(m.bytes);
    return absl::OkStatus();
  });
  progress.End();
  if (!st.ok()) return st;
  return Finish(std::move(parts));
}

}  // namespace ckpt::quant
