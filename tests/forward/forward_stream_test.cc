// The block forward read in units (core/forward/forward_stream.h; docs/forward.md, "Streamed"):
// in a memory window smaller than one layer of the fixture pair (but larger than one expert on
// both trees) the forward and the audit give the results of an unbounded run, within the window;
// the streamed units give the bits of a whole-block run; an expert no token routes to is never
// loaded.
#include "core/forward/forward_stream.h"

#include <set>

#include "core/audit/audit_checks.h"
#include "core/audit/forward_check.h"
#include "core/forward/block_io.h"
#include "core/forward/result_diff.h"
#include "core/sha256.h"
#include "core/text/json_dump.h"
#include "gtest/gtest.h"
#include "tests/forward/fixture_mutation.h"
#include "tests/test_util.h"

namespace ckpt::forward {
namespace {

using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;

constexpr uint64_t kWindow = 3ull << 19;
// The audit adds the pair check's units, which hold the same tensors at other times (the
// fixture's shared expert is a third of this window on both trees).
constexpr uint64_t kAuditWindow = 3ull << 19;
constexpr uint64_t kUnbounded = 1ull << 32;
constexpr char kExperts[] = "language_model.model.layers.1.block_sparse_moe.experts.";

// Tensor bytes of layer `layer` in a checkpoint.
uint64_t LayerBytes(const std::string& root, int layer, const std::string& under = "") {
  auto ckpt = Checkpoint::Open(root);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  const std::string mark = "layers." + std::to_string(layer) + "." + under;
  uint64_t bytes = 0;
  for (const std::string& name : (*ckpt)->TensorNames()) {
    if (name.find(mark) != std::string::npos) bytes += (*ckpt)->Find(name)->info->num_bytes();
  }
  return bytes;
}

// The audit of the pair with the forward of every layer, in `window`.
absl::StatusOr<evidence::EvidenceRecord> AuditPair(const std::string& derived,
                                                   const std::string& source, uint64_t window,
                                                   audit::AuditStats* stats) {
  audit::AuditOptions o;
  o.root = derived;
  o.source = source;
  o.forward_layers = "all";
  o.memory_window = window;
  o.threads = 3;
  return audit::RunAudit(o, NoProgress(), stats);
}

ForwardAuditOptions Options(const std::string& derived, uint64_t window) {
  ForwardAuditOptions o;
  o.root = derived;
  o.source = Fixture("mini-kimi-mxfp4").string();
  o.tokens = 8;
  o.seed = 5;
  o.precision = Precision::kBF16;
  o.emulation = Emulation::kVllmW13Collapse;
  o.memory_window = window;
  o.threads = 3;
  return o;
}

TEST(ForwardStream, WindowSmallerThanOneLayerGivesTheUnboundedReport) {
  const std::string mxfp4 = Fixture("mini-kimi-mxfp4").string();
  const std::string nvfp4 = Fixture("mini-kimi-nvfp4").string();
  // The window holds one expert of both trees, not one layer of either.
  ASSERT_LT(kWindow, LayerBytes(nvfp4, 1) + LayerBytes(mxfp4, 1));
  ASSERT_GT(kWindow, 4 * (LayerBytes(nvfp4, 1, "block_sparse_moe.experts.0.") +
                          LayerBytes(mxfp4, 1, "block_sparse_moe.experts.0.")));
  for (const char* derived : {"mini-kimi-nvfp4", "mini-kimi-x4t"}) {
    ForwardReadStats small, large;
    auto bounded = audit::RunForward("all", Options(Fixture(derived).string(), kWindow),
                                   CpuDevice(), &small);
    ASSERT_TRUE(bounded.ok()) << derived << ": " << bounded.status();
    auto unbounded = audit::RunForward("all", Options(Fixture(derived).string(), kUnbounded),
                                     CpuDevice(), &large);
    ASSERT_TRUE(unbounded.ok()) << derived << ": " << unbounded.status();
    EXPECT_TRUE(bounded->passed) << derived;
    EXPECT_EQ(DumpJson(bounded->report.ToJson()), DumpJson(unbounded->report.ToJson()));
    EXPECT_LE(small.peak_kept_bytes, kWindow) << derived;
    EXPECT_GT(small.peak_kept_bytes, 0u);
    EXPECT_EQ(small.bytes_read, large.bytes_read);
    std::printf("[ measured ] forward --layers all, %s vs mxfp4: peak %llu bytes in a %llu-byte "
                "window (unbounded: %llu), %llu bytes read\n",
                derived, static_cast<unsigned long long>(small.peak_kept_bytes),
                static_cast<unsigned long long>(kWindow),
                static_cast<unsigned long long>(large.peak_kept_bytes),
                static_cast<unsigned long long>(small.bytes_read));
  }
}

TEST(ForwardStream, AuditInAWindowSmallerThanOneLayerEqualsTheUnboundedRun) {
  TempDir dir;
  const auto source = CopyFixture("mini-kimi-mxfp4", dir);
  const auto derived = CopyFixture("mini-kimi-nvfp4", dir);
  ASSERT_LT(kAuditWindow, LayerBytes(derived.string(), 1));
  ASSERT_LT(kAuditWindow, LayerBytes(source.string(), 1));
  audit::AuditStats small, large;
  auto bounded = AuditPair(derived.string(), source.string(), kAuditWindow, &small);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  auto unbounded = AuditPair(derived.string(), source.string(), kUnbounded, &large);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  EXPECT_EQ(bounded->OverallVerdict(), evidence::Verdict::kPass);
  ASSERT_TRUE(bounded->block_forward.has_value());
  EXPECT_EQ(bounded->block_forward->layers.size(), 2u);
  EXPECT_EQ(DumpJson(bounded->block_forward->ToJson()),
            DumpJson(unbounded->block_forward->ToJson()));
  EXPECT_LE(small.peak_kept_bytes, kAuditWindow);
  EXPECT_EQ(small.bytes_read, large.bytes_read);
}

// gpt-oss reads a layer's experts as one stacked unit, in the layout each tree stores
// (forward_stream.h): ModelOpt's export against its MXFP4 source, forward and audit, in a window
// smaller than one layer of the two trees (but holding the stacked unit of both) give the
// default window's report, within the window.
TEST(ForwardStream, GptOssModelOptInAWindowSmallerThanOneLayerEqualsTheDefault) {
  constexpr uint64_t kGptOssWindow = 144ull << 10;
  const std::string source = Fixture("mini-gpt-oss-mxfp4").string();
  const std::string derived = Fixture("mini-gpt-oss-modelopt-nvfp4").string();
  ASSERT_LT(kGptOssWindow, LayerBytes(derived, 0) + LayerBytes(source, 0));
  ASSERT_GT(kGptOssWindow, LayerBytes(derived, 0, "mlp.experts.") +
                               LayerBytes(source, 0, "mlp.experts."));
  ForwardAuditOptions o = Options(derived, kGptOssWindow);
  o.source = source;
  ForwardReadStats small, large;
  auto bounded = audit::RunForward("all", o, CpuDevice(), &small);
  ASSERT_TRUE(bounded.ok()) << bounded.status();
  o.memory_window = ForwardAuditOptions().memory_window;
  auto unbounded = audit::RunForward("all", o, CpuDevice(), &large);
  ASSERT_TRUE(unbounded.ok()) << unbounded.status();
  EXPECT_TRUE(bounded->passed) << DumpJson(bounded->report.ToJson());
  EXPECT_EQ(bounded->report.layers.size(), 2u);
  EXPECT_EQ(DumpJson(bounded->report.ToJson()), DumpJson(unbounded->report.ToJson()));
  EXPECT_LE(small.peak_kept_bytes, kGptOssWindow);
  EXPECT_EQ(small.bytes_read, large.bytes_read);
  std::printf("[ measured ] forward --layers all, gpt-oss modelopt vs mxfp4: peak %llu bytes in a "
              "%llu-byte window (default window: %llu)\n",
              static_cast<unsigned long long>(small.peak_kept_bytes),
              static_cast<unsigned long long>(kGptOssWindow),
              static_cast<unsigned long long>(large.peak_kept_bytes));

  audit::AuditStats audit_small, audit_large;
  auto audit_bounded = AuditPair(derived, source, kGptOssWindow, &audit_small);
  ASSERT_TRUE(audit_bounded.ok()) << audit_bounded.status();
  auto audit_default =
      AuditPair(derived, source, audit::AuditOptions().memory_window, &audit_large);
  ASSERT_TRUE(audit_default.ok()) << audit_default.status();
  EXPECT_EQ(audit_bounded->OverallVerdict(), evidence::Verdict::kPass);
  ASSERT_TRUE(audit_bounded->block_forward.has_value());
  EXPECT_EQ(audit_bounded->block_forward->layers.size(), 2u);
  EXPECT_EQ(DumpJson(audit_bounded->block_forward->ToJson()),
            DumpJson(audit_default->block_forward->ToJson()));
  EXPECT_LE(audit_small.peak_kept_bytes, kGptOssWindow);
}

// Each unit's rows, combined in top-k order by the last unit, give a whole-block run's bits.
TEST(ForwardStream, UnitsGiveTheWholeBlockBits) {
  const std::string root = Fixture("mini-kimi-nvfp4").string();
  auto ckpt = Checkpoint::Open(root);
  ASSERT_TRUE(ckpt.ok());
  for (Precision p : {Precision::kF64, Precision::kF32, Precision::kBF16}) {
    ForwardAuditOptions o = Options(root, kWindow);
    o.precision = p;
    for (int layer : {1, 2}) {
      o.layer = layer;
      auto streamed = audit::RunForward("", o, CpuDevice());
      ASSERT_TRUE(streamed.ok()) << streamed.status();
      auto cfg = ParseBlockConfig((*ckpt)->text_config(), layer);
      auto w = LoadBlockWeights(**ckpt, *cfg, layer);
      ASSERT_TRUE(w.ok()) << w.status();
      auto whole = RunBlockCpu(*cfg, *w, SeededInput(8, 256, 5), p);
      ASSERT_TRUE(whole.ok());
      const evidence::ForwardRun& run = streamed->report.layers.front().derived;
      for (const auto& [name, sha] : run.tensor_sha256) {
        EXPECT_EQ(sha, ToHex(Sha256Of(TensorBytes(*whole, name, p))))
            << name << " layer " << layer << " " << PrecisionName(p);
      }
    }
  }
}

// An expert that no token routes to is never loaded: a NaN scale on an active group of every
// unselected expert (DATA_LOSS if it were loaded) leaves the forward bit-identical.
TEST(ForwardStream, UnselectedExpertsAreNeverLoaded) {
  const std::string original = Fixture("mini-kimi-nvfp4").string();
  ForwardAuditOptions o = Options(original, kWindow);
  o.layer = 1;
  o.tokens = 1;
  auto base = audit::RunForward("", o, CpuDevice());
  ASSERT_TRUE(base.ok()) << base.status();
  auto ckpt = Checkpoint::Open(original);
  ASSERT_TRUE(ckpt.ok());
  auto cfg = ParseBlockConfig((*ckpt)->text_config(), 1);
  auto w = LoadBlockWeights(**ckpt, *cfg, 1);
  auto run = RunBlockCpu(*cfg, *w, SeededInput(1, 256, 5), Precision::kBF16);
  ASSERT_TRUE(run.ok());
  const std::set<int> selected(run->topk_ids.begin(), run->topk_ids.end());
  ASSERT_LT(selected.size(), 16u);

  TempDir dir;
  const auto copy = CopyFixture("mini-kimi-nvfp4", dir);
  for (int e = 0; e < 16; ++e) {
    if (!selected.count(e)) PoisonFirstActiveScale(copy, kExperts + std::to_string(e) + ".w1");
  }
  o.root = copy.string();
  auto poisoned = audit::RunForward("", o, CpuDevice());
  ASSERT_TRUE(poisoned.ok()) << poisoned.status();
  EXPECT_TRUE(poisoned->passed);
  EXPECT_EQ(poisoned->report.layers.front().derived.tensor_sha256,
            base->report.layers.front().derived.tensor_sha256);

  // The same poison on a selected expert is seen (the expert is loaded and validated).
  PoisonFirstActiveScale(copy, kExperts + std::to_string(*selected.begin()) + ".w1");
  auto seen = audit::RunForward("", o, CpuDevice());
  EXPECT_EQ(seen.status().code(), absl::StatusCode::kDataLoss) << seen.status();
}

}  // namespace
}  // namespace ckpt::forward

namespace ckpt {
namespace {

// core/io/tree_stream.h, dependent work: an item that is not wanted never runs and never gets
// memory for its tensors; an `after` must name an earlier item.
TEST(StreamDependentWork, DroppedWorkNeverHoldsItsTensors) {
  ReadOptions read = Checkpoint::ReadOnly();
  read.keep = ReadOptions::Keep::kStreamTensorData;
  read.threads = 2;
  auto opened = Checkpoint::Open(::ckpt::testing::Fixture("mini-kimi-nvfp4").string(), read);
  ASSERT_TRUE(opened.ok()) << opened.status();
  std::shared_ptr<const Checkpoint> ckpt = *std::move(opened);
  const std::shared_ptr<const TreeImage> image(ckpt, &ckpt->image());
  const std::string block = "language_model.model.layers.1.block_sparse_moe.";
  auto tensor = [&](const std::string& name) {
    std::optional<TensorRef> t = ckpt->Find(block + name);
    EXPECT_TRUE(t.has_value()) << name;
    return std::pair{t->file, t->info};
  };
  const auto router = tensor("gate.weight");
  const auto dropped = tensor("shared_experts.up_proj.weight");
  const auto kept = tensor("shared_experts.down_proj.weight");
  bool ran_dropped = false, ran_kept = false;
  auto work = [&] {
    std::vector<StreamWork> w;
    w.push_back({"router", {router}, [] { return absl::OkStatus(); }});
    w.push_back({"dropped", {dropped}, [&] { ran_dropped = true; return absl::OkStatus(); }, {0}});
    w.back().wanted = [] { return false; };
    w.push_back({"kept", {kept}, [&] { ran_kept = true; return absl::OkStatus(); }, {0}});
    w.back().wanted = [] { return true; };
    return w;
  };
  auto streamed = StreamTrees({image}, work(), read, NoProgress());
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_FALSE(ran_dropped);
  EXPECT_TRUE(ran_kept);
  EXPECT_LE(streamed->peak_kept_bytes,
            image->kept_bytes + router.second->num_bytes() + kept.second->num_bytes());
  EXPECT_GT(streamed->peak_kept_bytes, image->kept_bytes);

  std::vector<StreamWork> backwards = work();
  backwards[0].after = {1};
  EXPECT_EQ(StreamTrees({image}, std::move(backwards), read, NoProgress()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ckpt
