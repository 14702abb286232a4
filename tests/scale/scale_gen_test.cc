// The scale rig's generator (bench/scale/scale_checkpoint.h) at tiny geometry: what it writes
// passes the audits, its NVFP4 tree is byte for byte what `ckpt-audit transcode` makes of its
// source, and the same seed gives the same bytes whatever the thread count.
#include "bench/scale/scale_checkpoint.h"

#include <filesystem>
#include <map>
#include <string>

#include "absl/strings/match.h"
#include "core/audit/audit_checks.h"
#include "core/audit/part_file.h"
#include "core/audit/parts.h"
#include "core/evidence/dsse.h"
#include "core/progress.h"
#include "core/safetensors.h"
#include "core/sha256.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::bench {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::ReadAll;

// Kimi-K3's layout at a tenth of a megabyte per expert: 2 MoE layers over several shards.
ScaleOptions TinyKimi() {
  ScaleOptions o;
  o.geometry = {ScaleFamily::kKimiK3, 256, 128, 192, 16, 4, 1, 1, 256, 512};
  o.layers = 2;
  o.shard_bytes = 300'000;
  o.seed = 7;
  o.threads = 3;
  return o;
}

ScaleOptions TinyDeepSeek() {
  ScaleOptions o;
  o.geometry = {ScaleFamily::kDeepSeekV3, 256, 0, 128, 16, 4, 4, 2, 128, 0};
  o.shard_bytes = 200'000;
  return o;
}

ScaleOptions TinyGptOss() {
  ScaleOptions o;
  o.geometry = {ScaleFamily::kGptOss, 192, 0, 192, 8, 2, 1, 1, 0, 256};
  o.layers = 2;
  return o;
}

// Relative path -> SHA-256 of every file under `root`.
std::map<std::string, std::string> TreeDigests(const fs::path& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    const std::vector<uint8_t> bytes = ReadAll(e.path());
    out[fs::relative(e.path(), root).string()] = ToHex(Sha256Of(bytes));
  }
  return out;
}

// Where each tensor of `root` lies and what it holds.
struct Placed {
  std::string file;
  uint64_t begin = 0;
  std::string digest;  // of the tensor's bytes
};
std::map<std::string, Placed> PlacedTensors(const fs::path& root) {
  std::map<std::string, Placed> out;
  for (const auto& e : fs::directory_iterator(root)) {
    if (e.path().extension() != ".safetensors") continue;
    auto f = SafetensorsFile::OpenHeader(e.path().string());
    EXPECT_TRUE(f.ok()) << f.status();
    if (!f.ok()) continue;
    const std::vector<uint8_t> bytes = ReadAll(e.path());
    for (const TensorInfo& t : (*f)->tensors()) {
      const std::span<const uint8_t> data(bytes.data() + (*f)->data_start() + t.begin,
                                          t.num_bytes());
      out[t.name] = {e.path().filename().string(), t.begin, ToHex(Sha256Of(data))};
    }
  }
  return out;
}
std::map<std::string, std::string> DigestsOf(const std::map<std::string, Placed>& placed) {
  std::map<std::string, std::string> out;
  for (const auto& [name, p] : placed) out[name] = p.digest;
  return out;
}

class ScaleGenTest : public ::ckpt::testing::CliWorkspace {
 protected:
  fs::path Write(const std::string& name, ScaleOptions o, ScaleFormat f) {
    o.format = f;
    const fs::path dir = dir_ / name;
    absl::StatusOr<ScaleResult> r = WriteScaleCheckpoint(dir.string(), o);
    EXPECT_TRUE(r.ok()) << r.status();
    return dir;
  }
  // The tiny Kimi-K3 pair in tensor order `name`, audited in a window a quarter of its bytes.
  audit::AuditOptions OrderedPair(const char* name) {
    ScaleOptions o = TinyKimi();
    o.order = *TensorOrderNamed(name);
    const fs::path s = Write(std::string("src-") + name, o, ScaleFormat::kMxfp4);
    const fs::path d = Write(std::string("nv-") + name, o, ScaleFormat::kNvfp4);
    audit::AuditOptions a;
    a.root = d.string();
    a.source = s.string();
    a.memory_window = (::ckpt::testing::TreeBytes(s) + ::ckpt::testing::TreeBytes(d)) / 4;
    a.threads = 3;
    return a;
  }
  void ExpectPasses(const std::string& args) {
    ::ckpt::testing::CliResult r = Run(args);
    EXPECT_EQ(r.rc, 0) << args << "\n" << r.out << r.err;
  }
  // The generated NVFP4 tree equals `ckpt-audit transcode` of the generated source, file by
  // file, and the pair passes the audit with the block forward of every layer.
  void ExpectLosslessPair(const ScaleOptions& o) {
    const fs::path src = Write("src", o, ScaleFormat::kMxfp4);
    const fs::path nv = Write("nv", o, ScaleFormat::kNvfp4);
    ExpectPasses("audit " + src.string() + " --db " + Db());
    ExpectPasses("audit " + nv.string() + " --source " + src.string() +
                 " --forward-layers all --db " + Db());
    const fs::path tc = dir_ / "transcoded";
    ExpectPasses("transcode --to nvfp4 " + src.string() + " " + tc.string() + " --db " + Db());
    const auto want = TreeDigests(tc), got = TreeDigests(nv);
    EXPECT_GT(want.size(), 3u);  // several shards, config, index
    EXPECT_EQ(got, want);
    EXPECT_NE(TreeDigests(src), got);
  }
};

TEST_F(ScaleGenTest, KimiPairIsTheTranscodeAndPassesTheAudits) { ExpectLosslessPair(TinyKimi()); }

TEST_F(ScaleGenTest, DeepSeekPairIsTheTranscodeAndPassesTheAudits) {
  ExpectLosslessPair(TinyDeepSeek());
}

TEST_F(ScaleGenTest, GptOssSourcePassesTheAuditAndForward) {
  const fs::path src = Write("src", TinyGptOss(), ScaleFormat::kMxfp4);
  ExpectPasses("audit " + src.string() + " --db " + Db());
  ExpectPasses("fingerprint " + src.string());
  ExpectPasses("forward --root " + src.string() + " --layers all --tokens 4");
  ScaleOptions o = TinyGptOss();
  o.format = ScaleFormat::kNvfp4;
  EXPECT_EQ(WriteScaleCheckpoint((dir_ / "nv").string(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Every order holds the same tensors with the same bytes and moves only where they lie: model
// order puts each packed weight before its scale, reverse after it, and shuffle scatters an
// expert's tensors over the shards; the pair is lossless in every order.
TEST_F(ScaleGenTest, EveryOrderHoldsTheSameTensorsWhereTheOrderSays) {
  std::map<std::string, std::map<std::string, Placed>> src, nv;
  for (const char* name : {"sorted", "model", "reverse", "shuffle"}) {
    ScaleOptions o = TinyKimi();
    absl::StatusOr<TensorOrder> order = TensorOrderNamed(name);
    ASSERT_TRUE(order.ok()) << name;
    o.order = *order;
    const fs::path s = Write(std::string("src-") + name, o, ScaleFormat::kMxfp4);
    const fs::path d = Write(std::string("nv-") + name, o, ScaleFormat::kNvfp4);
    src[name] = PlacedTensors(s);
    nv[name] = PlacedTensors(d);
    ExpectPasses("verify-pair --source " + s.string() + " --derived " + d.string());
  }
  for (const char* name : {"model", "reverse", "shuffle"}) {
    EXPECT_EQ(DigestsOf(src[name]), DigestsOf(src["sorted"])) << name;
    EXPECT_EQ(DigestsOf(nv[name]), DigestsOf(nv["sorted"])) << name;
  }
  int before = 0, after = 0, split = 0, modules = 0;
  for (const auto& [tensor, packed] : nv["model"]) {
    if (!absl::EndsWith(tensor, "weight_packed")) continue;
    const std::string scale = tensor.substr(0, tensor.size() - 6) + "scale";
    ++modules;
    const Placed& m = nv["model"].at(scale);
    const Placed& r = nv["reverse"].at(scale);
    before += m.file == packed.file && m.begin > packed.begin;
    after += r.file == nv["reverse"].at(tensor).file && r.begin < nv["reverse"].at(tensor).begin;
    split += src["shuffle"].at(scale).file != src["shuffle"].at(tensor).file;
  }
  EXPECT_EQ(modules, 2 * 16 * 3);
  EXPECT_EQ(before, modules);
  EXPECT_EQ(after, modules);
  EXPECT_GT(split, 0);
}

// Whatever order the files store their tensors in, the pair audit with the block forward of
// every layer passes in a window a quarter of the pair (headers and small files take about a
// third of it at this geometry), never holding more: tensors the window cannot hold are read
// again, each counted; verify-pair passes in the same window.
TEST_F(ScaleGenTest, EveryOrderAuditsWithTheForwardInAWindowAQuarterOfThePair) {
  std::map<std::string, audit::AuditStats> stats;
  for (const char* name : {"sorted", "model", "reverse", "shuffle"}) {
    audit::AuditOptions a = OrderedPair(name);
    a.forward_layers = "all";
    const uint64_t pair =
        ::ckpt::testing::TreeBytes(a.source) + ::ckpt::testing::TreeBytes(a.root);
    audit::AuditStats& st = stats[name];
    auto rec = audit::RunAudit(a, NoProgress(), &st);
    ASSERT_TRUE(rec.ok()) << name << ": " << rec.status();
    EXPECT_EQ(rec->OverallVerdict(), evidence::Verdict::kPass) << name;
    EXPECT_LE(st.peak_kept_bytes, a.memory_window) << name;
    EXPECT_EQ(st.bytes_read, pair + st.reread_bytes) << name;  // each byte once, and again
    ExpectPasses("verify-pair --source " + a.source + " --derived " + a.root +
                 " --memory-window " + std::to_string(a.memory_window));
  }
  EXPECT_GT(stats["shuffle"].reread_tensors, 0u);
  EXPECT_GT(stats["reverse"].reread_tensors, 0u);
}

// The same audit split in three parts, each skimming the files the others hash, in the same
// window: every part passes in every order (partners in files another part hashes are read
// ahead, and passed when the window cannot hold them), and the merge passes.
TEST_F(ScaleGenTest, EveryOrderAuditsInPartsInAWindowAQuarterOfThePair) {
  auto node = evidence::SigningKey::Generate();
  ASSERT_TRUE(node.ok()) << node.status();
  evidence::TrustStore trust;
  trust.Add(node->public_key());
  for (const char* name : {"sorted", "model", "reverse", "shuffle"}) {
    const audit::AuditOptions a = OrderedPair(name);
    std::vector<audit::SignedPart> parts;
    for (unsigned i = 0; i < 3; ++i) {
      audit::AuditStats st;
      auto part = audit::RunAuditPart(a, {i, 3}, NoProgress(), &st);
      ASSERT_TRUE(part.ok()) << name << " part " << i << ": " << part.status();
      EXPECT_LE(st.peak_kept_bytes, a.memory_window) << name << " part " << i;
      auto envelope = audit::SignAuditPart(*part, *node);
      ASSERT_TRUE(envelope.ok()) << envelope.status();
      auto opened = audit::OpenAuditPart(*envelope, trust, "part-" + std::to_string(i));
      ASSERT_TRUE(opened.ok()) << opened.status();
      parts.push_back(*std::move(opened));
    }
    auto merged = audit::MergeAuditParts(parts, NoProgress(), {3, a.memory_window});
    ASSERT_TRUE(merged.ok()) << name << ": " << merged.status();
    EXPECT_EQ(merged->OverallVerdict(), evidence::Verdict::kPass) << name;
  }
}

TEST_F(ScaleGenTest, SameSeedSameBytesWhateverTheThreads) {
  ScaleOptions o = TinyKimi();
  const auto a = TreeDigests(Write("a", o, ScaleFormat::kNvfp4));
  o.threads = 1;
  const auto b = TreeDigests(Write("b", o, ScaleFormat::kNvfp4));
  o.seed = 8;
  const auto c = TreeDigests(Write("c", o, ScaleFormat::kNvfp4));
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), c.size());
  EXPECT_EQ(a.at("config.json"), c.at("config.json"));
  const std::string first_shard = std::next(a.begin())->first;  // after config.json
  ASSERT_EQ(first_shard.rfind("model-00001-of-", 0), 0u) << first_shard;
  EXPECT_NE(a.at(first_shard), c.at(first_shard));
}

TEST(ScaleGeometryTest, RealGeometriesAndRefusals) {
  absl::StatusOr<Geometry> k = GeometryNamed("kimi-k3");
  ASSERT_TRUE(k.ok());
  EXPECT_EQ(k->experts, 896u);
  EXPECT_TRUE(CheckGeometry(*k).ok());
  for (const char* n : {"deepseek-v3", "gpt-oss-120b"}) {
    ASSERT_TRUE(GeometryNamed(n).ok()) << n;
    EXPECT_TRUE(CheckGeometry(*GeometryNamed(n)).ok()) << n;
  }
  EXPECT_FALSE(GeometryNamed("llama").ok());
  EXPECT_EQ(TensorOrderNamed("random").status().code(), absl::StatusCode::kInvalidArgument);
  Geometry g = *k;
  g.hidden = 7000;  // not a multiple of 32
  EXPECT_EQ(CheckGeometry(g).code(), absl::StatusCode::kInvalidArgument);
  g = *k;
  g.top_k = 897;
  EXPECT_EQ(CheckGeometry(g).code(), absl::StatusCode::kInvalidArgument);
  ::ckpt::testing::TempDir dir;
  ScaleOptions o = TinyKimi();
  EXPECT_EQ(WriteScaleCheckpoint(dir.path().string(), o).status().code(),
            absl::StatusCode::kInvalidArgument);  // exists
}

}  // namespace
}  // namespace ckpt::bench
