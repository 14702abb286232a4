// `transcode --layout modelopt`: the same lossless cast written in ModelOpt's W4A16_NVFP4 layout.
// Everything the output is checked against is written here from ModelOpt's exporter and vLLM's
// loader (docs/formats.md §9), not taken from the transcoder: the tensor names, dtypes and shapes,
// the two config files, and a decoder of our own for E2M1, E4M3 and E8M0 that reconstructs every
// value as e2m1 x weight_scale x weight_scale_2 and compares it with the MXFP4 source's value.
#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "core/checkpoint.h"
#include "core/io/tree_stream.h"
#include "core/progress.h"
#include "core/quant/format.h"
#include "core/quant/pair_verify.h"
#include "core/quant/safetensors_writer.h"
#include "core/quant/transcode.h"
#include "core/sha256.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using ::ckpt::quant::testing::FileSizeLimit;
using ::ckpt::quant::testing::Files;
using ::ckpt::quant::testing::kExpert;
using ::ckpt::quant::testing::MutateTensor;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::ReadAll;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using json = nlohmann::json;

absl::StatusOr<TranscodeResult> ToModelOpt(const fs::path& src, const fs::path& dst,
                                           TranscodeOptions options = {}) {
  options.layout = TranscodeLayout::kModelOpt;
  return TranscodeToNvfp4(src.string(), dst.string(), options, NoProgress());
}

json ReadJson(const fs::path& p) {
  const std::vector<uint8_t> b = ReadAll(p);
  return json::parse(b.begin(), b.end());
}

// The test's own codecs (docs/formats.md §3), deliberately not core/quant/codecs.h.
double E2M1(uint8_t nibble) {
  const int e = (nibble >> 1) & 3, m = nibble & 1;
  const double mag = e == 0 ? 0.5 * m : (1.0 + 0.5 * m) * std::ldexp(1.0, e - 1);
  return (nibble & 8) ? -mag : mag;
}
double E4M3(uint8_t byte) {
  const int e = (byte >> 3) & 15, m = byte & 7;
  const double mag = e == 0 ? std::ldexp(m, -9) : std::ldexp(8 + m, e - 10);
  return (byte & 0x80) ? -mag : mag;
}
double E8M0(uint8_t byte) { return std::ldexp(1.0, byte - 127); }

// The MXFP4 modules of the source, by name: `M.weight_packed` and `M.weight_scale`.
std::vector<std::string> SourceModules(const Checkpoint& src) {
  std::vector<std::string> out;
  const std::string suffix = ".weight_packed";
  for (const std::string& n : src.TensorNames()) {
    if (n.size() > suffix.size() &&
        n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) {
      out.push_back(n.substr(0, n.size() - suffix.size()));
    }
  }
  return out;
}

// Every quantized module in ModelOpt's naming, and every other tensor carried unchanged.
void ExpectModelOptTensors(const Checkpoint& src, const Checkpoint& out) {
  std::set<std::string> want;
  const std::vector<std::string> modules = SourceModules(src);
  ASSERT_EQ(modules.size(), 96u);
  for (const std::string& m : modules) {
    const TensorInfo& packed = *src.Find(m + ".weight_packed")->info;
    const uint64_t rows = packed.shape[0], in = packed.shape[1] * 2;
    auto w = out.Find(m + ".weight");
    auto ws = out.Find(m + ".weight_scale");
    auto ws2 = out.Find(m + ".weight_scale_2");
    ASSERT_TRUE(w && ws && ws2) << m;
    EXPECT_EQ(w->info->dtype, DType::kU8) << m;
    EXPECT_EQ(w->info->shape, (std::vector<uint64_t>{rows, in / 2})) << m;
    EXPECT_EQ(ws->info->dtype, DType::kF8_E4M3) << m;
    EXPECT_EQ(ws->info->shape, (std::vector<uint64_t>{rows, in / 16})) << m;
    EXPECT_EQ(ws2->info->dtype, DType::kF32) << m;
    EXPECT_TRUE(ws2->info->shape.empty()) << m << ": weight_scale_2 is 0-d as ModelOpt writes it";
    // Weight-only: no activation scale, and nothing of compressed-tensors' naming.
    for (const char* absent : {".input_scale", ".weight_packed", ".weight_global_scale"}) {
      EXPECT_FALSE(out.Find(m + absent).has_value()) << m << absent;
    }
    want.insert({m + ".weight", m + ".weight_scale", m + ".weight_scale_2"});
  }
  for (const std::string& n : src.TensorNames()) {
    if (n.find(".weight_packed") != std::string::npos) continue;
    const std::string base = n.substr(0, n.rfind('.'));
    if (n.size() > 13 && n.compare(n.size() - 13, 13, ".weight_scale") == 0 &&
        src.Find(base + ".weight_packed")) {
      continue;
    }
    auto a = src.Find(n);
    auto b = out.Find(n);
    ASSERT_TRUE(b.has_value()) << n;
    EXPECT_EQ(b->info->dtype, a->info->dtype) << n;
    EXPECT_EQ(b->info->shape, a->info->shape) << n;
    EXPECT_TRUE(std::equal(a->bytes().begin(), a->bytes().end(), b->bytes().begin(),
                           b->bytes().end())) << n;
    want.insert(n);
  }
  const std::vector<std::string> names = out.TensorNames();
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want);
}

float ScalarF32(const TensorRef& t) {
  float f;
  std::memcpy(&f, t.bytes().data(), 4);
  return f;
}

// Every value of every module, all experts and rows: e2m1 x weight_scale x weight_scale_2 of the
// output equals e2m1 x 2^(e8m0 - 127) of the source, exactly (both are exact in double).
void ExpectValuesEqualSource(const Checkpoint& src, const Checkpoint& out) {
  uint64_t compared = 0, nonzero = 0;
  for (const std::string& m : SourceModules(src)) {
    auto sp = src.Find(m + ".weight_packed");
    auto ss = src.Find(m + ".weight_scale");
    auto op = out.Find(m + ".weight");
    auto os = out.Find(m + ".weight_scale");
    const double global = ScalarF32(*out.Find(m + ".weight_scale_2"));
    const uint64_t rows = sp->info->shape[0], half = sp->info->shape[1], in = half * 2;
    const auto sp_b = sp->bytes(), ss_b = ss->bytes(), op_b = op->bytes(), os_b = os->bytes();
    // Nibbles copied verbatim.
    ASSERT_TRUE(std::equal(sp_b.begin(), sp_b.end(), op_b.begin(), op_b.end())) << m;
    for (uint64_t r = 0; r < rows; ++r) {
      for (uint64_t j = 0; j < in; ++j) {
        const uint8_t sbyte = sp_b[r * half + j / 2], obyte = op_b[r * half + j / 2];
        const uint8_t snib = j % 2 ? sbyte >> 4 : sbyte & 15;  // low nibble = even element
        const uint8_t onib = j % 2 ? obyte >> 4 : obyte & 15;
        const double want = E2M1(snib) * E8M0(ss_b[r * (in / 32) + j / 32]);
        const uint8_t block_scale = os_b[r * (in / 16) + j / 16];
        ASSERT_NE(block_scale & 0x7F, 0x7F) << m << " row " << r << ": NaN block scale";
        ASSERT_NE(block_scale, 0) << m << " row " << r << ": ModelOpt never writes scale +0";
        const double got = E2M1(onib) * E4M3(block_scale) * global;
        ASSERT_EQ(got, want) << m << " row " << r << " element " << j;
        ++compared;
        nonzero += want != 0;
      }
    }
  }
  // 2 layers x 16 experts x (w1, w3: 192 x 128; w2: 128 x 192).
  EXPECT_EQ(compared, 2u * 16 * 3 * 192 * 128);
  EXPECT_GT(nonzero, compared / 2);
}

// w1 and w3 of one expert feed one fused GEMM in vLLM, which keeps w1's weight_scale_2 for both
// halves: ours are equal, a power of two, and w2's is its own.
void ExpectW13ShareTheGlobal(const Checkpoint& out) {
  for (int layer : {1, 2}) {
    for (int e = 0; e < 16; ++e) {
      const std::string base = "language_model.model.layers." + std::to_string(layer) +
                               ".block_sparse_moe.experts." + std::to_string(e) + ".";
      const float g1 = ScalarF32(*out.Find(base + "w1.weight_scale_2"));
      const float g3 = ScalarF32(*out.Find(base + "w3.weight_scale_2"));
      uint32_t b1, b3;
      std::memcpy(&b1, &g1, 4);
      std::memcpy(&b3, &g3, 4);
      EXPECT_EQ(b1, b3) << base;
      int exp;
      EXPECT_EQ(std::frexp(g1, &exp), 0.5f) << base << ": " << g1 << " is not a power of two";
    }
  }
}

// ModelOpt's exclude list for the fixture, worked out by hand from its exporter's summarizing
// rule: every unquantized module with a 2-D weight, as the shortest dotted-prefix wildcard that
// matches no quantized module, else its own name.
const std::vector<std::string> kExcludeModules = {
    "language_model.lm_head",
    "language_model.model.embed_tokens",
    "language_model.model.layers.0*",
    "language_model.model.layers.1.block_sparse_moe.gate",
    "language_model.model.layers.1.block_sparse_moe.routed_expert_down_proj",
    "language_model.model.layers.1.block_sparse_moe.routed_expert_up_proj",
    "language_model.model.layers.1.block_sparse_moe.shared_experts*",
    "language_model.model.layers.1.self_attn*",
    "language_model.model.layers.2.block_sparse_moe.gate",
    "language_model.model.layers.2.block_sparse_moe.routed_expert_down_proj",
    "language_model.model.layers.2.block_sparse_moe.routed_expert_up_proj",
    "language_model.model.layers.2.block_sparse_moe.shared_experts*",
    "language_model.model.layers.2.self_attn*",
};

void ExpectConfigs(const fs::path& src_root, const fs::path& root, const Checkpoint& out) {
  const json hf = ReadJson(root / "hf_quant_config.json");
  EXPECT_EQ(hf.at("producer").at("name"), "modelopt");
  EXPECT_TRUE(hf.at("producer").at("version").is_string());
  const json want_quantization = {{"quant_algo", "W4A16_NVFP4"},
                                  {"kv_cache_quant_algo", nullptr},
                                  {"group_size", 16},
                                  {"exclude_modules", kExcludeModules}};
  EXPECT_EQ(hf.at("quantization"), want_quantization);
  EXPECT_EQ(hf.size(), 2u);

  const json config = ReadJson(root / "config.json");
  const json want_qc = json::parse(R"({
    "config_groups": {"group_0": {
        "weights": {"dynamic": false, "num_bits": 4, "type": "float", "group_size": 16},
        "targets": ["Linear"]}},
    "quant_algo": "W4A16_NVFP4",
    "quant_method": "modelopt"})");
  json qc = config.at("quantization_config");
  EXPECT_EQ(qc.at("ignore"), json(kExcludeModules));
  EXPECT_EQ(qc.at("producer"), hf.at("producer"));
  qc.erase("ignore");
  qc.erase("producer");
  EXPECT_EQ(qc, want_qc);
  // The MXFP4 description is gone from text_config; everything else is the source's.
  json src_config = ReadJson(src_root / "config.json");
  EXPECT_TRUE(src_config.at("text_config").contains("quantization_config"));
  EXPECT_FALSE(config.at("text_config").contains("quantization_config"));
  json rest = config, src_rest = src_config;
  rest.erase("quantization_config");
  src_rest.erase("quantization_config");
  src_rest["text_config"].erase("quantization_config");
  EXPECT_EQ(rest, src_rest);

  // The index names every tensor in its shard.
  const json index = ReadJson(root / "model.safetensors.index.json");
  const std::vector<std::string> names = out.TensorNames();
  EXPECT_EQ(index.at("weight_map").size(), names.size());
  for (const std::string& n : names) {
    EXPECT_EQ(index.at("weight_map").at(n), out.RelativePath(*out.Find(n)->file)) << n;
  }

  // As a loader reads the list (fnmatch, and vLLM's substring rule): it excludes every
  // unquantized module with a 2-D weight and no quantized module.
  for (const std::string& n : names) {
    if (n.size() < 8 || n.compare(n.size() - 7, 7, ".weight") != 0) continue;
    const std::string m = n.substr(0, n.size() - 7);
    const bool quantized = out.Find(m + ".weight_scale_2").has_value();
    bool excluded = false;
    for (const std::string& p : kExcludeModules) {
      excluded |= ::fnmatch(p.c_str(), m.c_str(), FNM_NOESCAPE) == 0 ||
                  (p != m && m.find(p) != std::string::npos);
    }
    if (out.Find(n)->info->shape.size() >= 2) {
      EXPECT_EQ(excluded, !quantized) << m;
    }
  }
}

TEST(TranscodeModelOpt, WritesModelOptsLayoutWithEveryValueExact) {
  TempDir dir;
  auto r = ToModelOpt(Fixture("mini-kimi-mxfp4"), dir / "out");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->layout, TranscodeLayout::kModelOpt);
  EXPECT_EQ(r->modules_transcoded, 96u);
  EXPECT_EQ(r->zero_groups_canonicalized, 2u * 4 * 3 * 3);
  EXPECT_THAT(r->files, ::testing::Contains("hf_quant_config.json"));
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  auto out = Checkpoint::Open((dir / "out").string());
  ASSERT_TRUE(src.ok() && out.ok()) << out.status();
  ExpectModelOptTensors(**src, **out);
  ExpectValuesEqualSource(**src, **out);
  ExpectW13ShareTheGlobal(**out);
  ExpectConfigs(Fixture("mini-kimi-mxfp4"), dir / "out", **out);
  // Nothing else is left beside DST (temporary directory, lock).
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

// w1's own k_max is raised above w3's, so only a shared global keeps w3 exact: the cast takes
// k_max over both, as ModelOpt's Kimi-K3 and DeepSeek-V4 casts do.
TEST(TranscodeModelOpt, W1AndW3ShareOneGlobalEvenWhenTheirRangesDiffer) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "6.w1";
  int w1_max = 0, w3_max = 0;
  {
    auto ckpt = Checkpoint::Open(root.string());
    ASSERT_TRUE(ckpt.ok());
    for (uint8_t b : (*ckpt)->Find(m + ".weight_scale")->bytes()) {
      w1_max = std::max<int>(w1_max, b);
    }
    for (uint8_t b : (*ckpt)->Find(kExpert + "6.w3.weight_scale")->bytes()) {
      w3_max = std::max<int>(w3_max, b);
    }
  }
  ASSERT_LT(w1_max, w3_max + 5);
  // Row 3 group 1 of w1 becomes active with a scale 5 binades above w3's largest.
  MutateTensor(root, m + ".weight_packed", [](uint8_t* p, size_t) { p[3 * 64 + 16] = 0x07; });
  MutateTensor(root, m + ".weight_scale",
               [&](uint8_t* p, size_t) { p[3 * 4 + 1] = static_cast<uint8_t>(w3_max + 5); });
  auto r = ToModelOpt(root, dir / "out");
  ASSERT_TRUE(r.ok()) << r.status();
  auto src = Checkpoint::Open(root.string());
  auto out = Checkpoint::Open((dir / "out").string());
  ASSERT_TRUE(src.ok() && out.ok());
  ExpectW13ShareTheGlobal(**out);
  ExpectValuesEqualSource(**src, **out);
  EXPECT_EQ(ScalarF32(*(*out)->Find(m + ".weight_scale_2")),
            std::ldexp(1.0f, w3_max + 5 - 127 - 8));
}

// Every scale of expert 2's w1 and w3 at E8M0 5 (2^-122): compressed-tensors' divisor would be
// 2^130, beyond F32 (it used to be written as +inf, every value then 0); ModelOpt's multiplier
// 2^-130 is an exact subnormal, and every value stays exact.
TEST(TranscodeModelOpt, TinyScalesFitTheMultiplierButNotTheDivisor) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  for (const char* w : {"2.w1", "2.w3"}) {
    MutateTensor(root, kExpert + w + ".weight_scale",
                 [](uint8_t* p, size_t n) { std::fill(p, p + n, 5); });
  }
  auto ct = TranscodeToNvfp4(root.string(), (dir / "ct").string(), {}, NoProgress());
  ASSERT_EQ(ct.status().code(), absl::StatusCode::kFailedPrecondition) << ct.status();
  EXPECT_THAT(std::string(ct.status().message()),
              HasSubstr(kExpert + "2.w1: its global scale 2^130 (k_max -122) is beyond F32"));
  EXPECT_FALSE(fs::exists(dir / "ct"));
  EXPECT_FALSE(fs::exists(dir / ".ct.transcode-tmp"));  // nothing a --resume could continue
  auto r = ToModelOpt(root, dir / "out");
  ASSERT_TRUE(r.ok()) << r.status();
  auto src = Checkpoint::Open(root.string());
  auto out = Checkpoint::Open((dir / "out").string());
  ASSERT_TRUE(src.ok() && out.ok());
  EXPECT_EQ(ScalarF32(*(*out)->Find(kExpert + "2.w3.weight_scale_2")), std::ldexp(1.0f, -130));
  ExpectValuesEqualSource(**src, **out);
}

TEST(TranscodeModelOpt, OverSpanSourceFailsNamingTheGroupAndPublishesNothing) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string m = kExpert + "9.w2";
  MutateTensor(root, m + ".weight_packed",
               [](uint8_t* p, size_t) { p[7 * 96 + 4 * 16 + 3] = 0x70; });
  MutateTensor(root, m + ".weight_scale", [](uint8_t* p, size_t) { p[7 * 6 + 4] = 90; });
  auto r = ToModelOpt(root, dir / "out");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("over-span: " + m + " row 7 group 4"));
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_FALSE(fs::exists(dir / ".out.transcode-tmp"));
  EXPECT_FALSE(fs::exists(dir / ".out.transcode.lock"));
}

TEST(TranscodeModelOpt, SmallWindowAndThreadsGiveTheSameBytes) {
  TempDir dir;
  auto whole = ToModelOpt(Fixture("mini-kimi-mxfp4"), dir / "whole");
  ASSERT_TRUE(whole.ok()) << whole.status();
  for (unsigned threads : {1u, 3u}) {
    TranscodeOptions o;
    o.memory_window = 1 << 20;
    o.threads = threads;
    const fs::path out = dir / ("small-" + std::to_string(threads));
    auto small = ToModelOpt(Fixture("mini-kimi-mxfp4"), out, o);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_LE(small->peak_kept_bytes, o.memory_window);
    EXPECT_EQ(Files(out), Files(dir / "whole")) << threads;
  }
  // And its digests are those of the files published.
  std::map<std::string, std::string> stated, disk;
  for (const ImageFile& f : whole->output->files) stated[f.path] = ToHex(*f.sha256);
  for (const auto& [name, bytes] : Files(dir / "whole")) disk[name] = ToHex(Sha256Of(bytes));
  EXPECT_EQ(stated, disk);
}

// A one-thread ModelOpt transcode of `src` to dir/out cut by a disk that fills up past `limit`
// bytes a file: DATA_LOSS, nothing published, the temporary directory left for --resume.
void CutRun(const fs::path& src, const TempDir& dir, rlim_t limit) {
  TranscodeOptions o;
  o.threads = 1;
  {
    FileSizeLimit full(limit);
    auto cut = ToModelOpt(src, dir / "out", o);
    ASSERT_EQ(cut.status().code(), absl::StatusCode::kDataLoss) << cut.status();
  }
  ASSERT_TRUE(fs::is_directory(dir / ".out.transcode-tmp"));
  EXPECT_FALSE(fs::exists(dir / "out"));
}

TEST(TranscodeModelOpt, ResumeContinuesOnlyARunOfTheSameLayout) {
  TempDir dir;
  auto want = ToModelOpt(Fixture("mini-kimi-mxfp4"), dir / "want");
  ASSERT_TRUE(want.ok()) << want.status();
  CutRun(Fixture("mini-kimi-mxfp4"), dir, 1 << 20);
  TranscodeOptions o;
  o.threads = 1;
  // A compressed-tensors run may not continue it, and leaves it as it was.
  const auto left = Files(dir / ".out.transcode-tmp");
  TranscodeOptions ct = o;
  ct.resume = true;
  auto other = TranscodeToNvfp4(Fixture("mini-kimi-mxfp4").string(), (dir / "out").string(), ct,
                                NoProgress());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists) << other.status();
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("another run (layout"));
  EXPECT_EQ(Files(dir / ".out.transcode-tmp"), left);
  // The same layout continues it to the bytes of an uninterrupted run.
  o.resume = true;
  auto resumed = ToModelOpt(Fixture("mini-kimi-mxfp4"), dir / "out", o);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(Files(dir / "out"), Files(dir / "want"));
}

// A compressed-tensors MXFP4 source: module "layers.0.mlp.gate_up" (one row of 32 elements) in
// one shard and `extra` BF16 tensors of shape [2, 32] in a second, with their index.
fs::path TinySource(const TempDir& dir, const std::vector<std::string>& extra) {
  const fs::path root = dir / "src";
  fs::create_directory(root);
  const std::string first = "model-00001-of-00002.safetensors";
  const std::string second = "model-00002-of-00002.safetensors";
  json weight_map = json::object();
  std::vector<TensorToWrite> quantized, others;
  quantized.push_back(TensorToWrite::Owned("layers.0.mlp.gate_up.weight_packed", DType::kU8,
                                           {1, 16}, std::vector<uint8_t>(16, 0x22)));
  quantized.push_back(TensorToWrite::Owned("layers.0.mlp.gate_up.weight_scale", DType::kU8,
                                           {1, 1}, std::vector<uint8_t>(1, 127)));
  for (const TensorToWrite& t : quantized) weight_map[t.name] = first;
  for (const std::string& name : extra) {
    others.push_back(
        TensorToWrite::Owned(name, DType::kBF16, {2, 32}, std::vector<uint8_t>(2 * 32 * 2, 0)));
    weight_map[name] = second;
  }
  EXPECT_TRUE(WriteSafetensors((root / first).string(), std::move(quantized), {}).ok());
  EXPECT_TRUE(WriteSafetensors((root / second).string(), std::move(others), {}).ok());
  const json index = {{"metadata", json::object()}, {"weight_map", weight_map}};
  ::ckpt::testing::WriteAll(root / "model.safetensors.index.json", index.dump());
  ::ckpt::testing::WriteAll(root / "config.json", std::string(R"({"quantization_config": {
      "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "float",
                                                "group_size": 32}}}}})"));
  return root;
}

// A module name that is part of a quantized module's name cannot be excluded without excluding
// that one too in vLLM (it matches exclude entries as substrings): refused, nothing written.
TEST(TranscodeModelOpt, ExcludeEntryInsideAQuantizedNameIsRefused) {
  TempDir dir;
  const fs::path root = TinySource(dir, {"layers.0.mlp.gate.weight"});
  auto ct = TranscodeToNvfp4(root.string(), (dir / "ct").string(), {}, NoProgress());
  ASSERT_TRUE(ct.ok()) << ct.status();  // the compressed-tensors layout needs no such list
  auto r = ToModelOpt(root, dir / "out");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("layers.0.mlp.gate is part of the name of quantized module "
                        "layers.0.mlp.gate_up"));
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_FALSE(fs::exists(dir / ".out.transcode-tmp"));
}

// A source tensor named like a derived one (a BF16 M.weight in another shard than
// M.weight_packed) would be written twice under one name, once in each shard: refused before
// anything is written.
TEST(TranscodeModelOpt, DerivedNameTakenByASourceTensorIsRefused) {
  TempDir dir;
  const fs::path root = TinySource(dir, {"layers.0.mlp.gate_up.weight"});
  auto r = ToModelOpt(root, dir / "out");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("would hold layers.0.mlp.gate_up.weight twice"));
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_FALSE(fs::exists(dir / ".out.transcode-tmp"));
}

TEST(TranscodeModelOpt, LayoutNames) {
  EXPECT_EQ(*ParseTranscodeLayout("modelopt"), TranscodeLayout::kModelOpt);
  EXPECT_EQ(*ParseTranscodeLayout("compressed-tensors"), TranscodeLayout::kCompressedTensors);
  for (const char* bad : {"", "ModelOpt", "nvfp4", "compressed_tensors"}) {
    EXPECT_EQ(ParseTranscodeLayout(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

// gpt-oss MXFP4 -> ModelOpt's gpt-oss layout (docs/quant.md "gpt-oss layouts"): one stacked
// tensor at a time through CastToModelOpt. Every tensor written is the committed lossless
// export's, byte for byte; the export also holds each stacked tensor's W4A4 `_input_scale`
// (pinned to 1), which a W4A16_NVFP4 transcode does not write, and its config files declare
// NVFP4 with a hand-written exclude list where ours declare W4A16_NVFP4 and the computed one.
TEST(TranscodeModelOptGptOss, WritesTheCommittedExportsTensorsAndVerifiesLossless) {
  TempDir dir;
  auto r = ToModelOpt(Fixture("mini-gpt-oss-mxfp4"), dir / "out");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->modules_transcoded, 4u);
  EXPECT_EQ(r->zero_group_scale, "+0");
  EXPECT_EQ(r->policy.verdict, ScaleWindowVerdict::kLosslessTranscodable);
  auto src = Checkpoint::Open(Fixture("mini-gpt-oss-mxfp4").string());
  auto out = Checkpoint::Open((dir / "out").string());
  auto want = Checkpoint::Open(Fixture("mini-gpt-oss-modelopt-nvfp4").string());
  ASSERT_TRUE(src.ok() && out.ok() && want.ok());
  std::set<std::string> only_in_export;
  for (const std::string& n : (*want)->TensorNames()) {
    if (!(*out)->Find(n)) only_in_export.insert(n);
  }
  std::set<std::string> input_scales;
  for (const char* l : {"0", "1"}) {
    for (const char* x : {"gate_up_proj", "down_proj"}) {
      input_scales.insert(std::string("model.layers.") + l + ".mlp.experts." + x + "_input_scale");
    }
  }
  EXPECT_EQ(only_in_export, input_scales);
  for (const std::string& n : (*out)->TensorNames()) {
    const TensorRef a = *(*out)->Find(n);
    const std::optional<TensorRef> b = (*want)->Find(n);
    ASSERT_TRUE(b.has_value()) << n;
    EXPECT_EQ(a.info->dtype, b->info->dtype) << n;
    EXPECT_EQ(a.info->shape, b->info->shape) << n;
    EXPECT_TRUE(std::ranges::equal(a.bytes(), b->bytes())) << n;
  }
  const json hf = ReadJson(dir / "out" / "hf_quant_config.json");
  EXPECT_EQ(hf["quantization"]["quant_algo"], "W4A16_NVFP4");
  EXPECT_EQ(hf["quantization"]["exclude_modules"],
            json({"lm_head", "model.embed_tokens", "model.layers.0.mlp.router",
                  "model.layers.0.self_attn*", "model.layers.1.mlp.router",
                  "model.layers.1.self_attn*"}));
  const json config = ReadJson(dir / "out" / "config.json");
  EXPECT_EQ(config["quantization_config"]["quant_method"], "modelopt");
  EXPECT_EQ(config["quantization_config"]["ignore"], hf["quantization"]["exclude_modules"]);
  const FormatReport f = DetectFormat(**out);
  EXPECT_EQ(f.Describe(), "modelopt/nvfp4 (W4A16)");
  EXPECT_EQ(f.findings.total(), 0u) << f.findings.ToJson().dump();
  PairVerifyOptions po;
  po.threads = 2;
  auto pair = VerifyPair(**src, **out, po, NoProgress());
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_TRUE(pair->lossless);
  EXPECT_EQ(pair->mismatches.total(), 0u) << pair->mismatches.ToJson().dump();
  EXPECT_EQ(pair->windows.size(), 4u);
  for (const PairWindowCount& w : pair->windows) EXPECT_EQ(w.lossless_window, w.blocks) << w.tensor;
  // The committed export with its input scales is the same pair.
  auto committed = VerifyPair(**src, **want, po, NoProgress());
  ASSERT_TRUE(committed.ok()) << committed.status();
  EXPECT_TRUE(committed->lossless);
}

// The stream's unit is one stacked tensor: the smallest window and any thread count give the
// same bytes, held within the window.
TEST(TranscodeModelOptGptOss, SmallWindowAndThreadsGiveTheSameBytes) {
  TempDir dir;
  ASSERT_TRUE(ToModelOpt(Fixture("mini-gpt-oss-mxfp4"), dir / "whole").ok());
  for (unsigned threads : {1u, 3u}) {
    TranscodeOptions o;
    o.memory_window = kMinReadChunk;
    o.threads = threads;
    const fs::path out = dir / ("small-" + std::to_string(threads));
    auto small = ToModelOpt(Fixture("mini-gpt-oss-mxfp4"), out, o);
    ASSERT_TRUE(small.ok()) << small.status();
    EXPECT_LE(small->peak_kept_bytes, o.memory_window);
    EXPECT_EQ(Files(out), Files(dir / "whole")) << threads;
  }
}

// Layer 1 gate_up_proj: k_max -5 (byte 122); expert 2's fused row 5 (up row 2) block 1 is active
// with byte 114. Its index in the scales [4, 128, 3].
constexpr size_t kL1GateUpE2R5B1 = (2 * 128 + 5) * 3 + 1;
const std::string kL1GateUp = "model.layers.1.mlp.experts.gate_up_proj";

// A large E8M0 byte on one active block raises the tensor's k_max to 123: every other active
// block falls out of the window of the one weight_scale_2. Refused by the policy, naming the
// tensor, expert, row and block; nothing is published and nothing is left to resume.
TEST(TranscodeModelOptGptOss, LargeByteOnAnActiveBlockFailsNamingItAndPublishesNothing) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-gpt-oss-mxfp4", dir);
  MutateTensor(root, kL1GateUp + "_scales", [](uint8_t* p, size_t n) {
    ASSERT_EQ(n, 4u * 128 * 3);
    ASSERT_EQ(p[kL1GateUpE2R5B1], 114);
    p[kL1GateUpE2R5B1] = 250;
  });
  auto r = ToModelOpt(root, dir / "out");
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr("over-span: " + kL1GateUp + "[0] row 0 group 0 k=-5 k_max=123"));
  EXPECT_FALSE(fs::exists(dir / "out"));
  EXPECT_FALSE(fs::exists(dir / ".out.transcode-tmp"));
  EXPECT_FALSE(fs::exists(dir / ".out.transcode.lock"));
}

// The cast checks the window itself, whatever the policy passed: with a policy that allows a
// span of 18, a block 18 below k_max is refused by CastToModelOpt, never requantized.
TEST(TranscodeModelOptGptOss, CastRefusesABlockOutsideTheWindowEvenIfThePolicyPassedIt) {
  TempDir dir;
  const fs::path root = CopyFixture("mini-gpt-oss-mxfp4", dir);
  MutateTensor(root, kL1GateUp + "_scales", [](uint8_t* p, size_t) { p[kL1GateUpE2R5B1] = 104; });
  TranscodeOptions o;
  auto strict = ToModelOpt(root, dir / "strict", o);
  EXPECT_THAT(std::string(strict.status().message()),
              HasSubstr("over-span: " + kL1GateUp + "[2] row 5 group 1 k=-23 k_max=-5"));
  o.policy.max_span = 18;
  auto r = ToModelOpt(root, dir / "out", o);
  ASSERT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(std::string(r.status().message()),
              HasSubstr(kL1GateUp + " expert 2, up row 2, block 1: scale byte 104 is outside the "
                        "window of k_max -5"));
  for (const char* name : {"out", ".out.transcode-tmp", ".out.transcode.lock", "strict"}) {
    EXPECT_FALSE(fs::exists(dir / name)) << name;
  }
}

// The same publish and resume rules as every transcode: compressed-tensors' layout is refused
// up front; a run cut by a full disk keeps its temporary directory, and --resume finishes it
// to the bytes of an uninterrupted run.
TEST(TranscodeModelOptGptOss, RefusesTheOtherLayoutAndResumesACutRun) {
  TempDir dir;
  auto ct = TranscodeToNvfp4(Fixture("mini-gpt-oss-mxfp4").string(), (dir / "ct").string(), {},
                             NoProgress());
  ASSERT_EQ(ct.status().code(), absl::StatusCode::kInvalidArgument) << ct.status();
  EXPECT_THAT(std::string(ct.status().message()), HasSubstr("--layout modelopt"));
  EXPECT_FALSE(fs::exists(dir / "ct"));
  EXPECT_FALSE(fs::exists(dir / ".ct.transcode-tmp"));
  ASSERT_TRUE(ToModelOpt(Fixture("mini-gpt-oss-mxfp4"), dir / "want").ok());
  CutRun(Fixture("mini-gpt-oss-mxfp4"), dir, 128 << 10);
  TranscodeOptions o;
  o.threads = 1;
  o.resume = true;
  auto resumed = ToModelOpt(Fixture("mini-gpt-oss-mxfp4"), dir / "out", o);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->shards_redone, 1u);
  EXPECT_EQ(Files(dir / "out"), Files(dir / "want"));
}

}  // namespace
}  // namespace ckpt::quant
