#include "core/quant/quant_weight.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ckpt::quant {
namespace {

absl::Status Bad(const std::string& tensor, const TensorInfo& t, const std::string& want) {
  return absl::InvalidArgumentError(absl::StrCat(tensor, ": ", DTypeName(t.dtype), " ",
                                                 ShapeText(t.shape), ", expected ", want));
}

// Whether the X4T container declares the group-major w2 layout (manifest or shard metadata).
bool DeclaresW2GroupMajor(const Checkpoint& ckpt, const TensorRef& packed) {
  const nlohmann::json& m = ckpt.manifest();
  if (m.is_object() && m.value("w2_packed_layout", "") == kW2GroupMajorLayout) return true;
  auto it = packed.file->metadata().find("w2_packed_layout");
  return it != packed.file->metadata().end() && it->second == kW2GroupMajorLayout;
}

}  // namespace

std::string WeightKindName(WeightKind kind) {
  switch (kind) {
    case WeightKind::kMxfp4: return "mxfp4";
    case WeightKind::kNvfp4: return "nvfp4";
    case WeightKind::kX4T: return "x4t";
    case WeightKind::kPlain: return "plain";
  }
  return "?";
}

std::vector<std::string> PackedModules(const Checkpoint& ckpt) {
  std::vector<std::string> out;
  for (const std::string& name : ckpt.TensorNames()) {
    if (absl::EndsWith(name, kPackedSuffix)) {
      out.push_back(name.substr(0, name.size() - strlen(kPackedSuffix)));
    } else if (absl::EndsWith(name, kModelOptWeightSuffix) &&
               ckpt.Find(name)->info->dtype == DType::kU8) {
      const std::string m = name.substr(0, name.size() - strlen(kModelOptWeightSuffix));
      if (!ckpt.Find(m + kPackedSuffix)) out.push_back(m);
    }
  }
  return out;
}

std::string PackedTensorOf(const Checkpoint& ckpt, const std::string& module) {
  return ckpt.Find(module + kPackedSuffix) ? module + kPackedSuffix
                                           : module + kModelOptWeightSuffix;
}

std::vector<std::string> ModuleTensorNames(const Checkpoint& ckpt, const std::string& module) {
  std::vector<std::string> out;
  const bool modelopt = !ckpt.Find(module + kPackedSuffix);
  for (const char* suffix :
       {kPackedSuffix, kScaleSuffix, kGlobalScaleSuffix, kInputGlobalScaleSuffix,
        kModelOptGlobalSuffix, kModelOptInputScaleSuffix, kX4TFixedSuffix, kX4TExceptionsSuffix}) {
    if (ckpt.Find(module + suffix)) out.push_back(module + suffix);
  }
  if (modelopt && ckpt.Find(module + kModelOptWeightSuffix)) {
    out.push_back(module + kModelOptWeightSuffix);
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::StatusOr<float> ReadScalarF32(const TensorRef& t) {
  if (t.info->dtype != DType::kF32 || t.info->num_elements() != 1 || t.info->shape.size() > 1) {
    return Bad(t.info->name, *t.info, "F32 [] or [1]");
  }
  if (t.bytes().size() != 4) {
    return absl::FailedPreconditionError(
        absl::StrCat(t.file->path(), ": tensor '", t.info->name, "': bytes were not read"));
  }
  float f;
  std::memcpy(&f, t.bytes().data(), 4);
  return f;
}

namespace {

// ModelOpt NVFP4 (docs/formats.md §9): `packed` is the U8 `M.weight`.
absl::StatusOr<QuantWeight> ResolveModelOpt(const Checkpoint& ckpt, QuantWeight w,
                                            const TensorRef& packed) {
  const std::string& m = w.module;
  const TensorInfo& p = *packed.info;
  if (p.shape.size() != 2) return Bad(p.name, p, "U8 [out, in/2] (ModelOpt NVFP4)");
  w.kind = WeightKind::kNvfp4;
  w.global_role = GlobalRole::kMultiplier;
  w.packed = packed;
  w.rows = p.shape[0];
  w.cols = p.shape[1] * 2;
  std::optional<TensorRef> scale = ckpt.Find(m + kScaleSuffix);
  if (!scale) {
    return absl::InvalidArgumentError(
        absl::StrCat(m, kScaleSuffix, ": missing (", p.name, " is U8, so ModelOpt NVFP4)"));
  }
  const TensorInfo& s = *scale->info;
  if (s.dtype != DType::kF8_E4M3 || s.shape != std::vector<uint64_t>{w.rows, w.cols / 16} ||
      w.cols % 16 != 0) {
    return Bad(s.name, s, absl::StrCat("F8_E4M3 [", w.rows, ", ", w.cols / 16, "] (group 16)"));
  }
  w.scale = *scale;
  w.global_scale = ckpt.Find(m + kModelOptGlobalSuffix);
  if (!w.global_scale) {
    return absl::InvalidArgumentError(absl::StrCat(m, kModelOptGlobalSuffix, ": missing"));
  }
  w.input_global_scale = ckpt.Find(m + kModelOptInputScaleSuffix);
  for (const std::optional<TensorRef>& t : {w.global_scale, w.input_global_scale}) {
    if (t && (t->info->dtype != DType::kF32 || t->info->shape.size() > 1 ||
              t->info->num_elements() != 1)) {
      return Bad(t->info->name, *t->info, "F32 [] or [1]");
    }
  }
  return w;
}

}  // namespace

absl::StatusOr<QuantWeight> ResolveWeight(const Checkpoint& ckpt, const std::string& module) {
  QuantWeight w;
  w.module = module;
  std::optional<TensorRef> packed = ckpt.Find(module + kPackedSuffix);
  if (!packed) {
    std::optional<TensorRef> plain = ckpt.Find(module + kModelOptWeightSuffix);
    if (plain && plain->info->dtype == DType::kU8) return ResolveModelOpt(ckpt, w, *plain);
    if (!plain) plain = ckpt.Find(module);
    if (!plain) return absl::NotFoundError(absl::StrCat(module, ": no such weight"));
    const TensorInfo& t = *plain->info;
    if (t.shape.size() != 2 ||
        (t.dtype != DType::kBF16 && t.dtype != DType::kF16 && t.dtype != DType::kF32)) {
      return Bad(t.name, t, "BF16, F16 or F32 [out, in]");
    }
    w.packed = *plain;
    w.rows = t.shape[0];
    w.cols = t.shape[1];
    return w;
  }
  w.packed = *packed;
  const TensorInfo& p = *packed->info;
  const std::string pname = module + kPackedSuffix;
  if (p.dtype != DType::kU8 || (p.shape.size() != 2 && p.shape.size() != 3)) {
    return Bad(pname, p, "U8 [out, in/2]");
  }
  if (std::optional<TensorRef> fixed = ckpt.Find(module + kX4TFixedSuffix)) {
    std::optional<TensorRef> exc = ckpt.Find(module + kX4TExceptionsSuffix);
    if (!exc) {
      return absl::InvalidArgumentError(absl::StrCat(module, kX4TExceptionsSuffix, ": missing"));
    }
    w.kind = WeightKind::kX4T;
    w.x4t_fixed = *fixed;
    w.x4t_exceptions = *exc;
    if (fixed->info->dtype != DType::kU8 || fixed->info->shape.size() != 1) {
      return Bad(fixed->info->name, *fixed->info, "U8 [fixed bytes]");
    }
    if (exc->info->dtype != DType::kU32 || exc->info->shape.size() != 1) {
      return Bad(exc->info->name, *exc->info, "U32 [count]");
    }
    w.w2_group_major = DeclaresW2GroupMajor(ckpt, *packed) && absl::EndsWith(module, ".w2");
    if (w.w2_group_major) {
      if (p.shape.size() != 3 || p.shape[2] != 16) return Bad(pname, p, "U8 [in/32, out, 16]");
      w.rows = p.shape[1];
      w.cols = p.shape[0] * 32;
    } else {
      if (p.shape.size() != 2) return Bad(pname, p, "U8 [out, in/2]");
      w.rows = p.shape[0];
      w.cols = p.shape[1] * 2;
    }
    return w;
  }
  if (p.shape.size() != 2) return Bad(pname, p, "U8 [out, in/2]");
  w.rows = p.shape[0];
  w.cols = p.shape[1] * 2;
  std::optional<TensorRef> scale = ckpt.Find(module + kScaleSuffix);
  if (!scale) {
    return absl::InvalidArgumentError(absl::StrCat(module, kScaleSuffix, ": missing"));
  }
  w.scale = *scale;
  const TensorInfo& s = *scale->info;
  const std::string sname = module + kScaleSuffix;
  if (s.dtype == DType::kU8 || s.dtype == DType::kF8_E8M0) {
    w.kind = WeightKind::kMxfp4;
    if (s.shape != std::vector<uint64_t>{w.rows, w.cols / 32} || w.cols % 32 != 0) {
      return Bad(sname, s, absl::StrCat("E8M0 [", w.rows, ", ", w.cols / 32, "] (group 32)"));
    }
  } else if (s.dtype == DType::kF8_E4M3) {
    w.kind = WeightKind::kNvfp4;
    if (s.shape != std::vector<uint64_t>{w.rows, w.cols / 16} || w.cols % 16 != 0) {
      return Bad(sname, s, absl::StrCat("F8_E4M3 [", w.rows, ", ", w.cols / 16, "] (group 16)"));
    }
    w.global_scale = ckpt.Find(module + kGlobalScaleSuffix);
    if (!w.global_scale) {
      return absl::InvalidArgumentError(absl::StrCat(module, kGlobalScaleSuffix, ": missing"));
    }
    w.input_global_scale = ckpt.Find(module + kInputGlobalScaleSuffix);
  } else {
    return Bad(sname, s, "U8/F8_E8M0 (MXFP4) or F8_E4M3 (NVFP4)");
  }
  return w;
}

absl::StatusOr<Mxfp4View> Mxfp4ViewOf(const QuantWeight& w) {
  if (w.kind != WeightKind::kMxfp4) {
    return absl::InvalidArgumentError(absl::StrCat(w.module, ": not an MXFP4 weight"));
  }
  return Mxfp4View::Make(w.module, w.packed.bytes(), w.scale.bytes(), w.rows, w.cols);
}

absl::StatusOr<Nvfp4View> Nvfp4ViewOf(const QuantWeight& w) {
  if (w.kind != WeightKind::kNvfp4) {
    return absl::InvalidArgumentError(absl::StrCat(w.module, ": not an NVFP4 weight"));
  }
  absl::StatusOr<float> global = ReadScalarF32(*w.global_scale);
  if (!global.ok()) return global.status();
  return Nvfp4View::Make(w.module, w.packed.bytes(), w.scale.bytes(), {*global, w.global_role},
                         w.rows, w.cols);
}

}  // namespace ckpt::quant
