// The CUDA block forward against the CPU reference (bf16 mode) and the float64 oracle, its
// bit-exactness across MXFP4 / NVFP4 / X4T weights and across re-runs, the upload of only the
// selected experts, and a mutated scale being seen. Skips, saying why, where no GPU is usable.
#include "gpu/block_forward_cuda.h"

#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>

#include "core/audit/forward_check.h"
#include "core/checkpoint.h"
#include "core/forward/block_io.h"
#include "core/forward/result_diff.h"
#include "core/quant/codecs.h"
#include "core/safetensors.h"
#include "gtest/gtest.h"
#include "tests/forward/fixture_mutation.h"
#include "tests/forward/synthetic_blocks.h"
#include "tests/quant/modelopt_fixture.h"
#include "tests/test_util.h"

namespace ckpt::gpu {
namespace {

using forward::BlockInput;
using forward::BlockResult;
using forward::Precision;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;

#define SKIP_WITHOUT_GPU()                                    \
  do {                                                        \
    if (absl::Status s_ = CudaAvailable(); !s_.ok()) {        \
      GTEST_SKIP() << "no GPU: " << s_.message();             \
    }                                                         \
  } while (0)

struct Loaded {
  std::unique_ptr<Checkpoint> ckpt;
  forward::BlockConfig config;
  forward::BlockWeights weights;
};

Loaded Load(const std::string& root) {
  Loaded l;
  auto c = Checkpoint::Open(root);
  EXPECT_TRUE(c.ok()) << c.status();
  l.ckpt = std::move(*c);
  l.config = *forward::ParseBlockConfig(l.ckpt->text_config(), 1);
  auto w = forward::LoadBlockWeights(*l.ckpt, l.config, 1);
  EXPECT_TRUE(w.ok()) << w.status();
  l.weights = std::move(*w);
  return l;
}

BlockInput OracleInput() {
  auto f = SafetensorsFile::Open(Fixture("oracle/mini-kimi-block-L1.safetensors").string());
  EXPECT_TRUE(f.ok());
  const TensorInfo* t = (*f)->Find("input");
  BlockInput in;
  in.tokens = t->shape[0];
  for (size_t i = 0; i < t->num_elements(); ++i) {
    uint16_t v;
    std::memcpy(&v, (*f)->Bytes(*t).data() + 2 * i, 2);
    in.values.push_back(quant::DecodeBF16(v));
  }
  return in;
}

std::vector<double> OracleTensor(const std::string& name) {
  auto f = SafetensorsFile::Open(Fixture("oracle/mini-kimi-block-L1.safetensors").string());
  const TensorInfo* t = (*f)->Find(name);
  std::vector<double> v(t->num_elements());
  std::memcpy(v.data(), (*f)->Bytes(*t).data(), v.size() * 8);
  return v;
}

void ExpectCloseToCpu(const BlockResult& gpu, const BlockResult& cpu, double tol,
                      const std::string& what) {
  EXPECT_EQ(gpu.topk_ids, cpu.topk_ids) << what;
  for (const auto& [name, a, b] :
       {std::tuple{"router_logits", &gpu.router_logits, &cpu.router_logits},
        std::tuple{"topk_weights", &gpu.topk_weights, &cpu.topk_weights},
        std::tuple{"latent_in", &gpu.latent_in, &cpu.latent_in},
        std::tuple{"latent_out_normed", &gpu.latent_out_normed, &cpu.latent_out_normed},
        std::tuple{"routed_out", &gpu.routed_out, &cpu.routed_out},
        std::tuple{"shared_out", &gpu.shared_out, &cpu.shared_out},
        std::tuple{"output", &gpu.output, &cpu.output}}) {
    ASSERT_EQ(a->size(), b->size()) << what << " " << name;
    const double rel = forward::MaxRelativeError(*a, *b);
    std::printf("[ measured ] %s %s: max relative error vs CPU bf16 = %.3e\n", what.c_str(), name,
                rel);
    EXPECT_LE(rel, tol) << what << " " << name;
  }
}

TEST(CudaForward, KimiMatchesCpuBf16AndOracle) {
  SKIP_WITHOUT_GPU();
  Loaded l = Load(Fixture("mini-kimi-mxfp4").string());
  const BlockInput in = OracleInput();
  auto gpu = RunBlockCuda(l.config, l.weights, in, Precision::kBF16);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto cpu = forward::RunBlockCpu(l.config, l.weights, in, Precision::kBF16);
  ASSERT_TRUE(cpu.ok());
  ExpectCloseToCpu(*gpu, *cpu, 1e-2, "mini-kimi L1");
  const double vs_oracle = forward::MaxRelativeError(gpu->output, OracleTensor("output"));
  std::printf("[ measured ] mini-kimi L1 output: max relative error vs f64 oracle = %.3e\n",
              vs_oracle);
  EXPECT_LE(vs_oracle, 5e-2);
}

TEST(CudaForward, FormatsGiveIdenticalBitsAndRerunsAreDeterministic) {
  SKIP_WITHOUT_GPU();
  const BlockInput in = forward::SeededInput(32, 256, 11);
  std::vector<double> first;
  for (const char* name : {"mini-kimi-mxfp4", "mini-kimi-nvfp4", "mini-kimi-x4t"}) {
    Loaded l = Load(Fixture(name).string());
    for (int run = 0; run < 3; ++run) {
      auto r = RunBlockCuda(l.config, l.weights, in, Precision::kBF16);
      ASSERT_TRUE(r.ok()) << name << ": " << r.status();
      if (first.empty()) first = r->output;
      EXPECT_EQ(r->output, first) << name << " run " << run;
    }
  }
}

// ModelOpt's weight_scale_2 is a multiplier (docs/formats.md §9): the kernel's scale table must
// multiply, or the converted fixture would not give the compressed-tensors fixture's bits.
TEST(CudaForward, ModelOptFixtureGivesTheSameBitsAsCompressedTensors) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  ASSERT_TRUE(quant::testing::WriteModelOptFixture(Fixture("mini-kimi-nvfp4"), dir / "mo").ok());
  const BlockInput in = forward::SeededInput(32, 256, 11);
  Loaded ct = Load(Fixture("mini-kimi-nvfp4").string());
  Loaded mo = Load((dir / "mo").string());
  auto a = RunBlockCuda(ct.config, ct.weights, in, Precision::kBF16);
  auto b = RunBlockCuda(mo.config, mo.weights, in, Precision::kBF16);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << " " << b.status();
  EXPECT_EQ(a->output, b->output);
  auto cpu = forward::RunBlockCpu(mo.config, mo.weights, in, Precision::kBF16);
  ASSERT_TRUE(cpu.ok());
  ExpectCloseToCpu(*b, *cpu, 1e-2, "modelopt L1");
}

TEST(CudaForward, UploadsOnlySelectedExperts) {
  SKIP_WITHOUT_GPU();
  Loaded l = Load(Fixture("mini-kimi-nvfp4").string());
  const BlockInput in = forward::SeededInput(2, 256, 5);
  CudaRunStats stats;
  auto r = RunBlockCuda(l.config, l.weights, in, Precision::kBF16, &stats);
  ASSERT_TRUE(r.ok()) << r.status();
  const std::set<int> selected(r->topk_ids.begin(), r->topk_ids.end());
  EXPECT_EQ(stats.experts_uploaded, static_cast<int>(selected.size()));
  EXPECT_LT(selected.size(), 16u);
  uint64_t bytes = 0;
  for (int e : selected) {
    for (const forward::Fp4Matrix* m : {&l.weights.experts[e].gate, &l.weights.experts[e].up,
                                        &l.weights.experts[e].down}) {
      bytes += m->packed.size() + m->scales.size();
    }
  }
  EXPECT_EQ(stats.expert_bytes_uploaded, bytes);
}

TEST(CudaForward, MutatedScaleOfSelectedExpertChangesOutput) {
  SKIP_WITHOUT_GPU();
  const BlockInput in = forward::SeededInput(8, 256, 7);
  Loaded src = Load(Fixture("mini-kimi-mxfp4").string());
  auto base = RunBlockCuda(src.config, src.weights, in, Precision::kBF16);
  ASSERT_TRUE(base.ok()) << base.status();
  // Double the first scale byte of an active group in row 0 of w1 of token 0's first expert.
  TempDir dir;
  const auto copy = CopyFixture("mini-kimi-mxfp4", dir);
  const std::string module = "language_model.model.layers.1.block_sparse_moe.experts." +
                             std::to_string(base->topk_ids[0]) + ".w1";
  {
    auto c = Checkpoint::Open(copy.string());
    ASSERT_TRUE(c.ok());
    auto scale = (*c)->Find(module + ".weight_scale");
    auto packed = (*c)->Find(module + ".weight_packed");
    int group = 0;
    while (true) {
      bool active = false;
      for (int k = 0; k < 16; ++k) active |= (packed->bytes()[group * 16 + k] & 0x77) != 0;
      if (active) break;
      ++group;
    }
    const uint64_t off = scale->file->data_start() + scale->info->begin + group;
    const char bumped = static_cast<char>(scale->bytes()[group] + 1);
    const std::string path = scale->file->path();
    c->reset();
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(off));
    f.write(&bumped, 1);
  }
  Loaded mutated = Load(copy.string());
  auto r = RunBlockCuda(mutated.config, mutated.weights, in, Precision::kBF16);
  ASSERT_TRUE(r.ok()) << r.status();
  const forward::ResultDiff d = forward::CompareResults(*base, *r, Precision::kBF16);
  EXPECT_FALSE(d.Find("output")->bitwise_equal());
  EXPECT_TRUE(d.Find("router_logits")->bitwise_equal());
}

TEST(CudaForward, SyntheticDeepSeekAndGptOssMatchCpu) {
  SKIP_WITHOUT_GPU();
  for (auto [name, block] : {std::pair{"deepseek_v3", forward::DeepSeekSynthetic()},
                             std::pair{"gpt_oss", forward::GptOssSynthetic()}}) {
    BlockInput in{3, {}};
    for (int i = 0; i < 3 * 32; ++i) in.values.push_back(((i * 5) % 9 - 4) * 0.5f);
    auto gpu = RunBlockCuda(block.config, block.weights, in, Precision::kBF16);
    ASSERT_TRUE(gpu.ok()) << name << ": " << gpu.status();
    auto cpu = forward::RunBlockCpu(block.config, block.weights, in, Precision::kBF16);
    ASSERT_TRUE(cpu.ok());
    ExpectCloseToCpu(*gpu, *cpu, 1e-2, name);
  }
}

TEST(CudaForward, AuditDeviceReportsPairIdenticalOnGpu) {
  SKIP_WITHOUT_GPU();
  for (const char* derived : {"mini-kimi-nvfp4", "mini-kimi-x4t"}) {
    forward::ForwardAuditOptions o;
    o.root = Fixture(derived).string();
    o.source = Fixture("mini-kimi-mxfp4").string();
    o.layer = 1;
    o.tokens = 8;
    o.seed = 3;
    o.precision = Precision::kBF16;
    auto r = audit::RunForward("", o, CudaDevice());
    ASSERT_TRUE(r.ok()) << r.status();
    const nlohmann::json r_json = r->report.ToJson();
    EXPECT_TRUE(r->passed) << r_json.dump(1);
    EXPECT_TRUE(r_json.contains("device_vs_cpu"));
    std::printf("[ measured ] %s vs mxfp4 on cuda: %s, device vs cpu output rel error %s\n",
                derived, r_json["verdict"].get<std::string>().c_str(),
                r_json["device_vs_cpu"]["max_relative_error"]["output"]
                    .get<std::string>().c_str());
  }
}

TEST(CudaForward, DeviceOpensOnlyWithAGpu) {
  if (absl::Status s = CudaAvailable(); !s.ok()) {
    // Never a silent CPU run: asking for the GPU without one is FAILED_PRECONDITION.
    EXPECT_EQ(OpenCudaDevice().status().code(), absl::StatusCode::kFailedPrecondition);
    GTEST_SKIP() << "no GPU: " << s.message();
  }
  auto d = OpenCudaDevice();
  ASSERT_TRUE(d.ok()) << d.status();
  ASSERT_TRUE(d->gpu.has_value());
  EXPECT_FALSE(d->gpu->name.empty());
  EXPECT_NE(d->gpu->sm.find('.'), std::string::npos);
  std::printf("[ measured ] GPU %s, sm %s, driver %s, CUDA runtime %s\n", d->gpu->name.c_str(),
              d->gpu->sm.c_str(), d->gpu->driver.c_str(), d->gpu->cuda.c_str());
}

forward::ForwardAuditOptions ModelOptions(const std::string& derived) {
  forward::ForwardAuditOptions o;
  o.root = derived;
  o.source = Fixture("mini-kimi-mxfp4").string();
  o.tokens = 8;
  o.seed = 11;
  o.precision = Precision::kBF16;
  return o;
}

TEST(CudaForward, EveryFixtureLayerAgreesWithCpuAndSource) {
  SKIP_WITHOUT_GPU();
  for (const char* derived : {"mini-kimi-nvfp4", "mini-kimi-x4t"}) {
    auto r = audit::RunForward("all", ModelOptions(Fixture(derived).string()),
                                      CudaDevice());
    ASSERT_TRUE(r.ok()) << r.status();
    const nlohmann::json r_json = r->report.ToJson();
    EXPECT_TRUE(r->passed) << r_json.dump(1);
    ASSERT_EQ(r_json["layers"].size(), 2u);
    for (const auto& layer : r_json["layers"]) {
      EXPECT_EQ(layer["verdict"], "bit-identical");
      EXPECT_TRUE(layer["determinism"]["bitwise_equal"]);
      EXPECT_TRUE(layer["device_vs_cpu"]["topk_ids_equal"]);
      const double rel =
          std::stod(layer["device_vs_cpu"]["max_relative_error"]["output"].get<std::string>());
      EXPECT_LT(rel, 1e-4) << "layer " << layer["layer"];
      std::printf("[ measured ] %s layer %d on cuda: %s, device vs cpu output rel error %.3g\n",
                  derived, layer["layer"].get<int>(), layer["verdict"].get<std::string>().c_str(),
                  rel);
    }
  }
}

// gpt-oss's ModelOpt NVFP4 export reaches the kernels as the row-major NVFP4 matrices they take
// (core/forward/block_weights.h, the layout maps of core/quant/gpt_oss_layout.h): every layer on
// the GPU gives the bits of the MXFP4 source on the GPU, re-runs agree, and the CPU bf16 mode
// agrees within 1e-4 with equal top-k ids; the lossy export differs on every layer.
TEST(CudaForward, GptOssModelOptExportGivesTheMxfp4SourceBits) {
  SKIP_WITHOUT_GPU();
  for (const char* derived : {"mini-gpt-oss-modelopt-nvfp4", "mini-gpt-oss-modelopt-lossy"}) {
    const bool lossless = std::string(derived) == "mini-gpt-oss-modelopt-nvfp4";
    forward::ForwardAuditOptions o = ModelOptions(Fixture(derived).string());
    o.source = Fixture("mini-gpt-oss-mxfp4").string();
    auto r = audit::RunForward("all", o, CudaDevice());
    ASSERT_TRUE(r.ok()) << derived << ": " << r.status();
    const nlohmann::json r_json = r->report.ToJson();
    EXPECT_EQ(r->passed, lossless) << r_json.dump(1);
    ASSERT_EQ(r_json["layers"].size(), 2u);
    for (const auto& layer : r_json["layers"]) {
      EXPECT_EQ(layer["verdict"], lossless ? "bit-identical" : "different") << derived;
      EXPECT_TRUE(layer["determinism"]["bitwise_equal"]);
      EXPECT_TRUE(layer["device_vs_cpu"]["topk_ids_equal"]);
      const double rel =
          std::stod(layer["device_vs_cpu"]["max_relative_error"]["output"].get<std::string>());
      EXPECT_LT(rel, 1e-4) << derived << " layer " << layer["layer"];
      std::printf("[ measured ] %s layer %d on cuda: %s, device vs cpu output rel error %.3g\n",
                  derived, layer["layer"].get<int>(), layer["verdict"].get<std::string>().c_str(),
                  rel);
    }
  }
}

TEST(CudaForward, VllmW13CollapseEmulationOnGpu) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  const auto copy = CopyFixture("mini-kimi-nvfp4", dir);
  for (int e = 0; e < 16; ++e) {
    forward::HalveGlobalAndBlockScales(
        copy, "language_model.model.layers.1.block_sparse_moe.experts." + std::to_string(e) +
                  ".w3");
  }
  for (const bool mutated : {false, true}) {
    forward::ForwardAuditOptions o =
        ModelOptions(mutated ? copy.string() : Fixture("mini-kimi-nvfp4").string());
    o.emulation = forward::Emulation::kVllmW13Collapse;
    auto r = audit::RunForward("all", o, CudaDevice());
    ASSERT_TRUE(r.ok()) << r.status();
    const nlohmann::json r_json = r->report.ToJson();
    EXPECT_TRUE(r->passed) << "lossless on disk";
    EXPECT_EQ(r->emulation_differs, mutated);
    const auto& l1 = r_json["summary"][0];
    EXPECT_EQ(l1["emulated_verdict"], mutated ? "different" : "bit-identical");
    EXPECT_EQ(r_json["summary"][1]["emulated_verdict"], "bit-identical");
    std::printf("[ measured ] vllm-w13-collapse on cuda, %s fixture, layer 1: %s output "
                "elements differ, max |diff| %s\n",
                mutated ? "mutated" : "original",
                l1["emulated_output_differing_elements"].dump().c_str(),
                l1["emulated_output_max_abs_diff"].get<std::string>().c_str());
  }
}

TEST(CudaForward, RejectsPrecisionOtherThanBf16) {
  SKIP_WITHOUT_GPU();
  Loaded l = Load(Fixture("mini-kimi-mxfp4").string());
  EXPECT_EQ(RunBlockCuda(l.config, l.weights, forward::SeededInput(1, 256, 0), Precision::kF64)
                .status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt::gpu
