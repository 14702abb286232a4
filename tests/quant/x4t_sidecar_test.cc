// X4T container A (per-layer sidecar): a sidecar built from the source fixture's layer 1 is
// detected, passes its contract and decodes to the source tensors; contract breaks are named.
#include "core/quant/x4t_sidecar.h"

#include <cstring>
#include <filesystem>
#include <functional>

#include "core/checkpoint.h"
#include "core/quant/format.h"
#include "core/quant/safetensors_writer.h"
#include "core/quant/x4t_codec.h"
#include "gtest/gtest.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using ::ckpt::quant::testing::Detect;
using ::ckpt::quant::testing::kExpert;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;

std::vector<uint8_t> I64Bytes(const std::vector<int64_t>& v) {
  std::vector<uint8_t> b(v.size() * 8);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Writes x4t-layer-00001.safetensors for layer 1 of the source fixture into `root`, its tensors
// passed through `edit` first.
void WriteSidecar(const fs::path& root, std::map<std::string, std::string> metadata,
                  const std::function<void(std::vector<TensorToWrite>&)>& edit = {}) {
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(src.ok());
  std::vector<TensorToWrite> out;
  std::vector<uint8_t> ids;
  for (int32_t e = 0; e < 16; ++e) ids.insert(ids.end(), {uint8_t(e), 0, 0, 0});
  out.push_back(TensorToWrite::Owned("expert_ids", DType::kI32, {16}, ids));
  for (const std::string m : {"w1", "w3", "w2"}) {
    std::vector<uint8_t> packed, fixed, exc;
    std::vector<int64_t> offsets = {0};
    uint64_t rows = 0, cols = 0;
    for (int e = 0; e < 16; ++e) {
      auto w = ResolveWeight(**src, kExpert + std::to_string(e) + "." + m);
      ASSERT_TRUE(w.ok());
      rows = w->rows, cols = w->cols;
      auto p = w->packed.bytes();
      std::vector<uint8_t> pb(p.begin(), p.end());
      if (m == "w2") pb = PermuteGroupMajor(pb, rows, cols / 32);
      packed.insert(packed.end(), pb.begin(), pb.end());
      auto enc = EncodeX4TScalePlane(w->scale.bytes(), rows, cols / 32);
      ASSERT_TRUE(enc.ok());
      fixed.insert(fixed.end(), enc->fixed.begin(), enc->fixed.end());
      exc.insert(exc.end(), enc->exceptions.begin(), enc->exceptions.end());
      offsets.push_back(static_cast<int64_t>(exc.size() / 4));
    }
    std::vector<uint64_t> pshape = m == "w2" ? std::vector<uint64_t>{16, cols / 32, rows, 16}
                                             : std::vector<uint64_t>{16, rows, cols / 2};
    const uint64_t per_fixed = fixed.size() / 16;
    out.push_back(TensorToWrite::Owned(m + ".packed", DType::kU8, pshape, packed));
    out.push_back(TensorToWrite::Owned(m + ".scale_fixed", DType::kU8, {16, per_fixed}, fixed));
    out.push_back(TensorToWrite::Owned(m + ".scale_exceptions", DType::kU8, {exc.size()}, exc));
    out.push_back(TensorToWrite::Owned(m + ".scale_exception_offsets", DType::kI64, {17},
                                       I64Bytes(offsets)));
  }
  if (edit) edit(out);
  ASSERT_TRUE(WriteSafetensors((root / "x4t-layer-00001.safetensors").string(), std::move(out),
                               metadata).ok());
}

std::map<std::string, std::string> GoodMetadata() {
  return {{"schema", "kquant_x4t_layer_v1"}, {"version", "2"}, {"layer", "1"},
          {"experts", "16"}, {"expert_capacity", "896"}, {"matrix_order", "w1,w3,w2"},
          {"scale_codec", "x4t-adjacent-pair-fixed-stream-v1"},
          {"w2_packed_layout", "group-major-32-channel-v1"},
          {"exact_mxfp4_reconstruction", "true"}};
}

TEST(X4TSidecar, BuiltFromTheSourceDecodesToIt) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  WriteSidecar(root, GoodMetadata());
  FormatReport r = Detect(root);
  EXPECT_EQ(r.x4t_sidecars, 1u);
  EXPECT_EQ(r.findings.total(), 0u) << r.findings.ToJson().dump(2);
  EXPECT_EQ(r.Describe(), "compressed-tensors/mxfp4-pack-quantized + 1 X4T layer sidecar(s)");
  auto f = SafetensorsFile::Open((root / "x4t-layer-00001.safetensors").string());
  auto src = Checkpoint::Open(Fixture("mini-kimi-mxfp4").string());
  ASSERT_TRUE(f.ok() && src.ok());
  auto m = ReadX4TSidecarMatrix(**f, "w2", 7);
  ASSERT_TRUE(m.ok()) << m.status();
  auto p = (*src)->Find(kExpert + "7.w2.weight_packed")->bytes();
  auto s = (*src)->Find(kExpert + "7.w2.weight_scale")->bytes();
  EXPECT_TRUE(std::equal(p.begin(), p.end(), m->weight_packed.begin(), m->weight_packed.end()));
  EXPECT_TRUE(std::equal(s.begin(), s.end(), m->weight_scale.begin(), m->weight_scale.end()));
  EXPECT_EQ(ReadX4TSidecarMatrix(**f, "w1", 16).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(X4TSidecar, ContractBreaksAreNamed) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  auto md = GoodMetadata();
  md["version"] = "1";
  md["layer"] = "0";        // the dense layer
  md["experts"] = "15";     // config says 16
  WriteSidecar(root, md);
  FormatReport r = Detect(root);
  EXPECT_EQ(r.findings.count("sidecar-metadata"), 1u) << r.findings.ToJson().dump(2);
  EXPECT_GE(r.findings.count("sidecar-geometry"), 2u);
}

// A sidecar whose tensors break the contract: expert_ids not I32, w3.packed missing, and w1's
// exception offsets pointing far past its exception bytes for expert 5 (only the last offset
// used to be checked: the read ran off the mapped file). Each is a sidecar-tensor finding on
// the file, naming the tensor.
TEST(X4TSidecar, TensorsThatAreMissingMisTypedOrDoNotDecodeAreNamed) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-mxfp4", dir);
  WriteSidecar(root, GoodMetadata(), [](std::vector<TensorToWrite>& t) {
    std::erase_if(t, [](const TensorToWrite& x) { return x.name == "w3.packed"; });
    for (TensorToWrite& x : t) {
      if (x.name == "expert_ids") x.dtype = DType::kU32;
      if (x.name == "w1.scale_exception_offsets") {
        int64_t v;
        std::memcpy(&v, x.owned.data() + 6 * 8, 8);
        v += int64_t{1} << 40;  // far past the mapped file
        std::memcpy(x.owned.data() + 6 * 8, &v, 8);
      }
    }
  });
  const FormatReport r = Detect(root);
  ASSERT_EQ(r.findings.count("sidecar-tensor"), 3u) << r.findings.ToJson().dump(2);
  EXPECT_EQ(r.findings.total(), 3u) << r.findings.ToJson().dump(2);
  std::vector<std::string> messages;
  for (const Finding& f : r.findings.kept()) {
    EXPECT_EQ(f.tensor, (root / "x4t-layer-00001.safetensors").string());
    messages.push_back(f.message);
  }
  EXPECT_EQ(messages[0], "expert_ids must be I32 [experts]");
  EXPECT_EQ(messages[1], (root / "x4t-layer-00001.safetensors").string() +
                             ": w1 slot 5: w1.scale_exception_offsets are not prefix sums of "
                             "the exception stream");
  EXPECT_EQ(messages[2], "w3.packed missing or not [experts, ...]");
}

}  // namespace
}  // namespace ckpt::quant
