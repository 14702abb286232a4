#include "core/quant/format.h"

#include <limits.h>
#include <stdlib.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <regex>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/quant/gpt_oss_layout.h"
#include "core/quant/quant_weight.h"
#include "core/quant/rules.h"
#include "core/quant/scale_window.h"
#include "core/quant/x4t_codec.h"
#include "core/quant/x4t_sidecar.h"

namespace ckpt::quant {
namespace {

using nlohmann::json;

void Add(FormatReport* r, std::string code, std::string tensor, std::string message) {
  const Rule* rule = FindRule(code);
  FindingList& list = rule != nullptr && rule->warning ? r->warnings : r->findings;
  list.Add({std::move(code), std::move(tensor), -1, -1, std::move(message), {}});
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
          absl::StrCat(ShapeText(scale->info->shape), " does not give one scale per ",
                       r->group_size, " elements of ", ShapeText(ps), " packed"));
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

// ---- ModelOpt NVFP4 (docs/formats.md §9; docs/quant.md "ModelOpt NVFP4") ----

// Python's fnmatch.fnmatchcase, which vLLM applies to ModelOpt's exclude lists: `*` any run
// (dots included), `?` one character, `[seq]` / `[!seq]` a class with `a-z` ranges. ModelOpt
// names are matched case-sensitively. Written here rather than POSIX fnmatch(3), whose `*`
// stops at nothing either but whose treatment of an unterminated `[` differs: such patterns
// are refused as invalid (ValidGlob) instead of being matched one way or the other.
size_t MatchClass(std::string_view p, size_t i, char c, bool* hit) {
  size_t j = i + 1;
  bool negate = false;
  if (j < p.size() && p[j] == '!') negate = true, ++j;
  const size_t first = j;
  bool in = false;
  while (j < p.size() && (p[j] != ']' || j == first)) {
    if (j + 2 < p.size() && p[j + 1] == '-' && p[j + 2] != ']') {
      in |= p[j] <= c && c <= p[j + 2];
      j += 3;
    } else {
      in |= p[j] == c;
      ++j;
    }
  }
  if (j >= p.size()) return std::string_view::npos;
  *hit = in != negate;
  return j + 1;
}

bool ValidGlob(std::string_view p) {
  if (p.empty()) return false;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] != '[') continue;
    bool hit;
    const size_t end = MatchClass(p, i, '\0', &hit);
    if (end == std::string_view::npos) return false;
    i = end - 1;
  }
  return true;
}

// Requires ValidGlob(p). Greedy with one backtrack point per `*`: O(|p| * |s|).
bool GlobMatch(std::string_view p, std::string_view s) {
  size_t pi = 0, si = 0, star = std::string_view::npos, mark = 0;
  while (si < s.size()) {
    if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = si;
      continue;
    }
    if (pi < p.size()) {
      if (p[pi] == '?') {
        ++pi, ++si;
        continue;
      }
      if (p[pi] == '[') {
        bool hit = false;
        const size_t end = MatchClass(p, pi, s[si], &hit);
        if (hit) {
          pi = end, ++si;
          continue;
        }
      } else if (p[pi] == s[si]) {
        ++pi, ++si;
        continue;
      }
    }
    if (star == std::string_view::npos) return false;
    pi = star + 1;
    si = ++mark;
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

// The spellings under which the Kimi-K3 ModelOpt manifest may name a module that is stored as
// `actual` (docs/formats.md §9): the stored name, without `language_model.` and without
// `language_model.model.`, each also with `block_sparse_moe` written `mlp`.
std::vector<std::string> AliasSpellings(const std::string& actual) {
  static const std::string kLm = "language_model.", kLmModel = "language_model.model.";
  std::vector<std::string> base = {actual};
  if (absl::StartsWith(actual, kLmModel)) {
    base.push_back(actual.substr(kLm.size()));
    base.push_back(actual.substr(kLmModel.size()));
  } else if (absl::StartsWith(actual, kLm)) {
    base.push_back(actual.substr(kLm.size()));
  }
  std::vector<std::string> out = base;
  for (const std::string& b : base) {
    const size_t at = ("." + b).find(".block_sparse_moe.");
    if (at != std::string::npos) {
      out.push_back(b.substr(0, at) + "mlp" + b.substr(at + std::string("block_sparse_moe").size()));
    }
  }
  return out;
}

bool IsNvfp4Algo(const std::string& a) { return a == "NVFP4" || a == "W4A16_NVFP4"; }

std::string Upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

// One of the two places a ModelOpt checkpoint declares its quantization, normalised.
struct ModelOptDecl {
  std::string where;  // "hf_quant_config.json" | "config.json"
  std::string algo;   // upper-cased quant_algo
  json group_size;    // as written (null when absent)
  json exclude;       // exclude_modules / ignore, as written
  json quantized_layers;
  std::vector<std::string> missing;  // fields vLLM requires of this shape
};

std::optional<ModelOptDecl> FromHfQuantConfig(const json& doc) {
  if (!doc.is_object() || !doc.contains("producer") || !doc["producer"].is_object() ||
      doc["producer"].value("name", "") != "modelopt" || !doc.contains("quantization") ||
      !doc["quantization"].is_object()) {
    return std::nullopt;
  }
  const json& q = doc["quantization"];
  ModelOptDecl d{"hf_quant_config.json", Upper(q.value("quant_algo", "")),
                 q.value("group_size", json()), q.value("exclude_modules", json()),
                 q.value("quantized_layers", json()), {}};
  if (d.algo != "MIXED_PRECISION") {
    for (const char* f : {"group_size", "kv_cache_quant_algo", "exclude_modules"}) {
      if (!q.contains(f)) d.missing.push_back(f);
    }
  }
  return d;
}

ModelOptDecl FromConfigJson(const json& q) {
  // vLLM defaults the config.json shape's group_size to 16 (docs/formats.md §9).
  return ModelOptDecl{"config.json", Upper(q.value("quant_algo", "")),
                      q.value("group_size", json(16)), q.value("ignore", json()),
                      q.value("quantized_layers", json()), {}};
}

// The set of strings of a JSON list (order and duplicates do not matter to a matcher).
std::set<std::string> StringSet(const json& list) {
  std::set<std::string> out;
  if (list.is_array()) {
    for (const json& e : list) out.insert(e.is_string() ? e.get<std::string>() : e.dump());
  }
  return out;
}

void CompareDecls(const ModelOptDecl& a, const ModelOptDecl& b, FormatReport* r) {
  const auto differ = [&](const std::string& field, const std::string& x, const std::string& y) {
    Add(r, "config-disagreement", "",
        absl::StrCat(field, ": ", a.where, " says ", x, ", ", b.where, " says ", y,
                     " (vLLM reads config.json)"));
  };
  if (a.algo != b.algo) differ("quant_algo", a.algo, b.algo);
  if (a.group_size != b.group_size) differ("group_size", a.group_size.dump(), b.group_size.dump());
  if (StringSet(a.exclude) != StringSet(b.exclude)) {
    differ("exclude list", a.exclude.dump(), b.exclude.dump());
  }
  if (a.quantized_layers != b.quantized_layers) {
    differ("quantized_layers", a.quantized_layers.is_null() ? "none" : "a map",
           b.quantized_layers.is_null() ? "none" : "another map");
  }
}

// The tensor contract of one quantized ModelOpt module under algo `algo`.
void CheckModelOptModule(const Checkpoint& ckpt, const std::string& m, const std::string& algo,
                         FormatReport* r) {
  const TensorInfo& p = *ckpt.Find(m + kModelOptWeightSuffix)->info;
  if (p.shape.size() != 2) {
    Add(r, "packed-shape", p.name, ShapeText(p.shape) + ", must be U8 [out, in/2]");
    return;
  }
  const std::optional<TensorRef> scale = ckpt.Find(m + kScaleSuffix);
  if (!scale) {
    Add(r, "missing-scale", m + kScaleSuffix, "U8 weight without its E4M3 block scales");
  } else if (scale->info->dtype != DType::kF8_E4M3) {
    Add(r, "scale-dtype", m + kScaleSuffix, DTypeName(scale->info->dtype) + ", NVFP4 needs F8_E4M3");
  } else if ((p.shape[1] * 2) % 16 != 0 ||
             scale->info->shape != std::vector<uint64_t>{p.shape[0], p.shape[1] * 2 / 16}) {
    Add(r, "group-size", m + kScaleSuffix,
        absl::StrCat(ShapeText(scale->info->shape), " does not give one scale per 16 elements "
                     "of ", ShapeText(p.shape), " packed"));
  }
  const std::optional<TensorRef> global = ckpt.Find(m + kModelOptGlobalSuffix);
  if (!global) {
    const std::string group = FusedGroupOf(m);
    const bool w13 = absl::EndsWith(group, ".w13");
    // The other half of the fused w13: w1 <-> w3, or an expert's gate_proj <-> up_proj.
    const size_t dot = m.rfind('.') + 1;
    const std::string last = m.substr(dot);
    const std::string sibling =
        m.substr(0, dot) + (last == "w1"          ? "w3"
                            : last == "w3"        ? "w1"
                            : last == "gate_proj" ? "up_proj"
                                                  : "gate_proj");
    if (w13 && ckpt.Find(sibling + kModelOptGlobalSuffix)) {
      Add(r, "w13-missing-global-scale", m + kModelOptGlobalSuffix,
          "absent while " + sibling + " has one; vLLM's fused w13 would use w1's for both");
    } else {
      Add(r, "missing-global-scale", m + kModelOptGlobalSuffix, "NVFP4 needs weight_scale_2");
    }
  } else if (global->info->dtype != DType::kF32 || global->info->shape.size() > 1 ||
             global->info->num_elements() != 1) {
    Add(r, "global-scale-shape", m + kModelOptGlobalSuffix,
        DTypeName(global->info->dtype) + " " + ShapeText(global->info->shape) +
            ", must be F32 [] (or [1])");
  }
  const std::optional<TensorRef> input = ckpt.Find(m + kModelOptInputScaleSuffix);
  if (algo == "NVFP4" && !input) {
    Add(r, "missing-input-scale", m + kModelOptInputScaleSuffix, "W4A4 NVFP4 needs input_scale");
  } else if (algo == "W4A16_NVFP4" && input) {
    Add(r, "extra-tensor", m + kModelOptInputScaleSuffix, "W4A16_NVFP4 module has an input_scale");
  } else if (input && (input->info->dtype != DType::kF32 || input->info->shape.size() > 1 ||
                       input->info->num_elements() != 1)) {
    Add(r, "global-scale-shape", m + kModelOptInputScaleSuffix, "must be F32 [] (or [1])");
  }
}

// gpt-oss's stacked experts in ModelOpt's export (docs/formats.md §10): each layer's
// `experts.gate_up_proj` and `experts.down_proj` with their companions, by name, dtype and
// shape from the config's geometry. Returns how many fused tensors it found.
size_t CheckModelOptGptOss(const Checkpoint& ckpt, bool w4a4, FormatReport* r) {
  const absl::StatusOr<gptoss::Dims> d = gptoss::DimsFromConfig(ckpt.text_config());
  if (!d.ok()) return 0;
  size_t found = 0;
  for (const std::string& name : ckpt.TensorNames()) {
    for (const gptoss::Fused f : {gptoss::Fused::kGateUp, gptoss::Fused::kDown}) {
      if (!absl::EndsWith(name, "mlp.experts." + gptoss::FusedName(f))) continue;
      ++found;
      const std::string prefix = name.substr(0, name.size() - gptoss::FusedName(f).size());
      const std::optional<TensorRef> bias = ckpt.Find(name + "_bias");
      for (const gptoss::TensorSpec& want : gptoss::ModelOptTensors(
               prefix, *d, f, w4a4, bias ? bias->info->dtype : DType::kBF16)) {
        const std::string part = want.name.substr(name.size());
        const auto [missing, wrong] =
            part.empty()                ? std::pair{"missing-tensor", "packed-shape"}
            : part == "_weight_scale"   ? std::pair{"missing-scale", "group-size"}
            : part == "_weight_scale_2" ? std::pair{"missing-global-scale", "global-scale-shape"}
            : part == "_input_scale"    ? std::pair{"missing-input-scale", "global-scale-shape"}
                                        : std::pair{"missing-tensor", "tensor-contract"};
        const std::string expected = absl::StrCat(", ModelOpt's gpt-oss export stores ",
                                                  DTypeName(want.dtype), " ",
                                                  ShapeText(want.shape));
        const std::optional<TensorRef> t = ckpt.Find(want.name);
        if (!t) {
          Add(r, missing, want.name, "absent" + expected);
          continue;
        }
        const TensorInfo& i = *t->info;
        const bool fits = i.dtype == want.dtype &&
                          (want.shape.empty() ? i.shape.size() <= 1 && i.num_elements() == 1
                                              : i.shape == want.shape);
        if (!fits) {
          Add(r, wrong, want.name, DTypeName(i.dtype) + " " + ShapeText(i.shape) + expected);
        }
      }
      if (!w4a4 && ckpt.Find(name + "_input_scale")) {
        Add(r, "extra-tensor", name + "_input_scale", "W4A16_NVFP4 module has an input_scale");
      }
    }
  }
  return found;
}

void CheckModelOpt(const Checkpoint& ckpt, const std::optional<ModelOptDecl>& hf,
                   const std::optional<ModelOptDecl>& cfg, FormatReport* r) {
  r->group_size = 16;
  if (hf && cfg) CompareDecls(*hf, *cfg, r);
  const ModelOptDecl& d = cfg ? *cfg : *hf;  // vLLM reads config.json first
  for (const std::string& f : d.missing) {
    Add(r, "config-field-missing", d.where, "quantization." + f + " is required for NVFP4 (vLLM)");
  }
  if (!d.group_size.is_number_integer() || d.group_size.get<int64_t>() != 16) {
    Add(r, "group-size", d.where, "group_size " + d.group_size.dump() + ", NVFP4 needs 16");
  }
  // Every tensor's module, and the spellings that name it.
  std::set<std::string> all_modules;
  for (const std::string& n : ckpt.TensorNames()) {
    const size_t dot = n.rfind('.');
    if (dot != std::string::npos) all_modules.insert(n.substr(0, dot));
  }
  std::map<std::string, std::set<std::string>> by_spelling;
  for (const std::string& m : all_modules) {
    for (std::string& s : AliasSpellings(m)) by_spelling[std::move(s)].insert(m);
  }
  const std::vector<std::string> modules = PackedModules(ckpt);
  const std::set<std::string> quantized(modules.begin(), modules.end());
  r->quantized_modules = modules.size();
  r->quantized_modules += CheckModelOptGptOss(ckpt, d.algo == "NVFP4", r);

  // Per-module algorithm: the checkpoint's, or MIXED_PRECISION's quantized_layers entry.
  std::map<std::string, std::string> algo_of;
  if (d.algo == "MIXED_PRECISION") {
    r->activations = "mixed";
    if (!d.quantized_layers.is_object() || d.quantized_layers.empty()) {
      Add(r, "config-field-missing", d.where, "MIXED_PRECISION needs a non-empty quantized_layers");
    }
    std::map<std::string, std::pair<std::string, json>> entry_of;  // actual -> (spelling, entry)
    std::set<std::string> collided;
    const json layers = d.quantized_layers.is_object() ? d.quantized_layers : json::object();
    for (const auto& [spelling, e] : layers.items()) {
      const std::string algo = e.is_object() ? Upper(e.value("quant_algo", "")) : "";
      if (!IsNvfp4Algo(algo)) {
        Add(r, "unsupported-quant-algo", spelling,
            "quantized_layers entry '" + algo + "': only NVFP4 and W4A16_NVFP4 are checked");
      } else if (e.value("group_size", 16) != 16) {
        Add(r, "group-size", spelling, "quantized_layers group_size, NVFP4 needs 16");
      }
      auto it = by_spelling.find(spelling);
      if (it == by_spelling.end()) {
        Add(r, "quantized-layer-absent", spelling, "names no module of the checkpoint");
        continue;
      }
      if (it->second.size() > 1) {
        Add(r, "alias-ambiguous", spelling,
            absl::StrCat("names ", it->second.size(), " stored modules (",
                         absl::StrJoin(it->second, ", "), "); its entry is applied to none"));
        continue;
      }
      const std::string& actual = *it->second.begin();
      auto [prev, fresh] = entry_of.emplace(actual, std::make_pair(spelling, e));
      if (!fresh && prev->second.second != e) {
        if (collided.insert(actual).second) {
          Add(r, "alias-collision", actual,
              "spellings '" + prev->second.first + "' and '" + spelling + "' give it different "
              "entries");
        }
        continue;
      }
      if (IsNvfp4Algo(algo)) algo_of[actual] = algo;
    }
    for (const std::string& m : modules) {
      if (!entry_of.count(m)) Add(r, "quantized-unlisted", m, "not in quantized_layers");
    }
  } else if (IsNvfp4Algo(d.algo)) {
    r->activations = d.algo == "NVFP4" ? "W4A4" : "A16";
    for (const std::string& m : modules) algo_of[m] = d.algo;
  } else {
    Add(r, "unsupported-quant-algo", d.where, "quant_algo '" + d.algo + "'");
  }
  for (const std::string& m : modules) {
    auto it = algo_of.find(m);
    CheckModelOptModule(ckpt, m, it == algo_of.end() ? "" : it->second, r);
  }

  // The exclude list: valid wildcards, each matching some module (under any spelling) and
  // none that is stored quantized.
  if (!d.exclude.is_null() && !d.exclude.is_array()) {
    Add(r, "bad-pattern", d.where, "exclude list is not a list");
  }
  for (const json& e : d.exclude.is_array() ? d.exclude : json::array()) {
    const std::string pat = e.is_string() ? e.get<std::string>() : "";
    if (!e.is_string() || !ValidGlob(pat)) {
      Add(r, "bad-pattern", d.where, "exclude entry " + e.dump() + " is not a valid wildcard");
      continue;
    }
    bool any = false;
    std::set<std::string> covered;
    for (const auto& [spelling, actual] : by_spelling) {
      if (!GlobMatch(pat, spelling)) continue;
      any = true;
      for (const std::string& m : actual) {
        if (quantized.count(m)) covered.insert(m);
      }
    }
    for (const std::string& m : covered) {
      Add(r, "ignore-covers-quantized", m, "exclude pattern '" + pat + "' matches it");
    }
    if (!any) Add(r, "exclude-matches-nothing", pat, "matches no module of the checkpoint");
  }
  // ModelOpt companions on a module that is not stored quantized.
  for (const std::string& n : ckpt.TensorNames()) {
    const size_t dot = n.rfind('.');
    if (dot == std::string::npos || quantized.count(n.substr(0, dot))) continue;
    if (absl::EndsWith(n, kModelOptGlobalSuffix) ||
        (absl::EndsWith(n, kScaleSuffix) && ckpt.Find(n)->info->dtype == DType::kF8_E4M3)) {
      Add(r, "extra-tensor", n, "NVFP4 scale of a module whose weight is not U8-packed");
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
      if (b.shape != want) Add(r, "geometry", n, ShapeText(b.shape) + ", config says " + ShapeText(want));
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
    case QuantFormat::kModelOptNvfp4: return "modelopt/nvfp4";
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
          {"findings", findings.ToJson()},
          {"warnings", warnings.ToJson()}};
}

FormatReport DetectFormat(const Checkpoint& ckpt, const FormatOptions& options) {
  FormatReport r;
  r.findings = FindingList(options.max_findings);
  r.warnings = FindingList(options.max_findings);
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
  // ModelOpt: config.json's quantization_config (quant_method "modelopt" or "modelopt_mixed")
  // and/or hf_quant_config.json with producer "modelopt"; vLLM reads config.json first.
  std::optional<ModelOptDecl> hf;
  if (ckpt.image().Find("hf_quant_config.json") != nullptr) {
    auto bytes = ckpt.image().Content("hf_quant_config.json");
    absl::StatusOr<json> doc =
        bytes.ok() ? ParseJsonDocument(*bytes, ckpt.root() + "/hf_quant_config.json")
                   : absl::StatusOr<json>(bytes.status());
    if (doc.ok()) hf = FromHfQuantConfig(*doc);
    if (!doc.ok() || !hf) {
      Add(&r, "config-unreadable", "hf_quant_config.json",
          doc.ok() ? "not a ModelOpt quantization file (producer.name != \"modelopt\")"
                   : std::string(doc.status().message()));
    }
  }
  const bool cfg_modelopt = q && q->is_object() &&
                            absl::StartsWith(q->value("quant_method", ""), "modelopt");
  if (cfg_modelopt || (hf && (!q || !q->is_object()))) {
    r.format = QuantFormat::kModelOptNvfp4;
    std::optional<ModelOptDecl> cfg;
    if (cfg_modelopt) cfg = FromConfigJson(*q);
    CheckModelOpt(ckpt, hf, cfg, &r);
    return r;
  }
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
