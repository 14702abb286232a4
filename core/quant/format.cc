#include "core/quant/format.h"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/quant/quant_weight.h"
#include "core/quant/x4t_codec.h"
#include "core/quant/x4t_sidecar.h"

namespace ckpt::quant {
namespace {

using nlohmann::json;

void Add(FormatReport* r, std::string code, std::string tensor, std::string message) {
  r->findings.Add({std::move(code), std::move(tensor), -1, -1, std::move(message), {}});
}

// A compressed-tensors target/ignore entry: "re:<regex>" matched from the start of the module
// name (Python re.match), or an exact module name.
class NamePattern {
 public:
  explicit NamePattern(const std::string& spec) : spec_(spec) {
    if (absl::StartsWith(spec, "re:")) {
      try {
        re_ = std::regex("^(?:" + spec.substr(3) + ")");
        is_re_ = true;
      } catch (const std::regex_error&) {
        valid_ = false;
      }
    }
  }
  bool valid() const { return valid_; }
  const std::string& spec() const { return spec_; }
  bool Matches(const std::string& module) const {
    return is_re_ ? std::regex_search(module, re_) : module == spec_;
  }

 private:
  std::string spec_;
  std::regex re_;
  bool is_re_ = false, valid_ = true;
};

std::vector<NamePattern> Patterns(const json& list, const std::string& what, FormatReport* r) {
  std::vector<NamePattern> out;
  if (!list.is_array()) return out;
  for (const json& e : list) {
    if (!e.is_string()) continue;
    NamePattern p(e.get<std::string>());
    if (!p.valid()) Add(r, "bad-pattern", "", what + " entry '" + p.spec() + "' is not a regex");
    else out.push_back(std::move(p));
  }
  return out;
}

bool AnyMatch(const std::vector<NamePattern>& ps, const std::string& m) {
  for (const NamePattern& p : ps) {
    if (p.Matches(m)) return true;
  }
  return false;
}

std::string ShapeString(const std::vector<uint64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) absl::StrAppend(&out, i ? ", " : "", s[i]);
  return out + "]";
}

// Expected [out, in] of a routed-expert matrix from the text config, if it has the numbers.
std::optional<std::pair<uint64_t, uint64_t>> ExpertGeometry(const json& tc, const std::string& w) {
  const uint64_t inter = tc.value("moe_intermediate_size", uint64_t{0});
  const uint64_t in = tc.value("moe_latent_size", tc.value("hidden_size", uint64_t{0}));
  if (inter == 0 || in == 0) return std::nullopt;
  if (w == "w2") return std::make_pair(in, inter);
  return std::make_pair(inter, in);
}

// Routed-expert geometry and completeness: every MoE layer holds experts 0..E-1 x w1/w2/w3.
void CheckExperts(const Checkpoint& ckpt, const std::vector<std::string>& modules,
                  FormatReport* r) {
  const json& tc = ckpt.text_config();
  static const std::regex kExpertRe(R"(^(.*layers\.(\d+)\..*experts\.)(\d+)\.(w[123])$)");
  const uint64_t experts = tc.value("n_routed_experts", uint64_t{0});
  std::map<std::string, std::set<std::string>> seen;  // layer prefix -> "E.wN"
  for (const std::string& m : modules) {
    std::smatch mt;
    if (!std::regex_match(m, mt, kExpertRe)) continue;
    seen[mt[1]].insert(std::string(mt[3]) + "." + std::string(mt[4]));
    if (experts && std::stoull(mt[3]) >= experts) {
      Add(r, "geometry", m, absl::StrCat("expert index beyond n_routed_experts = ", experts));
    }
    absl::StatusOr<QuantWeight> w = ResolveWeight(ckpt, m);
    auto want = ExpertGeometry(tc, mt[4]);
    if (w.ok() && want && (w->rows != want->first || w->cols != want->second)) {
      Add(r, "geometry", m, absl::StrCat("[", w->rows, ", ", w->cols, "], config says [",
                                         want->first, ", ", want->second, "]"));
    }
  }
  for (const auto& [prefix, have] : seen) {
    for (uint64_t e = 0; e < experts; ++e) {
      for (const char* w : {"w1", "w2", "w3"}) {
        if (!have.count(absl::StrCat(e, ".", w))) {
          Add(r, "missing-tensor", absl::StrCat(prefix, e, ".", w), "routed expert matrix absent");
        }
      }
    }
  }
}

// Per-module tensor contract for compressed-tensors formats.
void CheckCompressedTensors(const Checkpoint& ckpt, const json& q, bool nvfp4, FormatReport* r) {
  r->group_size = nvfp4 ? 16 : 32;
  std::vector<NamePattern> targets, ignore = Patterns(q.value("ignore", json()), "ignore", r);
  bool w4a4 = false;
  const json groups = q.value("config_groups", json::object());
  for (const auto& [name, g] : groups.items()) {
    const json w = g.value("weights", json());
    if (!w.is_object()) {
      Add(r, "config-group", name, "no weights scheme");
      continue;
    }
    if (w.value("num_bits", 0) != 4 || w.value("type", "") != "float") {
      Add(r, "config-group", name, "weights are not 4-bit float");
    }
    if (w.value("group_size", 0) != r->group_size) {
      Add(r, "group-size", name, absl::StrCat("config group_size ", w.value("group_size", 0),
                                             ", format needs ", r->group_size));
    }
    const std::string strategy = w.value("strategy", "");
    if (strategy != (nvfp4 ? "tensor_group" : "group")) {
      Add(r, "config-group", name, "strategy '" + strategy + "'");
    }
    if (g.contains("input_activations") && !g["input_activations"].is_null()) w4a4 = true;
    for (NamePattern& p : Patterns(g.value("targets", json()), "targets", r)) targets.push_back(p);
  }
  if (nvfp4) r->activations = w4a4 ? "W4A4" : "A16";

  const std::vector<std::string> modules = PackedModules(ckpt);
  r->quantized_modules = modules.size();
  std::set<std::string> module_set(modules.begin(), modules.end());
  for (const std::string& m : modules) {
    if (AnyMatch(ignore, m)) Add(r, "ignore-covers-quantized", m, "quantized tensor is in ignore");
    if (!AnyMatch(targets, m)) Add(r, "untargeted-quantized", m, "no config group targets it");
    const std::optional<TensorRef> scale = ckpt.Find(m + kScaleSuffix);
    if (!scale) {
      Add(r, "missing-scale", m + kScaleSuffix, "quantized tensor without weight_scale");
      continue;
    }
    const DType sd = scale->info->dtype;
    const bool scale_ok = nvfp4 ? sd == DType::kF8_E4M3 : (sd == DType::kU8 || sd == DType::kF8_E8M0);
    if (!scale_ok) {
      Add(r, "scale-dtype", m + kScaleSuffix,
          DTypeName(sd) + (nvfp4 ? ", NVFP4 needs F8_E4M3" : ", MXFP4 needs U8/F8_E8M0"));
      continue;
    }
    const std::optional<TensorRef> packed = ckpt.Find(m + kPackedSuffix);
    const std::vector<uint64_t>& ps = packed->info->shape;
    if (packed->info->dtype != DType::kU8 || ps.size() != 2) {
      Add(r, "packed-shape", m + kPackedSuffix, "must be U8 [out, in/2]");
      continue;
    }
    const std::vector<uint64_t> want = {ps[0], ps[1] * 2 / r->group_size};
    if (scale->info->shape != want || (ps[1] * 2) % r->group_size != 0) {
      Add(r, "group-size", m + kScaleSuffix,
          absl::StrCat(ShapeString(scale->info->shape), " does not give one scale per ",
                       r->group_size, " elements of ", ShapeString(ps), " packed"));
    }
    if (nvfp4) {
      std::optional<TensorRef> gs = ckpt.Find(m + kGlobalScaleSuffix);
      if (!gs) Add(r, "missing-global-scale", m + kGlobalScaleSuffix, "NVFP4 needs it");
      else if (gs->info->dtype != DType::kF32 || gs->info->num_elements() != 1)
        Add(r, "global-scale-shape", m + kGlobalScaleSuffix, "must be F32 [1]");
      const bool has_input = ckpt.Find(m + kInputGlobalScaleSuffix).has_value();
      if (w4a4 && !has_input) Add(r, "missing-input-global-scale", m, "W4A4 needs input_global_scale");
      if (!w4a4 && has_input) Add(r, "extra-tensor", m + kInputGlobalScaleSuffix, "A16 checkpoint");
    }
  }
  // Tensors under a quantized module that are not part of its format; unquantized targets.
  const std::set<std::string> allowed = nvfp4
      ? std::set<std::string>{kPackedSuffix, kScaleSuffix, kGlobalScaleSuffix, kInputGlobalScaleSuffix}
      : std::set<std::string>{kPackedSuffix, kScaleSuffix};
  for (const std::string& n : ckpt.TensorNames()) {
    const size_t dot = n.rfind('.');
    if (dot == std::string::npos) continue;
    const std::string module = n.substr(0, dot), suffix = n.substr(dot);
    if (module_set.count(module) && !allowed.count(suffix)) {
      Add(r, "extra-tensor", n, "not part of the " + QuantFormatName(r->format) + " layout");
    } else if (!module_set.count(module) && suffix == ".weight" && AnyMatch(targets, module) &&
               !AnyMatch(ignore, module)) {
      Add(r, "unquantized-target", n, "targeted by a config group but stored unquantized");
    }
  }
  CheckExperts(ckpt, modules, r);
}

void CheckGptOss(const Checkpoint& ckpt, const json& q, FormatReport* r) {
  r->group_size = 32;
  std::vector<NamePattern> skip;
  for (const json& e : q.value("modules_to_not_convert", json::array())) {
    if (e.is_string()) skip.emplace_back(e.get<std::string>());
  }
  for (const std::string& n : ckpt.TensorNames()) {
    if (!absl::EndsWith(n, "_blocks")) continue;
    ++r->quantized_modules;
    const std::string base = n.substr(0, n.size() - 7);
    const TensorInfo& b = *ckpt.Find(n)->info;
    std::optional<TensorRef> s = ckpt.Find(base + "_scales");
    for (const NamePattern& p : skip) {
      if (absl::StrContains(base, p.spec())) Add(r, "ignore-covers-quantized", n, "in modules_to_not_convert");
    }
    if (!s) {
      Add(r, "missing-scale", base + "_scales", "blocks without scales");
      continue;
    }
    if (b.dtype != DType::kU8 || b.shape.size() != 4 || b.shape[3] != 16) {
      Add(r, "packed-shape", n, "must be U8 [E, rows, in/32, 16]");
    } else if (s->info->shape != std::vector<uint64_t>{b.shape[0], b.shape[1], b.shape[2]}) {
      Add(r, "group-size", base + "_scales", "must be [E, rows, in/32] for the blocks");
    }
    const json& tc = ckpt.text_config();
    const uint64_t e = tc.value("num_local_experts", uint64_t{0});
    const uint64_t h = tc.value("hidden_size", uint64_t{0});
    const uint64_t i = tc.value("intermediate_size", uint64_t{0});
    if (e && h && i && b.shape.size() == 4) {
      const bool gate_up = absl::EndsWith(base, "gate_up_proj");
      const std::vector<uint64_t> want = gate_up ? std::vector<uint64_t>{e, 2 * i, h / 32, 16}
                                                 : std::vector<uint64_t>{e, h, i / 32, 16};
      if (b.shape != want) Add(r, "geometry", n, ShapeString(b.shape) + ", config says " + ShapeString(want));
    }
  }
}

void CheckX4T(const Checkpoint& ckpt, const json& q, const std::string& method,
              const FormatOptions& options, FormatReport* r) {
  r->group_size = 32;
  if (ckpt.layout() != CheckpointLayout::kX4TContainer) {
    Add(r, "layout", "", "X4T quant_method but not a manifest.json + tensors/ container");
  }
  if (!q.contains("format_version") || q["format_version"] != 1) {
    Add(r, "format-version", "", "format_version must be 1");
  }
  const std::string declared = q.value("checkpoint_root", "");
  if (declared.empty() || declared[0] != '/') {
    Add(r, "checkpoint-root", "", "checkpoint_root must be an absolute path");
  } else {
    std::string mapped = declared;
    for (const RootMapping& m : options.root_map) {
      if (declared == m.declared || absl::StartsWith(declared, m.declared + "/")) {
        mapped = m.actual + declared.substr(m.declared.size());
        break;
      }
    }
    char buf[PATH_MAX];
    // A path that does not resolve here never matches (docs/daemon.md "Semantics").
    const std::string real = ::realpath(mapped.c_str(), buf) ? std::string(buf) : "";
    if (real != ckpt.root()) {
      Add(r, "checkpoint-root-mismatch", "",
          "checkpoint_root '" + declared + "' (as mapped: '" + mapped + "') is not the mounted root '" +
              ckpt.root() + "'; map it with --map-root " + declared + "=" + ckpt.root());
    }
  }
  const bool kimi = method == "kimi_x4t";
  if (kimi && !(ckpt.config().contains("text_config") &&
                ckpt.config()["text_config"].contains("quantization_config"))) {
    Add(r, "config-disagreement", "", "kimi_x4t must repeat quantization_config in text_config");
  }
  // manifest.json and build-contract.json both carry schema, codec and family.
  json contract;
  if (auto bytes = ckpt.image().Content("build-contract.json"); bytes.ok()) {
    absl::StatusOr<json> c = ParseJsonDocument(*bytes, ckpt.root() + "/build-contract.json");
    if (c.ok()) contract = *std::move(c);
  }
  for (const auto& [file, doc] : {std::pair<std::string, const json*>{"manifest", &ckpt.manifest()},
                                  {"build-contract", &contract}}) {
    const auto expect = [&](const char* key, const std::string& want) {
      const std::string got = doc->is_object() ? doc->value(key, "") : "";
      if (got != want) {
        Add(r, absl::StrCat(file, "-", key), file + ".json",
            absl::StrCat(key, " '", got, "', expected '", want, "'"));
      }
    };
    expect("schema", "trellis-exact-mxfp4-checkpoint/1");
    expect("codec", kX4TScaleCodec);
    expect("family", kimi ? "kimi_k3" : "deepseek_v41");
  }
  const std::vector<std::string> modules = PackedModules(ckpt);
  r->quantized_modules = modules.size();
  for (const std::string& m : modules) {
    absl::StatusOr<QuantWeight> w = ResolveWeight(ckpt, m);
    if (!w.ok()) {
      Add(r, "tensor-contract", m, std::string(w.status().message()));
    } else if (w->kind != WeightKind::kX4T) {
      Add(r, "missing-scale", m + kX4TFixedSuffix, "packed weight without an X4T scale stream");
    } else if (w->cols % 32 != 0 || w->rows % 16 != 0 ||
               w->x4t_fixed.info->num_bytes() != X4TFixedStreamBytes(w->rows, w->cols / 32)) {
      Add(r, "x4t-fixed-size", m + kX4TFixedSuffix,
          absl::StrCat(w->x4t_fixed.info->num_bytes(), " bytes for a [", w->rows, ", ",
                       w->cols / 32, "] scale plane"));
    }
  }
  CheckExperts(ckpt, modules, r);
}

// Container A: every `x4t-layer-*.safetensors` at the top of the root (from the same read as
// the checkpoint), checked against its contract.
void CheckSidecars(const Checkpoint& ckpt, FormatReport* r) {
  for (const ImageFile& f : ckpt.image().files) {
    const std::string& n = f.name;
    if (!absl::StartsWith(n, "x4t-layer-") || !absl::EndsWith(n, ".safetensors") ||
        n.find('/') != std::string::npos) {
      continue;
    }
    ++r->x4t_sidecars;
    if (!f.header_status.ok()) {
      Add(r, "sidecar-unreadable", n, std::string(f.header_status.message()));
      continue;
    }
    CheckX4TSidecar(*f.safetensors, ckpt.text_config(), &r->findings);
  }
}

}  // namespace

std::string QuantFormatName(QuantFormat f) {
  switch (f) {
    case QuantFormat::kNone: return "none";
    case QuantFormat::kGptOssMxfp4: return "gpt-oss-mxfp4";
    case QuantFormat::kCompressedTensorsMxfp4: return "compressed-tensors/mxfp4-pack-quantized";
    case QuantFormat::kCompressedTensorsNvfp4: return "compressed-tensors/nvfp4-pack-quantized";
    case QuantFormat::kX4TContainerB: return "x4t-container-b";
    case QuantFormat::kUnknown: return "unknown";
  }
  return "?";
}

absl::StatusOr<RootMapping> ParseRootMapping(const std::string& spec) {
  const size_t eq = spec.find('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 >= spec.size() || spec[0] != '/' ||
      spec[eq + 1] != '/') {
    return absl::InvalidArgumentError("root mapping '" + spec + "' is not /DECLARED=/ACTUAL");
  }
  std::string declared = spec.substr(0, eq), actual = spec.substr(eq + 1);
  while (declared.size() > 1 && declared.back() == '/') declared.pop_back();
  return RootMapping{declared, actual};
}

std::string FormatReport::Describe() const {
  std::string s = QuantFormatName(format);
  if (!activations.empty()) absl::StrAppend(&s, " (", activations == "A16" ? "W4A16" : activations, ")");
  if (x4t_sidecars > 0) absl::StrAppend(&s, " + ", x4t_sidecars, " X4T layer sidecar(s)");
  return s;
}

nlohmann::json FormatReport::ToJson() const {
  return {{"format", QuantFormatName(format)},
          {"description", Describe()},
          {"activations", activations},
          {"group_size", group_size},
          {"quantized_modules", quantized_modules},
          {"x4t_sidecars", x4t_sidecars},
          {"findings", findings.ToJson()}};
}

FormatReport DetectFormat(const Checkpoint& ckpt, const FormatOptions& options) {
  FormatReport r;
  r.findings = FindingList(options.max_findings);
  const json& top = ckpt.config();
  const json* q = nullptr;
  if (top.contains("quantization_config")) q = &top["quantization_config"];
  if (top.contains("text_config") && top["text_config"].is_object() &&
      top["text_config"].contains("quantization_config")) {
    const json& nested = top["text_config"]["quantization_config"];
    if (q && *q != nested) {
      Add(&r, "config-disagreement", "",
          "quantization_config and text_config.quantization_config differ");
    }
    if (!q) q = &nested;
  }
  CheckSidecars(ckpt, &r);
  if (!q || !q->is_object()) {
    if (!PackedModules(ckpt).empty()) {
      r.format = QuantFormat::kUnknown;
      Add(&r, "undeclared-quantization", "", "packed FP4 tensors but no quantization_config");
    }
    return r;
  }
  const std::string method = q->value("quant_method", "");
  const std::string format = q->value("format", "");
  if (method == "mxfp4") {
    r.format = QuantFormat::kGptOssMxfp4;
    CheckGptOss(ckpt, *q, &r);
  } else if (method == "compressed-tensors" && format == "mxfp4-pack-quantized") {
    r.format = QuantFormat::kCompressedTensorsMxfp4;
    CheckCompressedTensors(ckpt, *q, false, &r);
  } else if (method == "compressed-tensors" && format == "nvfp4-pack-quantized") {
    r.format = QuantFormat::kCompressedTensorsNvfp4;
    CheckCompressedTensors(ckpt, *q, true, &r);
  } else if (method == "kimi_x4t" || method == "exact_mxfp4") {
    r.format = QuantFormat::kX4TContainerB;
    CheckX4T(ckpt, *q, method, options, &r);
  } else {
    r.format = QuantFormat::kUnknown;
    Add(&r, "unsupported-format", "", "quant_method '" + method + "' format '" + format + "'");
  }
  return r;
}

}  // namespace ckpt::quant
