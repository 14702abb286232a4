#include "core/quant/pair_verify.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/parallel.h"
#include "core/quant/byte_scan.h"
#include "core/quant/codecs.h"
#include "core/quant/quant_weight.h"
#include "core/quant/scale_window.h"
#include "core/quant/x4t_container.h"
#include "core/sha256.h"

namespace ckpt::quant {
namespace {

Finding At(std::string code, const std::string& tensor, uint64_t row, uint64_t group,
           std::string message) {
  return {std::move(code), tensor, static_cast<int64_t>(row), static_cast<int64_t>(group),
          std::move(message), {}};
}

bool BlockActive(const uint8_t* p) {  // 8 packed bytes = one 16-element block
  uint64_t w;
  std::memcpy(&w, p, 8);
  return (w & 0x7777777777777777ull) != 0;
}

// For each E8M0 byte s, the E4M3 byte d whose scale with the global applied in its role
// (docs/formats.md §4, §9) is 2^(s-127) exactly, or -1.
std::array<int, 256> ExactScaleBytes(const Nvfp4Global& global) {
  std::array<int, 256> out;
  out.fill(-1);
  for (int d = 0; d < 256; ++d) {
    const double v = global.Apply(DecodeE4M3(static_cast<uint8_t>(d)));
    int e;
    if (!(v > 0) || std::frexp(v, &e) != 0.5) continue;  // not a positive power of two
    const int s = (e - 1) + 127;                           // v == 2^(e-1)
    if (s >= 0 && s < 255 && std::ldexp(1.0, e - 1) == v) out[s] = d;
  }
  return out;
}

// Source MXFP4 against derived NVFP4. Fast path per 32-group: identical packed bytes and both
// block scales equal to the exact E4M3 image of the source scale; anything else is decided
// block by block (scale equality on identical codes, else element by element).
void CompareGroupSlow(const Mxfp4View& s, const Nvfp4View& d, const std::string& m, uint64_t r,
                      uint64_t g, bool same_bytes, PairUnitOutcome* o) {
  const double want = DecodeE8M0(s.ScaleByte(r, g));
  const uint8_t* a = s.codes().bytes().data() + r * (s.cols() / 2) + g * 16;
  bool zero_fixed = false, differs = false;
  for (int h = 0; h < 2; ++h) {
    const uint64_t block = 2 * g + h;
    if (same_bytes) {
      if (want == d.BlockScale(r, block)) continue;
      (BlockActive(a + 8 * h) ? differs : zero_fixed) = true;
      continue;
    }
    for (uint64_t c = block * 16; c < block * 16 + 16; ++c) {
      if (s.Value(r, c) != d.Value(r, c)) differs = true;
    }
  }
  if (!same_bytes) o->found.Add(At("packed-bytes-differ", m, r, g, "FP4 codes differ"));
  if (differs) {
    Finding f = At("value-differs", m, r, g, "reconstructed values differ");
    f.numbers = {{"source_scale_byte", s.ScaleByte(r, g)},
                 {"derived_scale_byte_0", d.ScaleByte(r, 2 * g)},
                 {"derived_scale_byte_1", d.ScaleByte(r, 2 * g + 1)}};
    o->found.Add(std::move(f));
  } else if (zero_fixed) {
    ++o->zero_canonicalized;
  }
}

void CompareNvfp4(const Mxfp4View& s, const Nvfp4View& d, const std::string& m, PairUnitOutcome* o) {
  const std::array<int, 256> exact = ExactScaleBytes(d.global());
  const uint64_t groups = s.groups_per_row(), row_bytes = s.cols() / 2;
  const uint8_t* sp = s.codes().bytes().data();
  const uint8_t* dp = d.codes().bytes().data();
  const uint8_t* ss = s.scales().data();
  const uint8_t* ds = d.scales().data();
  // Both 16-block scale bytes as one little-endian u16; 0xFFFFFFFF where no exact image exists.
  std::array<uint32_t, 256> want2;
  for (int b = 0; b < 256; ++b) want2[b] = exact[b] < 0 ? 0xFFFFFFFFu : exact[b] * 0x0101u;
  // With a power-of-two global scale 2^j, the exact E4M3 image of 2^(s-127) is the normal
  // byte (s - 120 + j) << 3 for a divisor, (s - 120 - j) << 3 for a multiplier, whenever that
  // exponent field is 1..15: checked 16 groups at a time.
  int j = 0;
  const bool pow2_global = std::frexp(d.global().value, &j) == 0.5f;
  const int c = (d.global().role == GlobalRole::kDivisor ? (j - 1) : -(j - 1)) - 120;
  for (uint64_t r = 0; r < s.rows(); ++r) {
    // Fast path for a whole row: libc's vectorized memcmp of the codes and a vectorized scan of
    // the scales. Rows that fail it are examined group by group.
    const uint8_t* srow = ss + r * groups;
    const uint8_t* drow = ds + r * groups * 2;
    if (std::memcmp(sp + r * row_bytes, dp + r * row_bytes, row_bytes) == 0 && pow2_global) {
      uint8_t lo, hi;
      MinMaxBytes(srow, groups, &lo, &hi);
      if (hi != kE8M0NaN && lo + c >= 1 && hi + c <= 15 &&
          RowScalesMatchNormal(srow, drow, groups, c)) {
        continue;
      }
    }
    for (uint64_t g = 0; g < groups; ++g) {
      const bool same_bytes = Same16(sp + r * row_bytes + g * 16, dp + r * row_bytes + g * 16);
      uint16_t got;
      std::memcpy(&got, drow + 2 * g, 2);
      if (same_bytes && want2[srow[g]] == got) continue;
      CompareGroupSlow(s, d, m, r, g, same_bytes, o);
    }
  }
  o->packed_bytes = s.codes().bytes().size();
  o->value_blocks = s.rows() * groups * 2;
}

void CompareX4T(const Mxfp4View& s, const X4TExpertMatrix& x, const std::string& m, PairUnitOutcome* o) {
  const uint64_t groups = s.groups_per_row(), row_bytes = s.cols() / 2;
  const uint8_t* sp = s.codes().bytes().data();
  for (uint64_t r = 0; r < s.rows(); ++r) {
    for (uint64_t g = 0; g < groups; ++g) {
      if (!Same16(sp + r * row_bytes + g * 16, &x.weight_packed[r * row_bytes + g * 16])) {
        o->found.Add(At("packed-bytes-differ", m, r, g, "FP4 codes differ"));
      }
      if (s.ScaleByte(r, g) != x.weight_scale[r * groups + g]) {
        Finding f = At("scale-differs", m, r, g, "decoded X4T scale differs from the source");
        f.numbers = {{"source_scale_byte", s.ScaleByte(r, g)},
                     {"derived_scale_byte", x.weight_scale[r * groups + g]}};
        o->found.Add(std::move(f));
      }
    }
  }
  o->packed_bytes = s.codes().bytes().size();
  o->value_blocks = s.rows() * groups;
}

}  // namespace

void CountScaleBytes(const Mxfp4View& s, PairUnitOutcome* o) {
  for (uint64_t r = 0; r < s.rows(); ++r) {
    for (uint64_t g = 0; g < s.groups_per_row(); ++g) {
      (s.GroupActive(r, g) ? o->active_bytes : o->zero_bytes)[s.ScaleByte(r, g)]++;
    }
  }
}

namespace {

absl::Status CompareModule(const Checkpoint& src, const Checkpoint& dst, const std::string& m,
                           PairUnitOutcome* o) {
  absl::StatusOr<QuantWeight> sw = ResolveWeight(src, m);
  if (!sw.ok()) return sw.status();
  absl::StatusOr<Mxfp4View> sv = Mxfp4ViewOf(*sw);
  if (!sv.ok()) return sv.status();
  CountScaleBytes(*sv, o);
  absl::StatusOr<QuantWeight> dw = ResolveWeight(dst, m);
  if (!dw.ok()) {
    o->found.Add({"derived-tensor-invalid", m, -1, -1, std::string(dw.status().message()), {}});
    return absl::OkStatus();
  }
  if (dw->rows != sw->rows || dw->cols != sw->cols) {
    o->found.Add({"shape-differs", m, -1, -1,
                  absl::StrCat("source [", sw->rows, ", ", sw->cols, "], derived [", dw->rows,
                               ", ", dw->cols, "]"), {}});
    return absl::OkStatus();
  }
  if (dw->kind == WeightKind::kNvfp4) {
    absl::StatusOr<Nvfp4View> dv = Nvfp4ViewOf(*dw);
    if (!dv.ok()) {
      o->found.Add({"derived-tensor-invalid", m, -1, -1, std::string(dv.status().message()), {}});
      return absl::OkStatus();
    }
    float g = dv->global().value;
    uint32_t bits;
    std::memcpy(&bits, &g, 4);
    o->global_bits = bits;
    CompareNvfp4(*sv, *dv, m, o);
  } else if (dw->kind == WeightKind::kX4T) {
    absl::StatusOr<X4TExpertMatrix> x = ReadX4TExpertMatrix(*dw);
    if (!x.ok()) {
      o->found.Add({"x4t-stream-invalid", m, -1, -1, std::string(x.status().message()), {}});
      return absl::OkStatus();
    }
    CompareX4T(*sv, *x, m, o);
  } else {
    o->found.Add({"derived-kind", m, -1, -1,
                  "derived weight is " + WeightKindName(dw->kind) + ", not NVFP4 or X4T", {}});
  }
  return absl::OkStatus();
}

// The tensor names that belong to the quantized modules `mods`.
std::set<std::string> TensorsOfModules(const Checkpoint& c, const std::vector<std::string>& mods) {
  std::set<std::string> out;
  for (const std::string& m : mods) {
    for (std::string& t : ModuleTensorNames(c, m)) out.insert(std::move(t));
  }
  return out;
}

// Compressed-tensors: one unit per module present on both sides.
void AddModuleUnits(const Checkpoint& source, const Checkpoint& derived, PairPlan* plan,
                    std::set<std::string>* src_q, std::set<std::string>* dst_q) {
  const std::vector<std::string> src_mods = PackedModules(source);
  const std::vector<std::string> dst_mods = PackedModules(derived);
  const std::set<std::string> dst_mod_set(dst_mods.begin(), dst_mods.end());
  const std::set<std::string> src_mod_set(src_mods.begin(), src_mods.end());
  *src_q = TensorsOfModules(source, src_mods);
  *dst_q = TensorsOfModules(derived, dst_mods);
  for (const std::string& m : src_mods) {
    if (dst_mod_set.count(m)) {
      plan->units.push_back({m, true, ModuleTensorNames(source, m), ModuleTensorNames(derived, m),
                             source.Find(PackedTensorOf(source, m))->info->num_bytes()});
    } else {
      plan->result.mismatches.Add({"missing-tensor", PackedTensorOf(source, m), -1, -1,
                                   "quantized in the source, absent from the derived checkpoint",
                                   {}});
    }
  }
  for (const std::string& m : dst_mods) {
    if (!src_mod_set.count(m)) {
      plan->result.mismatches.Add({"extra-tensor", PackedTensorOf(derived, m), -1, -1,
                                   "in the derived checkpoint only", {}});
    }
  }
}

// gpt-oss: one unit per stacked expert tensor, its derived tensors whichever exist (the unit
// reports the missing ones); every other tensor is compared by digest.
void AddGptOssUnits(const Checkpoint& source, const Checkpoint& derived, PairPlan* plan,
                    std::set<std::string>* src_q, std::set<std::string>* dst_q) {
  for (const std::string& base : GptOssExpertBases(source)) {
    std::vector<std::string> a;
    for (const std::string& n : GptOssSourceTensors(base)) {
      if (source.Find(n)) a.push_back(n);
    }
    const std::vector<std::string> b = GptOssDerivedTensors(derived, base);
    src_q->insert(a.begin(), a.end());
    dst_q->insert(b.begin(), b.end());
    plan->units.push_back({base, true, a, b, source.Find(base + "_blocks")->info->num_bytes(),
                           true});
  }
}

// A gpt-oss source pairs with a ModelOpt export only. Until ModelOpt is a detected format its
// contract findings come from the unit comparison (gpt_oss_pair.h).
absl::Status CheckGptOssDerived(const Checkpoint& derived, const FormatReport& dst_format,
                                PairVerifyResult* result) {
  if (!DeclaresModelOpt(derived)) {
    return absl::InvalidArgumentError(absl::StrCat(derived.root(), ": derived is ",
                                                   result->derived_format,
                                                   ", not a ModelOpt NVFP4 export of gpt-oss"));
  }
  if (dst_format.format == QuantFormat::kUnknown) {
    result->derived_format = "modelopt nvfp4 (gpt-oss experts)";
  } else {
    result->mismatches.Merge(dst_format.findings, "derived:");
    result->warnings.Merge(dst_format.warnings, "derived:");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PairPlan> PlanPair(const Checkpoint& source, const Checkpoint& derived,
                                  const PairVerifyOptions& options) {
  PairPlan plan;
  PairVerifyResult& result = plan.result;
  result.mismatches = FindingList(options.max_findings);
  result.hazards = FindingList(options.max_findings);
  result.warnings = FindingList(options.max_findings);
  // The two detections are independent and serial inside; run them side by side.
  FormatReport src_format;
  std::thread detect_source([&] { src_format = DetectFormat(source, options.format); });
  const FormatReport dst_format = DetectFormat(derived, options.format);
  detect_source.join();
  result.source_format = src_format.Describe();
  result.derived_format = dst_format.Describe();
  result.mismatches.Merge(src_format.findings, "source:");
  result.warnings.Merge(src_format.warnings, "source:");
  const bool gpt_oss = src_format.format == QuantFormat::kGptOssMxfp4;
  if (gpt_oss) {
    if (absl::Status s = CheckGptOssDerived(derived, dst_format, &result); !s.ok()) return s;
  } else if (src_format.format != QuantFormat::kCompressedTensorsMxfp4) {
    return absl::InvalidArgumentError(absl::StrCat(source.root(), ": source is ",
                                                   result.source_format,
                                                   ", not compressed-tensors or gpt-oss MXFP4"));
  } else if (dst_format.format != QuantFormat::kCompressedTensorsNvfp4 &&
             dst_format.format != QuantFormat::kModelOptNvfp4 &&
             dst_format.format != QuantFormat::kX4TContainerB) {
    return absl::InvalidArgumentError(absl::StrCat(
        derived.root(), ": derived is ", result.derived_format, ", not NVFP4 or X4T"));
  } else {
    result.mismatches.Merge(dst_format.findings, "derived:");
    result.warnings.Merge(dst_format.warnings, "derived:");
  }
  std::set<std::string> src_q, dst_q;
  if (gpt_oss) {
    AddGptOssUnits(source, derived, &plan, &src_q, &dst_q);
  } else {
    AddModuleUnits(source, derived, &plan, &src_q, &dst_q);
  }
  // Non-quantized tensors present on both sides.
  const std::vector<std::string> src_names = source.TensorNames();
  const std::vector<std::string> dst_names = derived.TensorNames();
  const std::set<std::string> dst_name_set(dst_names.begin(), dst_names.end());
  const std::set<std::string> src_name_set(src_names.begin(), src_names.end());
  for (const std::string& n : src_names) {
    if (src_q.count(n)) continue;
    if (dst_name_set.count(n) && !dst_q.count(n)) {
      plan.units.push_back({n, false, {n}, {n}, source.Find(n)->info->num_bytes()});
    } else {
      result.mismatches.Add({"missing-tensor", n, -1, -1, "absent from the derived checkpoint", {}});
    }
  }
  for (const std::string& n : dst_names) {
    if (!dst_q.count(n) && !src_name_set.count(n)) {
      result.mismatches.Add({"extra-tensor", n, -1, -1, "in the derived checkpoint only", {}});
    }
  }
  return plan;
}

absl::StatusOr<PairUnitOutcome> CompareUnit(const Checkpoint& source, const Checkpoint& derived,
                                            const PairUnit& unit,
                                            const PairVerifyOptions& options) {
  if (!unit.module) {
    return CompareDigests(source, derived, unit, Sha256Of(source.Find(unit.name)->bytes()),
                          Sha256Of(derived.Find(unit.name)->bytes()), options);
  }
  PairUnitOutcome o;
  o.found = FindingList(options.max_findings);
  absl::Status s = unit.gpt_oss ? CompareGptOssUnit(source, derived, unit, &o)
                                : CompareModule(source, derived, unit.name, &o);
  if (!s.ok()) return s;
  return o;
}

PairUnitOutcome CompareDigests(const Checkpoint& source, const Checkpoint& derived,
                               const PairUnit& unit, const Digest& source_sha256,
                               const Digest& derived_sha256, const PairVerifyOptions& options) {
  PairUnitOutcome o;
  o.found = FindingList(options.max_findings);
  const TensorInfo& a = *source.Find(unit.name)->info;
  const TensorInfo& b = *derived.Find(unit.name)->info;
  if (a.dtype != b.dtype || a.shape != b.shape) {
    o.found.Add({"ignored-tensor-differs", unit.name, -1, -1, "dtype or shape differs", {}});
    return o;
  }
  if (source_sha256 != derived_sha256) {
    o.found.Add({"ignored-tensor-differs", unit.name, -1, -1,
                 "sha256 " + ToHex(source_sha256) + " (source) != " + ToHex(derived_sha256) +
                     " (derived)", {}});
  }
  o.ignored_bytes = a.num_bytes();
  return o;
}

namespace {

// The largest byte b counted in `hist` with b >= `from` (E8M0 0xFF, NaN, excluded when
// `skip_nan`), or -1.
int MaxByte(const std::array<uint64_t, 256>& hist, int from, bool skip_nan) {
  for (int b = skip_nan ? 254 : 255; b >= from; --b) {
    if (hist[b]) return b;
  }
  return -1;
}

// Window counts and ModelOpt-cast hazards of the source (PairWindowCount). Fused modules
// (w1/w3) share k_max, as our transcode and ModelOpt's DeepSeek-V4 / Kimi-K3 casts do.
void AddWindows(const PairPlan& plan, const std::vector<PairUnitOutcome>& outcomes,
                PairVerifyResult* result) {
  constexpr int kSpan = 17;  // E4M3 holds 2^k exactly for k in [-9, 8]
  std::map<std::string, std::pair<int, int>> group_kmax;  // fused group -> (active, modelopt)
  // Per fused group: (module, its own ModelOpt-rule k_max, derived global bits).
  struct Member {
    std::string module;
    int kmax;
    std::optional<uint32_t> global;
  };
  std::map<std::string, std::vector<Member>> per_tensor_mo;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (!plan.units[i].module) continue;
    const PairUnitOutcome& o = outcomes[i];
    const std::string group = FusedGroupOf(plan.units[i].name);
    const int active = MaxByte(o.active_bytes, 0, true);
    const int mo = std::max(MaxByte(o.active_bytes, 1, false), MaxByte(o.zero_bytes, 1, false));
    auto [it, fresh] = group_kmax.emplace(group, std::make_pair(active, mo));
    it->second = {std::max(it->second.first, active), std::max(it->second.second, mo)};
    per_tensor_mo[group].push_back({plan.units[i].name, mo, o.global_bits});
  }
  for (size_t i = 0; i < outcomes.size(); ++i) {
    if (!plan.units[i].module) continue;
    const PairUnitOutcome& o = outcomes[i];
    const std::string& m = plan.units[i].name;
    const auto [active, mo] = group_kmax[FusedGroupOf(m)];
    PairWindowCount w;
    w.tensor = m;
    if (active >= 0) w.k_max_active = E8M0Exponent(active);
    if (mo >= 0) w.k_max_modelopt = E8M0Exponent(mo);
    uint64_t zero_above = 0;
    int zero_max = -1;
    for (int b = 0; b < 256; ++b) {
      const uint64_t n = o.active_bytes[b] + o.zero_bytes[b];
      w.blocks += 2 * n;
      w.lossless_window += 2 * o.zero_bytes[b];
      if (b != kE8M0NaN && active >= 0 && active - b <= kSpan) w.lossless_window += 2 * o.active_bytes[b];
      if (b == 0 || (mo >= 0 && mo - b <= kSpan)) w.modelopt_rule += 2 * n;
      if (b > 0 && b > active && o.zero_bytes[b]) {
        zero_above += o.zero_bytes[b];
        zero_max = b;
      }
    }
    const std::map<std::string, int64_t> k = {{"k_max_active", w.k_max_active.value_or(0)},
                                              {"k_max_modelopt", w.k_max_modelopt.value_or(0)}};
    if (zero_above > 0) {
      Finding f{"zero-group-scale-sets-kmax", m, -1, -1,
                absl::StrCat(zero_above, " all-zero group(s) carry a scale byte above every "
                             "active group's (largest ", zero_max, "); a k_max that skips only "
                             "byte 0 takes it"), k};
      f.numbers["groups"] = static_cast<int64_t>(zero_above);
      f.numbers["byte"] = zero_max;
      result->hazards.Add(std::move(f));
    }
    if (w.modelopt_rule < w.blocks) {
      Finding f{"modelopt-kmax-lossy-blocks", m, -1, -1,
                absl::StrCat(w.blocks - w.modelopt_rule, " of ", w.blocks, " blocks fall outside "
                             "ModelOpt's k_max - k <= 17 and would be requantized"), k};
      f.numbers["blocks_out_of_range"] = static_cast<int64_t>(w.blocks - w.modelopt_rule);
      result->hazards.Add(std::move(f));
    }
    result->windows.push_back(std::move(w));
  }
  // Relevant only where the derived w1/w3 globals differ: the cast took each tensor's own
  // k_max instead of sharing one, and vLLM will load w3 with w1's global.
  for (const auto& [group, members] : per_tensor_mo) {
    if (members.size() < 2 || !absl::EndsWith(group, ".w13")) continue;
    const Member& a = members[0];
    for (const Member& b : members) {
      if (b.kmax == a.kmax || !a.global || !b.global || *a.global == *b.global) continue;
      result->hazards.Add({"fused-kmax-not-shared", group, -1, -1,
                           absl::StrCat(a.module, " and ", b.module, " have different k_max (",
                                        E8M0Exponent(a.kmax), ", ", E8M0Exponent(b.kmax),
                                        ") and the derived globals differ: the cast did not share "
                                        "k_max, and vLLM loads w3 with w1's global"), {}});
      break;
    }
  }
}

}  // namespace

PairVerifyResult FinishPair(PairPlan plan, const std::vector<PairUnitOutcome>& outcomes) {
  AddWindows(plan, outcomes, &plan.result);
  PairVerifyResult result = std::move(plan.result);
  std::set<std::string> kinds;
  std::map<std::string, std::vector<std::pair<std::string, uint32_t>>> fused;
  for (size_t i = 0; i < outcomes.size(); ++i) {
    const PairUnitOutcome& o = outcomes[i];
    result.mismatches.Merge(o.found);
    result.packed_bytes_compared += o.packed_bytes;
    result.value_blocks_compared += o.value_blocks;
    result.zero_groups_canonicalized += o.zero_canonicalized;
    result.ignored_bytes_compared += o.ignored_bytes;
    if (plan.units[i].module) {
      ++result.quantized_tensors;
      kinds.insert(o.global_bits ? "nvfp4" : "x4t");
      if (o.global_bits) {
        fused[FusedGroupOf(plan.units[i].name)].push_back({plan.units[i].name, *o.global_bits});
      }
    } else {
      ++result.ignored_tensors_compared;
    }
  }
  for (const auto& [group, members] : fused) {
    if (members.size() < 2) continue;
    ++result.fused_groups_checked;
    for (const auto& [m, bits] : members) {
      if (bits != members[0].second) {
        result.mismatches.Add({"fused-global-scale-differs", group, -1, -1,
                               m + " and " + members[0].first + " have different global scales "
                               "(vLLM would load both with one of them)", {}});
        break;
      }
    }
  }
  result.derived_kind = kinds.size() == 1 ? *kinds.begin() : kinds.empty() ? "none" : "mixed";
  result.lossless = result.mismatches.total() == 0;
  return result;
}

absl::StatusOr<PairVerifyResult> VerifyPair(const Checkpoint& source, const Checkpoint& derived,
                                            const PairVerifyOptions& options, Progress& progress) {
  absl::StatusOr<PairPlan> plan = PlanPair(source, derived, options);
  if (!plan.ok()) return plan.status();
  uint64_t total = 0;
  for (const PairUnit& u : plan->units) total += u.bytes;
  progress.Begin("verify-pair", total);
  std::vector<PairUnitOutcome> outcomes(plan->units.size());
  absl::Status st = ParallelFor(outcomes.size(), options.threads, [&](size_t i) {
    absl::StatusOr<PairUnitOutcome> o = CompareUnit(source, derived, plan->units[i], options);
    if (!o.ok()) return o.status();
    outcomes[i] = *std::move(o);
    progress.Advance(plan->units[i].bytes);
    return absl::OkStatus();
  });
  progress.End();
  if (!st.ok()) return st;
  PairVerifyResult result = FinishPair(*std::move(plan), outcomes);
  if (absl::Status s = source.CheckUnchanged(); !s.ok()) return s;
  if (absl::Status s = derived.CheckUnchanged(); !s.ok()) return s;
  return result;
}

}  // namespace ckpt::quant
