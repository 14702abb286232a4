// An audit split in parts (docs/audit-parts.md): the fixture pair split into 1 to 5 parts
// merges into the record of the single-machine audit, less what depends on where and when it
// ran; parts that are missing, given twice, run with other options, signed by an untrusted key,
// edited, or whose tensor digests disagree with the part that hashed the file are refused with
// their reason; on a pair whose shards do not line up, the parts read each other's tensors and
// together read little more than both trees.
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "bench/scale/scale_checkpoint.h"
#include "core/audit/audit_checks.h"
#include "core/audit/part_file.h"
#include "core/audit/parts.h"
#include "core/evidence/base64.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "core/io/file_system.h"
#include "core/text/json_dump.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/core/hf_layouts.h"
#include "tests/test_util.h"

namespace ckpt::audit {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using nlohmann::json;

// The predicate (and subjects) with exactly the fields a merged record may differ in removed:
// times, environment, the roots as seen, the fingerprint's bytes_read, the parts.
json Comparable(const evidence::EvidenceRecord& rec) {
  auto payload = evidence::RecordPayload(rec);
  EXPECT_TRUE(payload.ok()) << payload.status();
  if (!payload.ok()) return json();
  json j = json::parse(*payload);
  json& p = j["predicate"];
  for (const char* field : {"started_at", "finished_at", "environment", "root", "parts"}) {
    p.erase(field);
  }
  if (p["source"].is_object()) p["source"].erase("root");
  for (json& c : p["checks"]) {
    if (c["name"] == "fingerprint") c["counts"].erase("bytes_read");
  }
  return j;
}

class PartsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    source_ = CopyFixture("mini-kimi-mxfp4", tmp_);
    derived_ = CopyFixture("mini-kimi-nvfp4", tmp_);
    auto node = evidence::SigningKey::Generate();
    ASSERT_TRUE(node.ok());
    node_ = std::make_unique<evidence::SigningKey>(*std::move(node));
    trust_.Add(node_->public_key());
  }

  AuditOptions Options() const {
    AuditOptions o;
    o.root = derived_.string();
    o.source = source_.string();
    o.threads = 2;
    return o;
  }

  // The signed part files of an audit split in `count` parts.
  std::vector<std::string> Parts(unsigned count, const AuditOptions& options) {
    std::vector<std::string> out;
    for (unsigned i = 0; i < count; ++i) {
      auto part = RunAuditPart(options, {i, count}, NoProgress());
      EXPECT_TRUE(part.ok()) << part.status();
      if (!part.ok()) return {};
      auto envelope = SignAuditPart(*part, *node_);
      EXPECT_TRUE(envelope.ok()) << envelope.status();
      out.push_back(*envelope);
    }
    return out;
  }
  std::vector<std::string> Parts(unsigned count) { return Parts(count, Options()); }

  absl::StatusOr<evidence::EvidenceRecord> Merge(const std::vector<std::string>& files,
                                                 const MergeOptions& merge = {}) {
    std::vector<SignedPart> parts;
    for (size_t i = 0; i < files.size(); ++i) {
      auto part = OpenAuditPart(files[i], trust_, "part-" + std::to_string(i) + ".json");
      if (!part.ok()) return part.status();
      parts.push_back(*std::move(part));
    }
    return MergeAuditParts(parts, NoProgress(), merge);
  }

  // The part file with its payload rewritten by `edit` and signed again with `key` (or, with
  // no key, the old signature kept).
  std::string Edited(const std::string& file, const std::function<void(json&)>& edit,
                     const evidence::SigningKey* key) {
    auto env = evidence::ParseEnvelope(file);
    EXPECT_TRUE(env.ok()) << env.status();
    json payload = json::parse(env->payload);
    edit(payload);
    const std::string text = DumpJson(payload);
    if (key != nullptr) return *evidence::SignEnvelope(text, kAuditPartPayloadType, *key);
    json j = json::parse(file);
    j["payload"] = evidence::Base64Encode(evidence::AsBytes(text));
    return j.dump();
  }

  TempDir tmp_;
  fs::path source_, derived_;
  std::unique_ptr<evidence::SigningKey> node_;
  evidence::TrustStore trust_;
};

TEST_F(PartsTest, OneToFivePartsMergeIntoTheSingleMachineRecord) {
  auto single = RunAudit(Options(), NoProgress());
  ASSERT_TRUE(single.ok()) << single.status();
  const json want = Comparable(*single);
  for (unsigned count = 1; count <= 5; ++count) {
    auto merged = Merge(Parts(count));
    ASSERT_TRUE(merged.ok()) << count << " parts: " << merged.status();
    EXPECT_EQ(Comparable(*merged), want) << count << " parts";
    ASSERT_EQ(merged->parts.size(), count);
    for (const evidence::PartRef& p : merged->parts) {
      EXPECT_EQ(p.signer, node_->public_key().KeyId());
      EXPECT_EQ(p.host, single->environment.host);
    }
  }
}

// Flips the bits `mask` of byte `at` of `tensor` in the safetensors file `shard`.
void FlipTensorByte(const fs::path& shard, const std::string& tensor, uint64_t at, uint8_t mask) {
  std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(shard);
  uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | bytes[i];
  const json h = json::parse(bytes.begin() + 8, bytes.begin() + 8 + header);
  bytes[8 + header + h.at(tensor).at("data_offsets")[0].get<uint64_t>() + at] ^= mask;
  ::ckpt::testing::WriteAll(shard, bytes);
}

// A flipped packed byte (a module compared by a part) and a flipped byte of a BF16 tensor (a
// unit the merge compares by the hashing parts' digests).
TEST_F(PartsTest, AFindingInOnePartIsTheMergedRecordsFinding) {
  const fs::path shard = derived_ / "model-00002-of-00002.safetensors";
  std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(shard);
  bytes[bytes.size() - 100] ^= 0x11;
  ::ckpt::testing::WriteAll(shard, bytes);
  FlipTensorByte(shard, "language_model.model.layers.1.self_attn.k_proj.weight", 10, 0x04);
  auto single = RunAudit(Options(), NoProgress());
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_EQ(single->OverallVerdict(), evidence::Verdict::kFail);
  auto merged = Merge(Parts(3));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->OverallVerdict(), evidence::Verdict::kFail);
  EXPECT_EQ(Comparable(*merged), Comparable(*single));
  ASSERT_TRUE(merged->pair_audit.has_value());
  EXPECT_EQ(merged->pair_audit->mismatches.by_code.count("ignored-tensor-differs"), 1u);
}

// A trusted node's part cannot cancel another part's findings: a count of 2^64 - k in one of its
// own units would wrap the merged total of k mismatches found by the honest part to zero (a
// pass). The merge refuses counts no record can hold.
TEST_F(PartsTest, FindingCountsThatWouldWrapTheTotalAreRefused) {
  const fs::path shard = derived_ / "model-00002-of-00002.safetensors";
  std::vector<uint8_t> bytes = ::ckpt::testing::ReadAll(shard);
  bytes[bytes.size() - 100] ^= 0x11;
  ::ckpt::testing::WriteAll(shard, bytes);
  std::vector<std::string> parts = Parts(2);
  // The part that found the mismatches, and how many it found.
  uint64_t found = 0;
  size_t honest = 0;
  for (size_t i = 0; i < parts.size(); ++i) {
    json p = json::parse(evidence::ParseEnvelope(parts[i])->payload);
    for (const json& u : p["pair_units"]) {
      for (const auto& [code, n] : u["found"]["by_code"].items()) {
        found += n.get<uint64_t>();
        honest = i;
      }
    }
  }
  ASSERT_GT(found, 0u);
  const size_t liar = 1 - honest;
  parts[liar] = Edited(
      parts[liar],
      [&](json& p) {
        ASSERT_FALSE(p["pair_units"].empty());
        p["pair_units"][0]["found"]["by_code"]["x"] = uint64_t{0} - found;
      },
      node_.get());
  auto merged = Merge(parts);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition)
      << (merged.ok() ? evidence::VerdictName(merged->OverallVerdict()) : "");
  EXPECT_THAT(merged.status().message(), HasSubstr("more findings than"));
}

// A file name that is not UTF-8 (the adversary names the files): the parts write and the merge
// reads it as the single-machine audit records it.
TEST_F(PartsTest, NameThatIsNotUtf8MergesIntoTheSingleMachineRecord) {
  ::ckpt::testing::WriteAll(derived_ / "notes-\xff\xfe.txt", std::vector<uint8_t>{'x'});
  auto single = RunAudit(Options(), NoProgress());
  ASSERT_TRUE(single.ok()) << single.status();
  auto merged = Merge(Parts(2));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(Comparable(*merged), Comparable(*single));
}

// Hugging Face layouts (docs/hf-layouts.md): a hub cache snapshot audited against a local-dir
// download of its source. Their own checks compare names and etags with the digests the parts
// took, including the git blob id of a shard whose etag is one (a file committed without LFS:
// only the part that hashes the shard computes it).
TEST_F(PartsTest, HuggingFaceLayoutsMergeIntoTheSingleMachineRecord) {
  const std::string commit(40, 'c');
  derived_ = ::ckpt::testing::MakeHubSnapshot("mini-kimi-nvfp4", tmp_ / "hub", "org/nv", commit)
                 .snapshot;
  source_ = ::ckpt::testing::MakeLocalDir("mini-kimi-mxfp4", tmp_ / "local", commit);
  const std::string shard = "model-00001-of-00002.safetensors";
  ::ckpt::testing::WriteAll(
      ::ckpt::testing::MetadataOf(source_, shard),
      commit + "\n" + ::ckpt::testing::GitBlobIdHex(::ckpt::testing::ReadAll(source_ / shard)) +
          "\n1764460800.25\n");
  auto single = RunAudit(Options(), NoProgress());
  ASSERT_TRUE(single.ok()) << single.status();
  size_t layout_checks = 0;
  for (const evidence::CheckResult& c : single->checks) {
    if (c.name.find("hf_layout") == std::string::npos) continue;
    ++layout_checks;
    EXPECT_EQ(c.verdict, evidence::Verdict::kPass) << c.name;
  }
  ASSERT_EQ(layout_checks, 2u);
  auto merged = Merge(Parts(3));
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(Comparable(*merged), Comparable(*single));
}

TEST_F(PartsTest, MissingPartIsRefused) {
  std::vector<std::string> parts = Parts(3);
  parts.erase(parts.begin() + 1);
  auto merged = Merge(parts);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(merged.status().message(), HasSubstr("part 1/3 is missing"));
}

// A trusted node's part of a split in 4e9 parts: refused as missing parts, without a slot
// allocated for each part the split claims (32 GB).
TEST_F(PartsTest, PartOfAHugeSplitIsRefusedWithoutAllocatingIt) {
  const std::vector<std::string> parts = Parts(1);
  const std::string huge = Edited(
      parts[0], [](json& p) { p["part"]["count"] = 4'000'000'000u; }, node_.get());
  auto merged = Merge({huge});
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(merged.status().message(), HasSubstr("part 1/4000000000 is missing"));
}

TEST_F(PartsTest, DuplicatedPartIsRefused) {
  std::vector<std::string> parts = Parts(3);
  parts.push_back(parts[2]);
  auto merged = Merge(parts);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(merged.status().message(), HasSubstr("part 2/3 is given twice"));
}

TEST_F(PartsTest, PartsOfOtherSplitsAreRefused) {
  std::vector<std::string> parts = Parts(2);
  parts[1] = Parts(3)[1];
  auto merged = Merge(parts);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(merged.status().message(), HasSubstr("does not belong with"));
}

TEST_F(PartsTest, MixedOptionsAreRefused) {
  std::vector<std::string> parts = Parts(2);
  AuditOptions other = Options();
  other.policy = "marlin-safe";
  parts[1] = Parts(2, other)[1];
  auto merged = Merge(parts);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(merged.status().message(), HasSubstr("other options"));
}

TEST_F(PartsTest, PartSignedByAnUntrustedKeyIsRefused) {
  std::vector<std::string> parts = Parts(2);
  auto stranger = evidence::SigningKey::Generate();
  ASSERT_TRUE(stranger.ok());
  parts[0] = Edited(parts[0], [](json&) {}, &*stranger);
  auto merged = Merge(parts);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(merged.status().message(), HasSubstr("not a part signed by a trusted node key"));
}

TEST_F(PartsTest, EditedPartFailsItsSignature) {
  std::vector<std::string> parts = Parts(2);
  parts[1] = Edited(parts[1], [](json& p) { p["verdict"] = "pass"; p["bytes_read"] = 1; },
                    nullptr);
  auto merged = Merge(parts);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(merged.status().message(), HasSubstr("part-1.json"));
}

TEST_F(PartsTest, FileHashedByNoPartOrTwoIsRefused) {
  for (bool hashed : {false, true}) {
    std::vector<std::string> parts = Parts(2);
    // The config.json of the root: hashed by exactly one part.
    size_t owner = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      json p = json::parse(evidence::ParseEnvelope(parts[i])->payload);
      if (p["files"][0]["hashed"] == true) owner = i;
    }
    const size_t edited = hashed ? 1 - owner : owner;
    parts[edited] = Edited(
        parts[edited],
        [&](json& p) {
          json& f = p["files"][0];
          f["hashed"] = hashed;
          if (hashed) {
            f["sha256"] = f["seen"];
            f["git_blob_id"] = nullptr;
            f["tensors"] = json::array();
          }
        },
        node_.get());
    auto merged = Merge(parts);
    EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(merged.status().message(),
                HasSubstr(hashed ? "which is not the part it belongs to"
                                 : "is hashed by no part"));
  }
}

// A file the merge reads whole itself (config.json): the part that hashed it cannot put another
// digest for it in the record than the bytes the merge read and checked.
TEST_F(PartsTest, DigestOfAFileTheMergeReadsWholeMustBeWhatTheMergeRead) {
  for (const char* field : {"sha256", "seen"}) {
    std::vector<std::string> parts = Parts(2);
    size_t owner = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      json p = json::parse(evidence::ParseEnvelope(parts[i])->payload);
      if (p["files"][0]["hashed"] == true) owner = i;
    }
    parts[owner] = Edited(
        parts[owner],
        [&](json& p) {
          ASSERT_EQ(p["files"][0]["name"], "config.json");
          p["files"][0][field] = std::string(64, 'a');
        },
        node_.get());
    auto merged = Merge(parts);
    EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition) << field;
    EXPECT_THAT(merged.status().message(), HasSubstr("config.json")) << field;
  }
}

// The hashing part's tensor list is the header's: a digest for a range the header does not
// have (shifted, or a tensor listed twice) is refused, so ranges cannot cover other bytes.
TEST_F(PartsTest, TensorListOtherThanTheHeaderIsRefused) {
  const std::vector<std::function<void(json&)>> edits = {
      [](json& t) { t[0]["begin"] = t[0]["begin"].get<uint64_t>() + 1; },
      [](json& t) { t.push_back(t[0]); },
      [](json& t) { t[0]["name"] = t[1]["name"]; },
  };
  for (size_t e = 0; e < edits.size(); ++e) {
    std::vector<std::string> parts = Parts(2);
    bool edited = false;
    for (size_t i = 0; i < parts.size() && !edited; ++i) {
      parts[i] = Edited(
          parts[i],
          [&](json& p) {
            for (json& f : p["files"]) {
              if (edited || f["hashed"] != true || f["tensors"].size() < 2) continue;
              edits[e](f["tensors"]);
              edited = true;
            }
          },
          node_.get());
    }
    ASSERT_TRUE(edited);
    auto merged = Merge(parts);
    EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition) << e;
    EXPECT_THAT(merged.status().message(), HasSubstr("lists other tensors than its header holds"))
        << e;
  }
}

// The trees changed after the parts read them: the merge, which reads every header and small
// file again, does not see what the parts saw.
TEST_F(PartsTest, TreeChangedBetweenThePartsAndTheMergeIsRefused) {
  std::vector<std::string> parts = Parts(2);
  std::vector<uint8_t> config = ::ckpt::testing::ReadAll(derived_ / "config.json");
  config.push_back('\n');
  ::ckpt::testing::WriteAll(derived_ / "config.json", config);
  auto merged = Merge(parts);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(merged.status().message(), HasSubstr("config.json"));
}

// The parts read another tree than the one the audit was started on: the root, checked and
// opened then (the daemon's merge reads through that directory), was swapped for a link to a
// tree elsewhere while the parts waited. Each part's real path must be the one the merge opened.
TEST_F(PartsTest, PartThatReadAnotherTreeThanTheMergeOpensIsRefused) {
  const std::string real = fs::canonical(derived_).string();
  auto started = io::RealFileSystem().OpenRoot(real);
  ASSERT_TRUE(started.ok()) << started.status();
  MergeOptions through_started;
  through_started.root_dir = *std::move(started);
  const fs::path elsewhere = tmp_ / "elsewhere";
  fs::rename(derived_, elsewhere);
  fs::create_directory_symlink(elsewhere, derived_);
  std::vector<std::string> swapped = Parts(2);
  auto merged = Merge(swapped, through_started);
  EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition) << merged.status();
  EXPECT_THAT(merged.status().message(),
              HasSubstr("read the root at " + fs::canonical(elsewhere).string() +
                        ", the merge opened " + real +
                        ": not the tree the audit was started on"));
  EXPECT_THAT(merged.status().message(), HasSubstr("part-0.json"));

  // The tree back in place: the parts read it, and merge through the same directory.
  fs::remove(derived_);
  fs::rename(elsewhere, derived_);
  auto back = Merge(Parts(2), through_started);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->root, real);
}

// A trusted node's part that is not a well-formed part: refused as such, never trusted in part.
TEST_F(PartsTest, MalformedPartsAreInvalid) {
  std::vector<std::function<void(json&)>> edits = {
      [](json& p) { p.erase("files"); },
      [](json& p) { p["files"][0]["size"] = "large"; },
      [](json& p) { p["files"][0]["seen"] = "not hex"; },
      [](json& p) { p["part"]["index"] = 7; },
      [](json& p) { p["schema"] = "something/else"; },
      [](json& p) {  // more findings listed than counted
        for (json& u : p["pair_units"]) {
          u["found"]["listed"].push_back({{"code", "x"}, {"tensor", "t"}, {"row", -1},
                                          {"group", -1}, {"message", "m"},
                                          {"numbers", json::object()}});
        }
      },
      [](json& p) {  // more findings listed than the list keeps
        for (json& u : p["scale_window_units"]) {
          u["members"][0]["nan"]["cap"] = 0;
          u["members"][0]["nan"]["by_code"]["x"] = 1;
          u["members"][0]["nan"]["listed"].push_back(
              {{"code", "x"}, {"tensor", "t"}, {"row", -1}, {"group", -1}, {"message", "m"},
               {"numbers", json::object()}});
        }
      },
  };
  const std::vector<std::string> parts = Parts(1);
  // Scale exponents whose span overflows int when the merge takes it (k_max - k_min).
  edits.push_back([](json& p) {
    for (json& u : p["scale_window_units"]) {
      for (json& m : u["members"]) {
        m["stats"]["k_min"] = std::numeric_limits<int>::min();
        m["stats"]["k_max"] = std::numeric_limits<int>::max();
        m["stats"]["pair_k_max"] = std::numeric_limits<int>::max();
      }
    }
  });
  // Times the record would take as its start: not a time, or a start after the part's end.
  edits.push_back([](json& p) { p["started_at"] = "0"; });
  edits.push_back([](json& p) { p["started_at"] = "9999-12-31T23:59:59.999Z"; });
  for (size_t i = 0; i < edits.size(); ++i) {
    auto merged = Merge({Edited(parts[0], edits[i], node_.get())});
    EXPECT_EQ(merged.status().code(), absl::StatusCode::kInvalidArgument) << i;
    EXPECT_THAT(merged.status().message(), HasSubstr("not an audit part")) << i;
  }
}

// The two command lines the cluster scripts run (deploy/): parts written with the node key, a
// merge refused for a missing part or for parts checked against the record trust store (the
// log unchanged), then the merge of all parts appending one record, as `audit` does.
class PartsCliTest : public ::ckpt::testing::CliWorkspace {
 protected:
  std::string Path(const std::string& name) { return (dir_ / name).string(); }
};

TEST_F(PartsCliTest, PartsWrittenByNodesMergeIntoOneRecord) {
  MakeKey();
  ASSERT_EQ(Run("keys generate --out " + Path("node.pem") + " --trust " + Path("nodes")).rc, 0);
  const std::string pair = ::ckpt::testing::Fixture("mini-kimi-nvfp4").string() + " --source " +
                           ::ckpt::testing::Fixture("mini-kimi-mxfp4").string();
  std::string files;
  for (int i = 0; i < 3; ++i) {
    const std::string out = Path("part-" + std::to_string(i) + ".json");
    ::ckpt::testing::CliResult r = Run("audit " + pair + " --part " + std::to_string(i) +
                                       "/3 --part-key " + Path("node.pem") + " --out " + out);
    ASSERT_EQ(r.rc, 0) << r.err;
    EXPECT_TRUE(fs::exists(out));
    files += " " + out;
  }
  const std::string log = " --db " + Db() + " --key " + Key() + " --json";
  ::ckpt::testing::CliResult missing =
      Run("audit --merge " + Path("part-0.json") + " " + Path("part-2.json") + log +
          " --part-trust " + Path("nodes"));
  EXPECT_EQ(missing.rc, 2);
  EXPECT_THAT(missing.err, HasSubstr("part 1/3 is missing"));
  ::ckpt::testing::CliResult untrusted =
      Run("audit --merge" + files + log + " --part-trust " + Trust());
  EXPECT_EQ(untrusted.rc, 2);
  EXPECT_THAT(untrusted.err, HasSubstr("not a part signed by a trusted node key"));

  ::ckpt::testing::CliResult merged =
      Run("audit --merge" + files + log + " --part-trust " + Path("nodes"));
  ASSERT_EQ(merged.rc, 0) << merged.err;
  const json m = json::parse(merged.out);
  EXPECT_EQ(m["verdict"], "pass");
  EXPECT_EQ(m["parts"], 3);
  // The refused merges appended nothing: the log holds what one audit appends.
  ::ckpt::testing::CliResult single =
      Run("audit " + pair + " --db " + Path("single.db") + " --key " + Key() + " --json");
  ASSERT_EQ(single.rc, 0) << single.err;
  EXPECT_EQ(m["tree_size"], json::parse(single.out)["tree_size"]);
  EXPECT_EQ(m["record_id"], json::parse(single.out)["record_id"]);
}

// The pair written with shards that do not line up: a module's tensors lie in files that
// different parts hash, so parts read tensors from each other's files.
class MisalignedPartsTest : public PartsTest {
 protected:
  void SetUp() override {
    PartsTest::SetUp();
    bench::ScaleOptions o;
    o.geometry = {bench::ScaleFamily::kKimiK3, 256, 256, 384, 16, 2, 1, 1, 0, 0};
    o.layers = 4;
    o.seed = 5;
    o.threads = 2;
    o.shard_bytes = 700'000;
    ASSERT_TRUE(bench::WriteScaleCheckpoint((tmp_ / "src").string(), o).ok());
    o.format = bench::ScaleFormat::kNvfp4;
    o.shard_bytes = 1'100'000;
    ASSERT_TRUE(bench::WriteScaleCheckpoint((tmp_ / "dst").string(), o).ok());
    source_ = tmp_ / "src";
    derived_ = tmp_ / "dst";
  }

  static uint64_t TreeBytes(const fs::path& root) {
    uint64_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(root)) {
      if (e.is_regular_file()) n += e.file_size();
    }
    return n;
  }
};

TEST_F(MisalignedPartsTest, PartsReadEachOthersTensorsAndMergeIntoTheSingleMachineRecord) {
  auto single = RunAudit(Options(), NoProgress());
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_EQ(single->OverallVerdict(), evidence::Verdict::kPass);
  const uint64_t trees = TreeBytes(source_) + TreeBytes(derived_);
  for (unsigned count : {2u, 4u}) {
    std::vector<std::string> parts = Parts(count);
    size_t ranges = 0;
    for (const std::string& f : parts) {
      ranges += json::parse(evidence::ParseEnvelope(f)->payload)["ranges"].size();
    }
    EXPECT_GT(ranges, 0u) << count << " parts";
    auto merged = Merge(parts);
    ASSERT_TRUE(merged.ok()) << merged.status();
    EXPECT_EQ(Comparable(*merged), Comparable(*single)) << count << " parts";
    // Every part reads every header and small file; the tensors are read once, plus those
    // read from other parts' files.
    uint64_t read = 0;
    for (const evidence::CheckResult& c : merged->checks) {
      if (c.name == "fingerprint") read = c.counts.at("bytes_read");
    }
    EXPECT_GE(read, trees);
    EXPECT_LE(read, trees * 5 / 4) << count << " parts";
  }
}

TEST_F(MisalignedPartsTest, RangeWhoseDigestDisagreesWithTheHashingPartIsRefused) {
  std::vector<std::string> parts = Parts(2);
  // A part that read a tensor from the other part's file, re-signed by the trusted node key
  // with that tensor's digest changed.
  for (size_t i = 0; i < parts.size(); ++i) {
    json p = json::parse(evidence::ParseEnvelope(parts[i])->payload);
    if (p["ranges"].empty()) continue;
    const std::string file = p["ranges"][0]["file"], tensor = p["ranges"][0]["name"];
    parts[i] = Edited(
        parts[i],
        [](json& q) {
          std::string d = q["ranges"][0]["sha256"];
          d[0] = d[0] == '0' ? '1' : '0';
          q["ranges"][0]["sha256"] = d;
        },
        node_.get());
    auto merged = Merge(parts);
    EXPECT_EQ(merged.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(merged.status().message(), HasSubstr(file));
    EXPECT_THAT(merged.status().message(), HasSubstr("tensor '" + tensor + "'"));
    EXPECT_THAT(merged.status().message(), HasSubstr("part-" + std::to_string(i) + ".json"));
    EXPECT_THAT(merged.status().message(),
                HasSubstr("part-" + std::to_string(1 - i) + ".json (part " +
                          std::to_string(1 - i) + "/2), which hashed the file"));
    return;
  }
  FAIL() << "no part read a tensor from the other part's files";
}

}  // namespace
}  // namespace ckpt::audit
