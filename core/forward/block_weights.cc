#include "core/forward/block_weights.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/quant/codecs.h"
#include "core/quant/fp4_tensor.h"
#include "core/quant/gpt_oss_layout.h"
#include "core/quant/quant_weight.h"
#include "core/quant/x4t_container.h"

namespace ckpt::forward {
namespace {

// Tensor names per family, relative to the block prefix (docs/forward.md mirrors this table).
struct TensorNames {
  const char* block;  // after "model.layers.{L}."
  const char* router;
  const char* router_bias;      // "" when the family has none
  const char* correction_bias;  // ""
  const char* latent_down;      // ""
  const char* latent_up;
  const char* latent_norm;
  const char* shared_gate;      // ""
  const char* shared_up;
  const char* shared_down;
  const char* expert_gate;      // under "experts.{E}."
  const char* expert_up;
  const char* expert_down;
};

constexpr TensorNames kKimiNames = {
    "block_sparse_moe.", "gate.weight", "", "gate.e_score_correction_bias",
    "routed_expert_down_proj.weight", "routed_expert_up_proj.weight",
    "routed_expert_norm.weight", "shared_experts.gate_proj.weight",
    "shared_experts.up_proj.weight", "shared_experts.down_proj.weight", "w1", "w3", "w2"};
constexpr TensorNames kDeepSeekNames = {
    "mlp.", "gate.weight", "", "gate.e_score_correction_bias", "", "", "",
    "shared_experts.gate_proj.weight", "shared_experts.up_proj.weight",
    "shared_experts.down_proj.weight", "gate_proj", "up_proj", "down_proj"};
// gpt-oss experts are stacked tensors in one of two layouts (GptOssTensors below).
constexpr TensorNames kGptOssNames = {"mlp.", "router.weight", "router.bias", "", "", "", "",
                                      "", "", "", "", "", ""};

const TensorNames& NamesFor(BlockFamily f) {
  switch (f) {
    case BlockFamily::kKimiLatent: return kKimiNames;
    case BlockFamily::kDeepSeekV3: return kDeepSeekNames;
    case BlockFamily::kGptOss: return kGptOssNames;
  }
  return kKimiNames;
}

class Loader {
 public:
  Loader(const Checkpoint& ckpt, std::string prefix) : ckpt_(ckpt), prefix_(std::move(prefix)) {}

  absl::StatusOr<TensorRef> Get(const std::string& rel, std::vector<uint64_t> shape) const {
    const std::string name = prefix_ + rel;
    auto t = ckpt_.Find(name);
    if (!t) return absl::NotFoundError(absl::StrCat(ckpt_.root(), ": tensor ", name, " missing"));
    if (t->info->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          t->file->path(), ": tensor ", name, " has shape ", ShapeText(t->info->shape),
          ", expected ", ShapeText(shape)));
    }
    return *t;
  }

  // A BF16 or F32 tensor of `shape`, read in place as a [rows, cols] matrix (DenseMatrix).
  absl::StatusOr<DenseMatrix> View(const std::string& rel, std::vector<uint64_t> shape,
                                   int64_t rows, int64_t cols) const {
    auto t = Get(rel, std::move(shape));
    if (!t.ok()) return t.status();
    const DType d = t->info->dtype;
    if (d != DType::kBF16 && d != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(t->file->path(), ": tensor ", prefix_, rel,
                                                     " has dtype ", DTypeName(d),
                                                     ", expected BF16 or F32"));
    }
    return DenseMatrix{prefix_ + rel, rows, cols, d, t->bytes(), nullptr};
  }

  // A small BF16 or F32 tensor (biases, norms), decoded.
  absl::StatusOr<std::vector<float>> Floats(const std::string& rel,
                                            std::vector<uint64_t> shape) const {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    auto m = View(rel, std::move(shape), 1, static_cast<int64_t>(n));
    if (!m.ok()) return m.status();
    return m->Floats();
  }

  absl::StatusOr<DenseMatrix> Dense(const std::string& rel, int64_t rows, int64_t cols) const {
    return View(rel, {static_cast<uint64_t>(rows), static_cast<uint64_t>(cols)}, rows, cols);
  }

  // An expert matrix `{base}` stored as MXFP4, NVFP4 or X4T (resolved by core/quant).
  absl::StatusOr<Fp4Matrix> Fp4(const std::string& base, int64_t rows, int64_t cols) const {
    Fp4Matrix m;
    m.name = prefix_ + base;
    m.rows = rows;
    m.cols = cols;
    auto q = quant::ResolveWeight(ckpt_, m.name);
    if (!q.ok()) return q.status();
    if (q->rows != static_cast<uint64_t>(rows) || q->cols != static_cast<uint64_t>(cols)) {
      return absl::InvalidArgumentError(absl::StrCat(ckpt_.root(), ": ", m.name, " is [", q->rows,
                                                     ", ", q->cols, "], expected [", rows, ", ",
                                                     cols, "]"));
    }
    switch (q->kind) {
      case quant::WeightKind::kMxfp4:
        m.packed = q->packed.bytes();
        m.scales = q->scale.bytes();
        break;
      case quant::WeightKind::kNvfp4: {
        m.scale_kind = Fp4Scale::kE4M3Group16;
        m.packed = q->packed.bytes();
        m.scales = q->scale.bytes();
        if (!q->global_scale) {
          return absl::InvalidArgumentError(absl::StrCat(m.name, ": NVFP4 without global scale"));
        }
        auto g = quant::ReadScalarF32(*q->global_scale);
        if (!g.ok()) return g.status();
        m.global = {*g, q->global_role};
        break;
      }
      case quant::WeightKind::kX4T: {
        // X4T decodes to the MXFP4 tensors it encodes; the decoded planes are owned here.
        auto x = quant::ReadX4TExpertMatrix(*q);
        if (!x.ok()) return x.status();
        auto owned = std::make_shared<quant::X4TExpertMatrix>(std::move(*x));
        m.packed = owned->weight_packed;
        m.scales = owned->weight_scale;
        m.keepalive = owned;
        break;
      }
      case quant::WeightKind::kPlain:
        return absl::UnimplementedError(
            absl::StrCat(m.name, ": unquantized routed experts are not supported by the forward"));
    }
    if (absl::Status st = m.Validate(); !st.ok()) return st;
    return m;
  }

 private:
  const Checkpoint& ckpt_;
  const std::string prefix_;
};

// gpt-oss stores a layer's experts stacked, in two fused tensors X = gate_up_proj ([2I, H] per
// expert, gate and up interleaved: even rows gate, odd rows up) and X = down_proj ([H, I]), each
// in one of two layouts (docs/quant.md "gpt-oss layouts", docs/formats.md §10): transformers'
// MXFP4 (`X_blocks`, `X_scales`) or ModelOpt's NVFP4 export (`X`, `X_weight_scale`, the 0-d
// multiplier `X_weight_scale_2`), with `X_bias` in both. Names, shapes and the position of each
// element come from core/quant/gpt_oss_layout.h. ModelOpt's `X_input_scale` (W4A4) is not read:
// the forward computes on the stored weights (W4A16).
using quant::gptoss::Fused;
using quant::gptoss::Projection;

quant::gptoss::Dims GptOssDims(const BlockConfig& c) {
  return {static_cast<uint64_t>(c.experts), static_cast<uint64_t>(c.hidden),
          static_cast<uint64_t>(c.expert_intermediate)};
}

// The tensors of fused tensor `f` the forward reads, in the layout the checkpoint stores:
// packed codes, block scales, (ModelOpt) the global scale, then the bias. `experts` is the
// prefix ending in "experts.". INVALID_ARGUMENT when both layouts are stored (never a guess).
struct GptOssStored {
  bool modelopt = false;
  std::vector<quant::gptoss::TensorSpec> tensors;
};

absl::StatusOr<GptOssStored> GptOssTensors(const Checkpoint& ckpt, const std::string& experts,
                                           const BlockConfig& c, Fused f) {
  const std::string base = experts + quant::gptoss::FusedName(f);
  GptOssStored out;
  out.modelopt = ckpt.Find(base).has_value();
  if (out.modelopt && ckpt.Find(base + "_blocks")) {
    return absl::InvalidArgumentError(absl::StrCat(ckpt.root(), ": both ", base,
                                                   "_blocks (MXFP4) and ", base,
                                                   " (ModelOpt NVFP4) are stored"));
  }
  if (!out.modelopt && !ckpt.Find(base + "_blocks")) {
    return absl::NotFoundError(absl::StrCat(ckpt.root(), ": tensor ", base, "_blocks (MXFP4) or ",
                                            base, " (ModelOpt NVFP4) missing"));
  }
  out.tensors = out.modelopt ? quant::gptoss::ModelOptTensors(experts, GptOssDims(c), f,
                                                              /*w4a4=*/false, DType::kBF16)
                             : quant::gptoss::Mxfp4Tensors(experts, GptOssDims(c), f,
                                                           DType::kBF16);
  return out;
}

// One fused tensor of a layer's experts as stored, checked against its layout.
struct StackedFused {
  Fused fused = Fused::kGateUp;
  bool modelopt = false;
  TensorRef packed, scales;
  quant::Nvfp4Global global;  // ModelOpt: {weight_scale_2, multiplier}
  std::vector<float> bias;    // [E, R]
};

absl::StatusOr<StackedFused> LoadStackedFused(const Checkpoint& ckpt, const Loader& l,
                                              const std::string& prefix, const BlockConfig& c,
                                              Fused f) {
  if (c.hidden % 32 != 0 || c.expert_intermediate % 32 != 0) {  // whole groups in both layouts
    return absl::InvalidArgumentError(absl::StrCat(
        ckpt.root(), ": gpt-oss hidden_size ", c.hidden, " and intermediate_size ",
        c.expert_intermediate, " must be multiples of 32"));
  }
  auto stored = GptOssTensors(ckpt, prefix + "experts.", c, f);
  if (!stored.ok()) return stored.status();
  StackedFused s;
  s.fused = f;
  s.modelopt = stored->modelopt;
  for (const quant::gptoss::TensorSpec& spec : stored->tensors) {
    const std::string rel = spec.name.substr(prefix.size());
    if (absl::EndsWith(spec.name, "_bias")) {  // BF16 or F32, decoded
      auto b = l.Floats(rel, spec.shape);
      if (!b.ok()) return b.status();
      s.bias = std::move(*b);
      continue;
    }
    auto t = l.Get(rel, spec.shape);
    if (!t.ok()) return t.status();
    // transformers stores the E8M0 scale bytes as U8; F8_E8M0 is the same bytes.
    const DType d = t->info->dtype;
    if (d != spec.dtype && !(spec.dtype == DType::kU8 && d == DType::kF8_E8M0 &&
                             absl::EndsWith(spec.name, "_scales"))) {
      return absl::InvalidArgumentError(absl::StrCat(t->file->path(), ": tensor ", spec.name,
                                                     " has dtype ", DTypeName(d), ", expected ",
                                                     DTypeName(spec.dtype)));
    }
    if (absl::EndsWith(spec.name, "_weight_scale_2")) {
      auto g = quant::ReadScalarF32(*t);
      if (!g.ok()) return g.status();
      s.global = {*g, quant::GlobalRole::kMultiplier};
    } else if (s.packed.info == nullptr) {
      s.packed = *t;  // the specs list the codes first, then the block scales
    } else {
      s.scales = *t;
    }
  }
  return s;
}

// Projection `p` of expert `e` as the row-major Fp4Matrix the CPU stages and the CUDA kernels
// take ([rows, cols/2] codes, [rows, cols/group] scales), copied through the layout maps: a
// transformers row is contiguous; ModelOpt's fused row is the fastest axis, so its bytes are
// gathered one by one (each byte keeps its two codes: columns 2k and 2k + 1 of one row).
Fp4Matrix GptOssMatrix(const StackedFused& s, const quant::gptoss::Dims& d, Projection p,
                       uint64_t e) {
  const Fused f = s.fused;
  const uint64_t rows = p == Projection::kDown ? d.hidden : d.intermediate, cols = d.Cols(f);
  Fp4Matrix m;
  m.name = absl::StrCat(s.packed.info->name, "[", e, "].", quant::gptoss::ProjectionName(p));
  m.scale_kind = s.modelopt ? Fp4Scale::kE4M3Group16 : Fp4Scale::kE8M0Group32;
  m.rows = static_cast<int64_t>(rows);
  m.cols = static_cast<int64_t>(cols);
  m.global = s.global;
  const uint64_t pb = cols / 2, sb = cols / m.group();
  auto store = std::make_shared<std::vector<uint8_t>>(rows * (pb + sb));
  uint8_t* packed = store->data();
  uint8_t* scales = packed + rows * pb;
  const uint8_t* src_packed = s.packed.bytes().data();
  const uint8_t* src_scales = s.scales.bytes().data();
  if (!s.modelopt) {
    for (uint64_t r = 0; r < rows; ++r) {
      const quant::gptoss::ElementAt at =
          quant::gptoss::Mxfp4Position(d, f, quant::gptoss::ToFused(p, e, r, 0));
      std::memcpy(packed + r * pb, src_packed + at.code.byte, pb);
      std::memcpy(scales + r * sb, src_scales + at.scale, sb);
    }
  } else {
    // In 64 x 64 tiles: about 60 ms per gpt-oss-120b expert instead of 120 ms (docs/forward.md,
    // "Streamed").
    constexpr uint64_t kTile = 64;
    for (uint64_t k0 = 0; k0 < pb; k0 += kTile) {
      for (uint64_t r0 = 0; r0 < rows; r0 += kTile) {
        for (uint64_t k = k0; k < std::min(pb, k0 + kTile); ++k) {
          for (uint64_t r = r0; r < std::min(rows, r0 + kTile); ++r) {
            const quant::gptoss::ElementAt at =
                quant::gptoss::ModelOptPosition(d, f, quant::gptoss::ToFused(p, e, r, 2 * k));
            packed[r * pb + k] = src_packed[at.code.byte];
            if (k % 8 == 0) scales[r * sb + k / 8] = src_scales[at.scale];
          }
        }
      }
    }
  }
  m.packed = {packed, rows * pb};
  m.scales = {scales, rows * sb};
  m.keepalive = std::move(store);
  return m;
}

absl::Status LoadGptOssExperts(const Checkpoint& ckpt, const Loader& l, const std::string& prefix,
                               const BlockConfig& c, const std::vector<int>& experts,
                               BlockWeights* w) {
  const quant::gptoss::Dims d = GptOssDims(c);
  auto gate_up = LoadStackedFused(ckpt, l, prefix, c, Fused::kGateUp);
  if (!gate_up.ok()) return gate_up.status();
  auto down = LoadStackedFused(ckpt, l, prefix, c, Fused::kDown);
  if (!down.ok()) return down.status();
  const uint64_t E = d.experts, H = d.hidden, I = d.intermediate;
  for (int id : experts) {
    if (id < 0 || static_cast<uint64_t>(id) >= E) {
      return absl::InvalidArgumentError(absl::StrCat("expert ", id, " of ", E));
    }
    const uint64_t e = static_cast<uint64_t>(id);
    ExpertWeights& x = w->experts[e];
    x.gate = GptOssMatrix(*gate_up, d, Projection::kGate, e);
    x.up = GptOssMatrix(*gate_up, d, Projection::kUp, e);
    x.down = GptOssMatrix(*down, d, Projection::kDown, e);
    x.gate_bias.clear();
    x.up_bias.clear();
    for (uint64_t r = 0; r < I; ++r) {
      x.gate_bias.push_back(gate_up->bias[e * 2 * I + 2 * r]);
      x.up_bias.push_back(gate_up->bias[e * 2 * I + 2 * r + 1]);
    }
    x.down_bias.assign(down->bias.begin() + e * H, down->bias.begin() + (e + 1) * H);
    for (const Fp4Matrix* m : {&x.gate, &x.up, &x.down}) {
      if (absl::Status s = m->Validate(); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Fp4Matrix::Validate() const {
  const int g = group();
  if (cols % g != 0 || packed.size() != static_cast<size_t>(rows * cols / 2) ||
      scales.size() != static_cast<size_t>(rows * cols / g)) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": FP4 sizes inconsistent with [", rows,
                                                   ", ", cols, "]"));
  }
  if (scale_kind == Fp4Scale::kE4M3Group16) {  // a zero or non-finite global: no values
    auto v = quant::Nvfp4View::Make(name, packed, scales, global, rows, cols);
    if (!v.ok()) return v.status();
  }
  const int64_t groups = cols / g;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < groups; ++j) {
      const uint8_t s = scales[r * groups + j];
      const bool nan = scale_kind == Fp4Scale::kE8M0Group32 ? s == quant::kE8M0NaN
                                                            : (s & 0x7F) == 0x7F;
      if (!nan) continue;
      for (int k = 0; k < g / 2; ++k) {
        const uint8_t b = packed[r * cols / 2 + j * g / 2 + k];
        if (quant::NibbleIsNonzero(quant::LowNibble(b)) ||
            quant::NibbleIsNonzero(quant::HighNibble(b))) {
          return absl::DataLossError(absl::StrCat(name, ": NaN scale at row ", r, " group ", j));
        }
      }
    }
  }
  return absl::OkStatus();
}

void Fp4Matrix::DequantizeRow(int64_t r, double* out) const {
  // The values come from core/quant's views (the project's one dequantizer). A NaN scale only
  // survives Validate on an all-zero group, whose values are the signed zeros of its codes.
  if (scale_kind == Fp4Scale::kE8M0Group32) {
    auto v = quant::Mxfp4View::Make(name, packed, scales, rows, cols);
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t code = v->codes().Code(r, c);
      out[c] = quant::NibbleIsNonzero(code) ? v->Value(r, c) : quant::DecodeE2M1(code);
    }
  } else {
    auto v = quant::Nvfp4View::Make(name, packed, scales, global, rows, cols);
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t code = v->codes().Code(r, c);
      out[c] = quant::NibbleIsNonzero(code) ? v->Value(r, c) : quant::DecodeE2M1(code);
    }
  }
}

namespace {

// The matrix is [rows, cols] and holds exactly that many values.
bool Fits(const DenseMatrix& m, int64_t rows, int64_t cols) {
  const uint64_t width = m.dtype == DType::kBF16 ? 2 : m.dtype == DType::kF32 ? 4 : 0;
  return m.rows == rows && m.cols == cols && rows >= 0 && cols >= 0 &&
         m.bytes.size() == static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * width;
}

absl::Status BadShape(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("block weights: ", what, " has the wrong shape"));
}

}  // namespace

DenseMatrix DenseMatrix::Of(std::string name, int64_t rows, int64_t cols,
                            std::vector<float> values) {
  auto store = std::make_shared<std::vector<float>>(std::move(values));
  const auto* p = reinterpret_cast<const uint8_t*>(store->data());
  return {std::move(name), rows, cols, DType::kF32, {p, store->size() * 4}, store};
}

float DenseMatrix::At(int64_t i) const {
  if (dtype == DType::kBF16) {
    uint16_t v;
    std::memcpy(&v, bytes.data() + 2 * i, 2);
    return quant::DecodeBF16(v);
  }
  float f;
  std::memcpy(&f, bytes.data() + 4 * i, 4);
  return f;
}

void DenseMatrix::Row(int64_t r, float* out) const {
  for (int64_t k = 0; k < cols; ++k) out[k] = At(r * cols + k);
}

std::vector<float> DenseMatrix::Floats() const {
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < out.size(); ++i) out[i] = At(static_cast<int64_t>(i));
  return out;
}

absl::Status CheckRoutingWeights(const BlockConfig& c, const BlockWeights& w) {
  if (!Fits(w.router, c.experts, c.hidden)) {
    return BadShape("router " + w.router.name);
  }
  if (c.family == BlockFamily::kGptOss && w.router_bias.size() != static_cast<size_t>(c.experts))
    return BadShape("router bias");
  if (c.family != BlockFamily::kGptOss && w.correction_bias.size() != static_cast<size_t>(c.experts))
    return BadShape("e_score_correction_bias");
  if (c.latent > 0 && !Fits(w.latent_down, c.latent, c.hidden)) {
    return BadShape("latent down");
  }
  return absl::OkStatus();
}

absl::Status CheckExpertWeights(const BlockConfig& c, const ExpertWeights& e) {
  const int64_t in = c.latent > 0 ? c.latent : c.hidden;
  if (e.gate.rows != c.expert_intermediate || e.gate.cols != in) return BadShape(e.gate.name);
  if (e.up.rows != c.expert_intermediate || e.up.cols != in) return BadShape(e.up.name);
  if (e.down.rows != in || e.down.cols != c.expert_intermediate) return BadShape(e.down.name);
  if (c.family == BlockFamily::kGptOss &&
      (e.gate_bias.size() != static_cast<size_t>(c.expert_intermediate) ||
       e.up_bias.size() != e.gate_bias.size() || e.down_bias.size() != static_cast<size_t>(in)))
    return BadShape(e.gate.name + " biases");
  return absl::OkStatus();
}

absl::Status CheckSharedWeights(const BlockConfig& c, const BlockWeights& w) {
  if (c.shared_intermediate <= 0) return absl::OkStatus();
  if (!Fits(w.shared_gate, c.shared_intermediate, c.hidden))
    return BadShape("shared gate");
  if (!Fits(w.shared_up, c.shared_intermediate, c.hidden))
    return BadShape("shared up");
  if (!Fits(w.shared_down, c.hidden, c.shared_intermediate))
    return BadShape("shared down");
  return absl::OkStatus();
}

absl::Status CheckLatentOutWeights(const BlockConfig& c, const BlockWeights& w) {
  if (c.latent <= 0) return absl::OkStatus();
  if (!Fits(w.latent_up, c.hidden, c.latent)) return BadShape("latent up");
  if (c.latent_norm && w.latent_norm.size() != static_cast<size_t>(c.latent))
    return BadShape("latent norm");
  return absl::OkStatus();
}

absl::Status CheckBlockWeights(const BlockConfig& c, const BlockWeights& w) {
  if (absl::Status s = CheckRoutingWeights(c, w); !s.ok()) return s;
  if (w.experts.size() != static_cast<size_t>(c.experts)) return BadShape("expert list");
  for (const ExpertWeights& e : w.experts) {
    if (absl::Status s = CheckExpertWeights(c, e); !s.ok()) return s;
  }
  if (absl::Status s = CheckSharedWeights(c, w); !s.ok()) return s;
  return CheckLatentOutWeights(c, w);
}

namespace {

// "…layers.{L}.{block}", nested under "language_model." for multimodal checkpoints (Kimi-K3).
std::string BlockPrefix(const Checkpoint& ckpt, const TensorNames& n, int layer) {
  std::string prefix;
  for (const char* root : {"language_model.model.layers.", "model.layers."}) {
    prefix = absl::StrCat(root, layer, ".", n.block);
    if (ckpt.Find(prefix + n.router)) break;
  }
  return prefix;
}

// Expert e's three matrix modules (gate, up, down), relative to the block prefix.
std::array<std::string, 3> ExpertModules(const TensorNames& n, int64_t e) {
  const std::string base = absl::StrCat("experts.", e, ".");
  return {base + n.expert_gate, base + n.expert_up, base + n.expert_down};
}

}  // namespace

absl::StatusOr<std::vector<TensorRef>> BlockPartTensors(const Checkpoint& ckpt,
                                                        const BlockConfig& c, int layer,
                                                        BlockPart part, int expert) {
  const TensorNames& n = NamesFor(c.family);
  const std::string prefix = BlockPrefix(ckpt, n, layer);
  std::vector<std::string> names;
  switch (part) {
    case BlockPart::kRouting:
      names = {n.router, n.router_bias, n.correction_bias};
      if (c.latent > 0) names.push_back(n.latent_down);
      break;
    case BlockPart::kLatentOut:
      if (c.latent > 0) names = {n.latent_up, c.latent_norm ? n.latent_norm : ""};
      break;
    case BlockPart::kShared:
      if (c.shared_intermediate > 0) names = {n.shared_gate, n.shared_up, n.shared_down};
      break;
    case BlockPart::kExpert: {
      std::vector<TensorRef> out;
      if (c.family == BlockFamily::kGptOss) {  // the stacked tensors of every expert
        for (Fused f : {Fused::kGateUp, Fused::kDown}) {
          auto stored = GptOssTensors(ckpt, prefix + "experts.", c, f);
          if (!stored.ok()) return stored.status();
          for (const quant::gptoss::TensorSpec& spec : stored->tensors) {
            std::optional<TensorRef> t = ckpt.Find(spec.name);
            if (!t) {
              return absl::NotFoundError(
                  absl::StrCat(ckpt.root(), ": tensor ", spec.name, " missing"));
            }
            out.push_back(*t);
          }
        }
        return out;
      }
      for (const std::string& module : ExpertModules(n, expert)) {
        auto q = quant::ResolveWeight(ckpt, prefix + module);
        if (!q.ok()) return q.status();
        for (const TensorRef* t : {&q->packed, &q->scale, &q->x4t_fixed, &q->x4t_exceptions}) {
          if (t->info != nullptr) out.push_back(*t);
        }
        if (q->global_scale) out.push_back(*q->global_scale);
      }
      return out;
    }
  }
  std::vector<TensorRef> out;
  for (const std::string& name : names) {
    if (name.empty()) continue;
    std::optional<TensorRef> t = ckpt.Find(prefix + name);
    if (!t) return absl::NotFoundError(absl::StrCat(ckpt.root(), ": tensor ", prefix, name, " missing"));
    out.push_back(*t);
  }
  return out;
}

std::vector<ExpertGlobalScale> ExpertGlobalScales(const Checkpoint& ckpt, const BlockConfig& c,
                                                  int layer) {
  std::vector<ExpertGlobalScale> out;
  // gpt-oss: gate and up are one fused tensor with one global scale (ModelOpt) or none (MXFP4).
  if (c.family == BlockFamily::kGptOss) return out;
  const TensorNames& n = NamesFor(c.family);
  const std::string prefix = BlockPrefix(ckpt, n, layer);
  for (int64_t e = 0; e < c.experts; ++e) {
    const std::array<std::string, 3> m = ExpertModules(n, e);
    auto gate = quant::ResolveWeight(ckpt, prefix + m[0]);
    auto up = quant::ResolveWeight(ckpt, prefix + m[1]);
    if (!gate.ok() || !up.ok() || !gate->global_scale || !up->global_scale) continue;
    out.push_back({static_cast<int>(e), *gate->global_scale, *up->global_scale});
  }
  return out;
}

absl::Status LoadBlockPart(const Checkpoint& ckpt, const BlockConfig& c, int layer,
                           BlockPart part, const std::vector<int>& experts, BlockWeights* w) {
  const TensorNames& n = NamesFor(c.family);
  const std::string prefix = BlockPrefix(ckpt, n, layer);
  Loader l(ckpt, prefix);
  const int64_t H = c.hidden, E = c.experts, I = c.expert_intermediate;
  const int64_t in = c.latent > 0 ? c.latent : H;
  switch (part) {
    case BlockPart::kRouting: {
      auto router = l.Dense(n.router, E, H);
      if (!router.ok()) return router.status();
      w->router = std::move(*router);
      if (*n.router_bias) {
        auto b = l.Floats(n.router_bias, {static_cast<uint64_t>(E)});
        if (!b.ok()) return b.status();
        w->router_bias = std::move(*b);
      }
      if (*n.correction_bias) {
        auto b = l.Floats(n.correction_bias, {static_cast<uint64_t>(E)});
        if (!b.ok()) return b.status();
        w->correction_bias = std::move(*b);
      }
      if (c.latent > 0) {
        auto down = l.Dense(n.latent_down, c.latent, H);
        if (!down.ok()) return down.status();
        w->latent_down = std::move(*down);
      }
      return CheckRoutingWeights(c, *w);
    }
    case BlockPart::kLatentOut:
      if (c.latent > 0) {
        auto up = l.Dense(n.latent_up, H, c.latent);
        if (!up.ok()) return up.status();
        w->latent_up = std::move(*up);
        if (c.latent_norm) {
          auto norm = l.Floats(n.latent_norm, {static_cast<uint64_t>(c.latent)});
          if (!norm.ok()) return norm.status();
          w->latent_norm = std::move(*norm);
        }
      }
      return CheckLatentOutWeights(c, *w);
    case BlockPart::kShared:
      if (c.shared_intermediate > 0) {
        auto g = l.Dense(n.shared_gate, c.shared_intermediate, H);
        if (!g.ok()) return g.status();
        auto u = l.Dense(n.shared_up, c.shared_intermediate, H);
        if (!u.ok()) return u.status();
        auto d = l.Dense(n.shared_down, H, c.shared_intermediate);
        if (!d.ok()) return d.status();
        w->shared_gate = std::move(*g);
        w->shared_up = std::move(*u);
        w->shared_down = std::move(*d);
      }
      return CheckSharedWeights(c, *w);
    case BlockPart::kExpert:
      w->experts.resize(E);
      if (c.family == BlockFamily::kGptOss) {
        if (absl::Status s = LoadGptOssExperts(ckpt, l, prefix, c, experts, w); !s.ok()) return s;
      } else {
        for (int e : experts) {
          if (e < 0 || e >= E) {
            return absl::InvalidArgumentError(absl::StrCat("expert ", e, " of ", E));
          }
          const std::array<std::string, 3> m = ExpertModules(n, e);
          auto g = l.Fp4(m[0], I, in);
          if (!g.ok()) return g.status();
          auto u = l.Fp4(m[1], I, in);
          if (!u.ok()) return u.status();
          auto d = l.Fp4(m[2], in, I);
          if (!d.ok()) return d.status();
          w->experts[e].gate = std::move(*g);
          w->experts[e].up = std::move(*u);
          w->experts[e].down = std::move(*d);
        }
      }
      for (int e : experts) {
        if (absl::Status s = CheckExpertWeights(c, w->experts[e]); !s.ok()) return s;
      }
      return absl::OkStatus();
  }
  return absl::InvalidArgumentError("unknown block part");
}

absl::StatusOr<BlockWeights> LoadBlockWeights(const Checkpoint& ckpt, const BlockConfig& c,
                                              int layer) {
  BlockWeights w;
  std::vector<int> all(c.experts);
  for (int e = 0; e < c.experts; ++e) all[e] = e;
  for (BlockPart part :
       {BlockPart::kRouting, BlockPart::kLatentOut, BlockPart::kShared, BlockPart::kExpert}) {
    if (absl::Status s = LoadBlockPart(ckpt, c, layer, part, all, &w); !s.ok()) return s;
  }
  if (absl::Status s = CheckBlockWeights(c, w); !s.ok()) return s;
  return w;
}

}  // namespace ckpt::forward
