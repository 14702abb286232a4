// The quant commands end to end through the ckpt-audit binary: exit codes 0/1/2 and JSON.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/quant/modelopt_fixture.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;
using ::ckpt::quant::testing::kExpert;
using ::ckpt::quant::testing::MutateTensor;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::ReadAll;
using ::ckpt::testing::TempDir;

using CliRun = ::ckpt::testing::CliResult;

// Runs `ckpt-audit ARGS`: exit code (rc), stdout and stderr.
// XDG_DATA_HOME in the scratch directory: transcode signs its provenance with the per-user key.
CliRun Cli(const std::string& args) {
  static const TempDir scratch;
  return ::ckpt::testing::RunCli(args, scratch.path(),
                                 "XDG_DATA_HOME='" + (scratch / "xdg").string() + "'");
}

const std::string kSrc = Fixture("mini-kimi-mxfp4").string();

// Every file of a directory by name.
std::map<std::string, std::vector<uint8_t>> Files(const fs::path& root) {
  std::map<std::string, std::vector<uint8_t>> out;
  for (const auto& e : fs::directory_iterator(root)) {
    out[e.path().filename().string()] = ReadAll(e.path());
  }
  return out;
}

// `transcode` whose process kills itself with SIGKILL right after its `writes`-th tensor write
// (the test hook in core/quant/transcode.cc): what a crash mid-shard leaves.
CliRun KilledTranscode(const fs::path& dst, uint64_t writes) {
  static const TempDir scratch;
  return ::ckpt::testing::RunCli(
      "transcode --threads 1 --to nvfp4 " + kSrc + " " + dst.string(), scratch.path(),
      "CKPT_AUDIT_TEST_KILL_AFTER_WRITES=" + std::to_string(writes) + " XDG_DATA_HOME='" +
          (scratch / "xdg").string() + "'");
}

TEST(QuantCli, VerifyPairExitCodesAndJson) {
  CliRun ok = Cli("verify-pair --json --source " + kSrc + " --derived " +
               Fixture("mini-kimi-nvfp4").string());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["verdict"], "lossless");

  CliRun unmapped = Cli("verify-pair --source " + kSrc + " --derived " + Fixture("mini-kimi-x4t").string());
  EXPECT_EQ(unmapped.rc, 1);
  EXPECT_NE(unmapped.out.find("derived:checkpoint-root-mismatch"), std::string::npos) << unmapped.out;

  CliRun mapped = Cli("verify-pair --json --source " + kSrc + " --derived " +
                   Fixture("mini-kimi-x4t").string() + " --map-root /x4t=" +
                   Fixture("mini-kimi-x4t").string());
  EXPECT_EQ(mapped.rc, 0) << mapped.out;

  CliRun swapped = Cli("verify-pair --source " + Fixture("mini-kimi-nvfp4").string() +
                    " --derived " + kSrc);
  EXPECT_EQ(swapped.rc, 2);
  EXPECT_EQ(Cli("verify-pair --source " + kSrc).rc, 2);  // missing --derived
}

// gpt-oss MXFP4 against its ModelOpt exports (docs/quant.md "gpt-oss layouts"): the text output
// gives each stacked tensor's window both ways; ModelOpt's rule on byte-250 zero groups is lossy.
TEST(QuantCli, VerifyPairGptOssModelOpt) {
  const std::string src = Fixture("mini-gpt-oss-mxfp4").string();
  CliRun ok = Cli("verify-pair --source " + src + " --derived " +
                  Fixture("mini-gpt-oss-modelopt-nvfp4").string());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_NE(ok.out.find("model.layers.0.mlp.experts.gate_up_proj: 3072 of 3072 blocks in the "
                        "window (k_max -4), ModelOpt's rule 8 (k_max 123)"),
            std::string::npos) << ok.out;
  EXPECT_EQ(ok.out.find("model.layers.1.mlp.experts.down_proj:"), std::string::npos) << ok.out;
  CliRun lossy = Cli("verify-pair --json --source " + src + " --derived " +
                     Fixture("mini-gpt-oss-modelopt-lossy").string());
  EXPECT_EQ(lossy.rc, 1) << lossy.out;
  const nlohmann::json lj = nlohmann::json::parse(lossy.out);
  EXPECT_EQ(lj["mismatches"]["by_code"]["value-differs"], 3816);
  // The same window counts as any MXFP4 source (16-blocks), and its ModelOpt-cast hazards.
  const nlohmann::json& w = lj["source_windows"];
  ASSERT_EQ(w["tensors"].size(), 4u);
  EXPECT_EQ(w["tensors"][3]["tensor"], "model.layers.1.mlp.experts.gate_up_proj");
  EXPECT_EQ(w["tensors"][3]["modelopt_rule"], 8);
  EXPECT_EQ(w["tensors"][3]["lossless_window"], 3072);
  EXPECT_EQ(w["tensors"][3]["k_max_modelopt"], 123);
  EXPECT_EQ(w["hazards"]["by_code"]["modelopt-kmax-lossy-blocks"], 3);
  EXPECT_FALSE(lj.contains("gpt_oss_windows"));
  EXPECT_EQ(Cli("verify-pair --source " + src + " --derived " + src).rc, 2);
}

TEST(QuantCli, VerifyPairListsAtMostMaxFindings) {
  TempDir dir;
  auto root = CopyFixture("mini-kimi-nvfp4", dir);
  MutateTensor(root, kExpert + "0.w1.weight_packed",
               [](uint8_t* p, size_t n) { for (size_t i = 0; i < n; ++i) p[i] ^= 0x11; });
  CliRun r = Cli("verify-pair --json --max-findings 3 --source " + kSrc + " --derived " + root.string());
  EXPECT_EQ(r.rc, 1);
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "mismatch");
  EXPECT_EQ(j["mismatches"]["listed"].size(), 3u);
  EXPECT_EQ(j["mismatches"]["by_code"]["packed-bytes-differ"], 192 * 4);
  EXPECT_EQ(j["mismatches"]["listed"][0]["row"], 0);
}

TEST(QuantCli, TranscodeWritesAVerifiablePairOrNothing) {
  TempDir dir;
  CliRun ok = Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "nv").string());
  EXPECT_EQ(ok.rc, 0) << ok.out;
  EXPECT_EQ(Cli("verify-pair --source " + kSrc + " --derived " + (dir / "nv").string()).rc, 0);
  EXPECT_EQ(Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "nv").string()).rc, 2);

  auto bad = CopyFixture("mini-kimi-mxfp4", dir);
  MutateTensor(bad, kExpert + "1.w2.weight_scale", [](uint8_t* p, size_t) { p[0] = 60; });
  CliRun refused = Cli("transcode --to nvfp4 " + bad.string() + " " + (dir / "nv2").string());
  EXPECT_EQ(refused.rc, 1);
  EXPECT_FALSE(fs::exists(dir / "nv2"));
  EXPECT_EQ(Cli("transcode --to mxfp8 " + kSrc + " " + (dir / "nv3").string()).rc, 2);
}

TEST(QuantCli, TranscodeLayoutModelOptOrRefused) {
  TempDir dir;
  CliRun ok = Cli("transcode --json --layout modelopt --to nvfp4 " + kSrc + " " +
                  (dir / "mo").string());
  ASSERT_EQ(ok.rc, 0) << ok.err;
  EXPECT_EQ(nlohmann::json::parse(ok.out)["layout"], "modelopt");
  EXPECT_TRUE(fs::exists(dir / "mo" / "hf_quant_config.json"));
  EXPECT_TRUE(fs::exists(dir / "mo.intoto.jsonl"));
  CliRun ct = Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "ct").string());
  ASSERT_EQ(ct.rc, 0) << ct.err;
  EXPECT_NE(ct.out.find("(compressed-tensors layout)"), std::string::npos) << ct.out;
  EXPECT_FALSE(fs::exists(dir / "ct" / "hf_quant_config.json"));
  for (const char* bad : {"ModelOpt", "nvfp4", "''"}) {
    CliRun r = Cli(std::string("transcode --layout ") + bad + " --to nvfp4 " + kSrc + " " +
                   (dir / "bad").string());
    EXPECT_EQ(r.rc, 2) << bad;
    EXPECT_NE(r.err.find("--layout"), std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(dir / "bad"));
    EXPECT_FALSE(fs::exists(dir / "bad.intoto.jsonl"));
  }
}

TEST(QuantCli, TranscodeKilledMidShardThenResumeIsByteIdentical) {
  TempDir dir;
  ASSERT_EQ(Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "want").string()).rc, 0);
  CliRun killed = KilledTranscode(dir / "out", 10);
  EXPECT_NE(killed.rc, 0);
  EXPECT_EQ(killed.out, "");
  ASSERT_FALSE(fs::exists(dir / "out"));
  for (const char* shard :
       {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    EXPECT_NE(ReadAll(dir / ".out.transcode-tmp" / shard), ReadAll(dir / "want" / shard))
        << shard;
  }
  // A plain rerun refuses the leftover; --resume finishes it.
  CliRun plain = Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "out").string());
  EXPECT_EQ(plain.rc, 2);
  EXPECT_NE(plain.err.find("--resume"), std::string::npos) << plain.err;
  CliRun resumed = Cli("transcode --resume --to nvfp4 " + kSrc + " " + (dir / "out").string());
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("resumed: 0 output shard(s) of the interrupted run kept, 2 redone"),
            std::string::npos) << resumed.out;
  EXPECT_EQ(Files(dir / "out"), Files(dir / "want"));
  EXPECT_EQ(Cli("verify-pair --source " + kSrc + " --derived " + (dir / "out").string()).rc, 0);
}

TEST(QuantCli, TranscodeResumeRedoesAFinishedShardCorruptedMeanwhile) {
  TempDir dir;
  ASSERT_EQ(Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "want").string()).rc, 0);
  // Killed right after its last tensor write: both shards complete, nothing published.
  auto index = nlohmann::json::parse(ReadAll(dir / "want" / "model.safetensors.index.json"));
  const uint64_t writes = index["weight_map"].size() + 2;  // every tensor and both headers
  EXPECT_NE(KilledTranscode(dir / "out", writes).rc, 0);
  const fs::path shard = dir / ".out.transcode-tmp" / "model-00002-of-00002.safetensors";
  ASSERT_EQ(ReadAll(shard), ReadAll(dir / "want" / "model-00002-of-00002.safetensors"));
  std::vector<uint8_t> bytes = ReadAll(shard);
  bytes[bytes.size() - 100] ^= 0x01;  // one packed nibble
  ::ckpt::testing::WriteAll(shard, bytes);
  CliRun resumed = Cli("transcode --resume --to nvfp4 " + kSrc + " " + (dir / "out").string());
  ASSERT_EQ(resumed.rc, 0) << resumed.err;
  EXPECT_NE(resumed.out.find("1 output shard(s) of the interrupted run kept, 1 redone"),
            std::string::npos) << resumed.out;
  EXPECT_EQ(Files(dir / "out"), Files(dir / "want"));
}

TEST(QuantCli, TranscodeMemoryWindowAndMissingParent) {
  TempDir dir;
  ASSERT_EQ(Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "want").string()).rc, 0);
  CliRun small = Cli("transcode --memory-window 240K --to nvfp4 " + kSrc + " " +
                     (dir / "small").string());
  ASSERT_EQ(small.rc, 0) << small.err;
  EXPECT_EQ(Files(dir / "small"), Files(dir / "want"));
  for (const char* bad : {"0", "1K", "1.3K", "18446744073709551616", "lots"}) {
    CliRun r = Cli(std::string("transcode --memory-window ") + bad + " --to nvfp4 " + kSrc + " " +
                   (dir / "bad").string());
    EXPECT_EQ(r.rc, 2) << bad;
    EXPECT_NE(r.err.find("--memory-window"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("INVALID_ARGUMENT"), std::string::npos) << r.err;
  }
  CliRun missing = Cli("transcode --to nvfp4 " + kSrc + " " + (dir / "new/parent/nv").string());
  EXPECT_EQ(missing.rc, 2);
  EXPECT_NE(missing.err.find("NOT_FOUND: " + (dir / "new/parent").string()), std::string::npos)
      << missing.err;
  EXPECT_FALSE(fs::exists(dir / "bad"));
  EXPECT_FALSE(fs::exists(dir / "new"));
}

// docs/quant.md "ModelOpt NVFP4": the converted fixture verifies lossless from the command line,
// with the window counts and ModelOpt-cast hazards of the source; quant-check recognises it.
TEST(QuantCli, ModelOptPairAndQuantCheck) {
  TempDir dir;
  const fs::path mo = dir / "mo";
  ASSERT_TRUE(testing::WriteModelOptFixture(Fixture("mini-kimi-nvfp4"), mo).ok());
  CliRun r = Cli("verify-pair --json --source " + kSrc + " --derived " + mo.string());
  ASSERT_EQ(r.rc, 0) << r.out << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verdict"], "lossless");
  EXPECT_EQ(j["derived_format"], "modelopt/nvfp4 (W4A4)");
  const auto& w = j["source_windows"];
  EXPECT_EQ(w["tensors"].size(), 96u);
  EXPECT_EQ(w["blocks"], w["lossless_window"]);
  EXPECT_LT(w["modelopt_rule"].get<uint64_t>(), w["blocks"].get<uint64_t>());
  EXPECT_EQ(w["hazards"]["by_code"]["zero-group-scale-sets-kmax"], 24);
  CliRun text = Cli("verify-pair --source " + kSrc + " --derived " + mo.string());
  EXPECT_NE(text.out.find("lossless under ModelOpt's k_max rule"), std::string::npos) << text.out;
  CliRun check = Cli("quant-check --json " + mo.string());
  EXPECT_EQ(nlohmann::json::parse(check.out)["format"]["format"], "modelopt/nvfp4") << check.out;
  EXPECT_EQ(check.rc, 0) << check.out;
  // The streamed pair audit with the CPU forward on every MoE layer, appending a signed record.
  CliRun keys = Cli("keys generate --out " + (dir / "key.pem").string() + " --trust " +
                    (dir / "trust").string());
  ASSERT_EQ(keys.rc, 0) << keys.err;
  CliRun audit = Cli("audit " + mo.string() + " --source " + kSrc + " --forward-layers all --db " +
                     (dir / "log.db").string() + " --key " + (dir / "key.pem").string() +
                     " --json");
  ASSERT_EQ(audit.rc, 0) << audit.out << audit.err;  // 0: every check passed
  EXPECT_EQ(nlohmann::json::parse(audit.out)["record_id"], 0);  // the fresh log's first record
}

// The writer and the reader of the ModelOpt layout were written apart from the exporter's and
// loader's sources (docs/formats.md §9): what `transcode --layout modelopt` writes is recognised
// as ModelOpt NVFP4 with no finding, proven lossless against its source, audited with the CPU
// forward of every MoE layer, and its provenance chain checks out.
TEST(QuantCli, TranscodeModelOptIsRecognisedAndProvenLossless) {
  TempDir dir;
  const std::string mo = (dir / "mo").string();
  CliRun t = Cli("transcode --layout modelopt --to nvfp4 " + kSrc + " " + mo);
  ASSERT_EQ(t.rc, 0) << t.err;
  CliRun check = Cli("quant-check --json " + mo);
  EXPECT_EQ(check.rc, 0) << check.out;
  auto cj = nlohmann::json::parse(check.out);
  EXPECT_EQ(cj["format"]["format"], "modelopt/nvfp4") << check.out;
  EXPECT_EQ(cj["format"]["findings"]["total"], 0) << check.out;
  CliRun pair = Cli("verify-pair --json --source " + kSrc + " --derived " + mo);
  ASSERT_EQ(pair.rc, 0) << pair.out << pair.err;
  auto pj = nlohmann::json::parse(pair.out);
  EXPECT_EQ(pj["verdict"], "lossless");
  EXPECT_EQ(pj["derived_format"], "modelopt/nvfp4 (W4A16)");
  EXPECT_EQ(pj["source_windows"]["blocks"], pj["source_windows"]["lossless_window"]);
  CliRun keys = Cli("keys generate --out " + (dir / "key.pem").string() + " --trust " +
                    (dir / "trust").string());
  ASSERT_EQ(keys.rc, 0) << keys.err;
  const std::string db = (dir / "log.db").string();
  CliRun audit = Cli("audit " + mo + " --source " + kSrc + " --forward-layers all --db " + db +
                     " --key " + (dir / "key.pem").string());
  EXPECT_EQ(audit.rc, 0) << audit.out << audit.err;
  EXPECT_NE(audit.out.find("pair_verify            pass"), std::string::npos) << audit.out;
  EXPECT_NE(audit.out.find("block_forward"), std::string::npos) << audit.out;
}

// gpt-oss MXFP4 -> ModelOpt's gpt-oss layout through the binary: written, proven lossless by
// verify-pair, passing the pair audit; a source with a large byte on an active block fails
// (exit 1) naming tensor, expert, row and block, and publishes nothing.
TEST(QuantCli, TranscodeGptOssToModelOptIsProvenLosslessOrRefused) {
  TempDir dir;
  const std::string src = Fixture("mini-gpt-oss-mxfp4").string();
  const std::string mo = (dir / "mo").string();
  CliRun t = Cli("transcode --json --layout modelopt --to nvfp4 " + src + " " + mo);
  ASSERT_EQ(t.rc, 0) << t.err;
  EXPECT_EQ(nlohmann::json::parse(t.out)["zero_group_scale"], "+0");
  CliRun pair = Cli("verify-pair --json --source " + src + " --derived " + mo);
  ASSERT_EQ(pair.rc, 0) << pair.out << pair.err;
  EXPECT_EQ(nlohmann::json::parse(pair.out)["verdict"], "lossless");
  CliRun audit = Cli("audit " + mo + " --source " + src + " --db " + (dir / "log.db").string());
  EXPECT_EQ(audit.rc, 0) << audit.out << audit.err;
  EXPECT_NE(audit.out.find("pair_verify            pass"), std::string::npos) << audit.out;

  const fs::path lossy = CopyFixture("mini-gpt-oss-mxfp4", dir);
  MutateTensor(lossy, "model.layers.1.mlp.experts.gate_up_proj_scales",
               [](uint8_t* p, size_t) { p[(2 * 128 + 5) * 3 + 1] = 250; });  // an active block
  CliRun bad = Cli("transcode --layout modelopt --to nvfp4 " + lossy.string() + " " +
                   (dir / "bad").string());
  EXPECT_EQ(bad.rc, 1) << bad.err;
  EXPECT_NE(bad.err.find("over-span: model.layers.1.mlp.experts.gate_up_proj[0] row 0 group 0"),
            std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(dir / "bad"));
  EXPECT_FALSE(fs::exists(dir / ".bad.transcode-tmp"));
  EXPECT_FALSE(fs::exists(dir / "bad.intoto.jsonl"));
}

TEST(QuantCli, QuantCheck) {
  CliRun ok = Cli("quant-check --json " + kSrc);
  EXPECT_EQ(ok.rc, 0) << ok.out;
  auto j = nlohmann::json::parse(ok.out);
  EXPECT_EQ(j["scale_window"]["verdict"], "lossless-transcodable");
  EXPECT_EQ(j["scale_window"]["policy"]["id"], "scale-window/1");
  EXPECT_EQ(Cli("quant-check " + Fixture("mini-kimi-x4t").string()).rc, 1);  // root
  EXPECT_EQ(Cli("quant-check /nonexistent").rc, 2);
}

}  // namespace
}  // namespace ckpt::quant
