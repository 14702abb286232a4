// The forward diff audit on the fixture pairs: MXFP4 source vs NVFP4 and X4T derived
// checkpoints give bit-identical block outputs; a derived copy with one scale of a selected
// expert off by a power of two does not, and the report says where.
#include "core/forward/forward_audit.h"

#include <fstream>

#include "core/forward/block_io.h"
#include "core/forward/result_diff.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "tests/forward/fixture_mutation.h"
#include "tests/test_util.h"

namespace ckpt::forward {
namespace {

using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;

ForwardAuditOptions PairOptions(const std::string& derived, Precision p) {
  ForwardAuditOptions o;
  o.root = derived;
  o.source = Fixture("mini-kimi-mxfp4").string();
  o.layer = 1;
  o.tokens = 8;
  o.seed = 7;
  o.precision = p;
  return o;
}

TEST(ForwardAudit, Nvfp4AndX4TAreBitIdenticalToSource) {
  for (const char* derived : {"mini-kimi-nvfp4", "mini-kimi-x4t"}) {
    for (Precision p : {Precision::kF64, Precision::kF32, Precision::kBF16}) {
      auto r = RunForwardAudit(PairOptions(Fixture(derived).string(), p), CpuDevice());
      ASSERT_TRUE(r.ok()) << derived << ": " << r.status();
      EXPECT_TRUE(r->passed) << derived << " " << PrecisionName(p) << "\n" << r->report.dump(1);
      EXPECT_EQ(r->report["verdict"], "bit-identical");
      EXPECT_EQ(r->report["source"]["output_sha256"], r->report["derived"]["output_sha256"]);
      EXPECT_EQ(r->report["source_vs_derived"]["tensors"]["output"]["ulp_histogram"]["0"],
                8 * 256);
      EXPECT_TRUE(r->report["determinism"]["bitwise_equal"]);
    }
  }
}

TEST(ForwardAudit, ReportHasNoFloatingPointNumbers) {
  auto r = RunForwardAudit(PairOptions(Fixture("mini-kimi-nvfp4").string(), Precision::kF32),
                           CpuDevice());
  ASSERT_TRUE(r.ok()) << r.status();
  std::function<void(const nlohmann::json&)> walk = [&](const nlohmann::json& j) {
    EXPECT_FALSE(j.is_number_float()) << j.dump();
    if (j.is_structured()) for (const auto& e : j) walk(e);
  };
  walk(r->report);
}

TEST(ForwardAudit, MutatedSelectedExpertScaleIsReported) {
  // Which experts the seeded input selects, from the source run.
  auto base = RunForwardAudit(PairOptions(Fixture("mini-kimi-nvfp4").string(), Precision::kF64),
                              CpuDevice());
  ASSERT_TRUE(base.ok()) << base.status();
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(src.ok());
  auto cfg = ParseBlockConfig((*src)->text_config(), 1);
  auto w = LoadBlockWeights(**src, *cfg, 1);
  ASSERT_TRUE(w.ok());
  auto run = RunBlockCpu(*cfg, *w, SeededInput(8, 256, 7), Precision::kF64);
  ASSERT_TRUE(run.ok());
  const int selected = run->topk_ids[0];

  TempDir dir;
  const auto copy = CopyFixture("mini-kimi-nvfp4", dir);
  ScaleOneByPowerOfTwo(copy, "language_model.model.layers.1.block_sparse_moe.experts." +
                           std::to_string(selected) + ".w1");
  for (Precision p : {Precision::kF64, Precision::kBF16}) {
    auto r = RunForwardAudit(PairOptions(copy.string(), p), CpuDevice());
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->passed);
    EXPECT_EQ(r->report["verdict"], "different");
    const auto& out = r->report["source_vs_derived"]["tensors"]["output"];
    EXPECT_FALSE(out["bitwise_equal"]);
    EXPECT_GT(out["differing_elements"].get<uint64_t>(), 0u);
    EXPECT_NE(out["max_abs_diff"], "0");
    EXPECT_LT(out["ulp_histogram"]["0"].get<uint64_t>(), 8u * 256u);
    // Routing does not see expert weights: the router is identical.
    EXPECT_TRUE(r->report["source_vs_derived"]["tensors"]["router_logits"]["bitwise_equal"]);
    EXPECT_NE(r->report["source"]["output_sha256"], r->report["derived"]["output_sha256"]);
  }
}

TEST(ForwardAudit, OutputFileRoundTripsThroughStrictReader) {
  TempDir dir;
  ForwardAuditOptions o = PairOptions(Fixture("mini-kimi-nvfp4").string(), Precision::kF32);
  o.output_path = (dir / "out.safetensors").string();
  auto r = RunForwardAudit(o, CpuDevice());
  ASSERT_TRUE(r.ok()) << r.status();
  auto f = SafetensorsFile::Open(o.output_path);
  ASSERT_TRUE(f.ok()) << f.status();
  for (const std::string& name : BlockTensorNames()) {
    const TensorInfo* t = (*f)->Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->dtype, name == "topk_ids" ? DType::kI32 : DType::kF32);
  }
  EXPECT_EQ(ToHex(Sha256Of((*f)->Bytes(*(*f)->Find("output")))),
            r->report["derived"]["output_sha256"]);
  // The written input feeds back in and reproduces the run.
  ForwardAuditOptions again = o;
  again.input_path = o.output_path;
  again.output_path.clear();
  auto r2 = RunForwardAudit(again, CpuDevice());
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_EQ(r2->report["derived"]["output_sha256"], r->report["derived"]["output_sha256"]);
  EXPECT_EQ(r2->report["input"]["sha256"], r->report["input"]["sha256"]);
}

TEST(ForwardAudit, ErrorsAreStatuses) {
  ForwardAuditOptions o = PairOptions(Fixture("mini-kimi-nvfp4").string(), Precision::kF64);
  o.layer = 0;  // dense
  EXPECT_EQ(RunForwardAudit(o, CpuDevice()).status().code(), absl::StatusCode::kInvalidArgument);
  o.layer = 1;
  o.input_path = Fixture("malformed/valid_e8m0.safetensors").string();
  EXPECT_EQ(RunForwardAudit(o, CpuDevice()).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ResultDiff, UlpHistogramCountsFloatSteps) {
  BlockResult a, b;
  a.output = {1.0, 1.0, 1.0, -2.0};
  const float one = 1.0f;
  b.output = {1.0, std::nextafter(one, 2.0f), 1.0 + 8 * std::numeric_limits<float>::epsilon(),
              -2.0};
  ResultDiff d = CompareResults(a, b, Precision::kF32);
  const TensorDiff* t = d.Find("output");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->differing, 2u);
  EXPECT_EQ(t->ulp_histogram[0], 2u);
  EXPECT_EQ(t->ulp_histogram[1], 1u);
  EXPECT_EQ(t->ulp_histogram[3], 1u);  // 8 ULPs
  EXPECT_FALSE(d.bitwise_equal());
}

}  // namespace
}  // namespace ckpt::forward
