// The interoperability commands end to end through the ckpt-audit binary: keys --type ecdsa-*,
// sign / verify-signature (exit 0/1/2), transcode's provenance and verify-chain on the fixture
// pair, audit's test result, export, proof / verify-proof and the log's note verifier key.
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/evidence/base64.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "core/interop/tree_subjects.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/evidence_log.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using Result = ::ckpt::testing::CliResult;
using json = nlohmann::json;

const std::string kVectors = "interop/model-signing/model-transparency/";

class InteropCli : public ::ckpt::testing::CliWorkspace {
 protected:
  // Copies an upstream model_signing vector directory under its own name.
  fs::path CopyVector(const std::string& name) {
    fs::path dst = dir_ / name;
    fs::copy(Fixture(kVectors + name), dst, fs::copy_options::recursive);
    for (auto& e : fs::directory_iterator(dst)) {
      fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
    }
    fs::permissions(dst, fs::perms::owner_write, fs::perm_options::add);
    return dst;
  }
};

TEST_F(InteropCli, UpstreamSignaturesVerifyWithExitCodes) {
  std::string pub = Fixture(kVectors + "certificate/signing-key-pub.pem").string();
  std::string key_dir = Fixture(kVectors + "v1.1.0-elliptic-key").string();
  Result ok = Run("verify-signature " + key_dir + " --signature " + key_dir +
                  "/model.sig --public-key " + pub);
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("VERIFIED"));
  std::string old_dir = Fixture(kVectors + "v1.0.1-elliptic-key").string();
  Result old = Run("verify-signature " + old_dir + " --signature " + old_dir +
                   "/model.sig --public-key " + pub + " --ignore-paths " + old_dir + "/ignore-me");
  EXPECT_EQ(old.rc, 0) << old.out << old.err;
  std::string cert_dir = Fixture(kVectors + "v1.1.0-certificate").string();
  Result cert = Run("verify-signature " + cert_dir + " --signature " + cert_dir +
                    "/model.sig --certificate-chain " +
                    Fixture(kVectors + "certificate/ca-cert.pem").string() + " --json");
  EXPECT_EQ(cert.rc, 0) << cert.out << cert.err;
  EXPECT_TRUE(json::parse(cert.out)["verified"].get<bool>());

  fs::path copy = CopyVector("v1.1.0-elliptic-key");
  ::ckpt::testing::WriteAll(copy / "signme-2", std::string("changed"));
  Result changed = Run("verify-signature " + copy.string() + " --signature " +
                       (copy / "model.sig").string() + " --public-key " + pub + " --json");
  EXPECT_EQ(changed.rc, 1);
  json cj = json::parse(changed.out);
  EXPECT_EQ(cj["reason"], "files-differ");
  EXPECT_THAT(cj["differences"][0].get<std::string>(), HasSubstr("changed: signme-2"));

  ::ckpt::testing::WriteAll(dir_ / "garbage.sig", std::string("{\"mediaType\": 1"));
  Result garbage = Run("verify-signature " + key_dir + " --signature " +
                       (dir_ / "garbage.sig").string() + " --public-key " + pub);
  EXPECT_EQ(garbage.rc, 2);
  EXPECT_THAT(garbage.out, HasSubstr("NOT VERIFIED (malformed-bundle)"));
  EXPECT_EQ(Run("verify-signature " + key_dir + " --signature " + key_dir + "/model.sig").rc, 2);
  EXPECT_EQ(Run("verify-signature " + key_dir + " --signature " + key_dir + "/model.sig" +
                " --public-key " + pub + " --certificate-chain " + pub).rc,
            2);
  EXPECT_EQ(Run("verify-signature " + key_dir + " --signature " + key_dir +
                "/model.sig --public-key " + Fixture("mini-kimi-mxfp4/config.json").string()).rc,
            2);
}

TEST_F(InteropCli, SignWithAGeneratedKeyThenVerify) {
  std::string ec = (dir_ / "ec.pem").string();
  Result gen = Run("keys generate --type ecdsa-p256 --out " + ec + " --json");
  ASSERT_EQ(gen.rc, 0) << gen.err;
  json gj = json::parse(gen.out);
  EXPECT_EQ(gj["type"], "ecdsa-p256");
  EXPECT_TRUE(fs::exists(ec + ".pub"));
  Result show = Run("keys show --key " + ec);
  EXPECT_THAT(show.out, HasSubstr(gj["hint"].get<std::string>()));
  EXPECT_EQ(Run("keys generate --type rsa --out " + (dir_ / "r.pem").string()).rc, 2);

  fs::path model = CopyFixture("mini-kimi-mxfp4", dir_);
  std::string sig = (model / "model.sig").string();  // inside the model: never signs itself
  Result sign = Run("sign " + model.string() + " --key " + ec + " --signature " + sig);
  ASSERT_EQ(sign.rc, 0) << sign.err;
  Result v = Run("verify-signature " + model.string() + " --signature " + sig +
                 " --public-key " + ec + ".pub --json");
  EXPECT_EQ(v.rc, 0) << v.out;
  EXPECT_EQ(json::parse(v.out)["resources"], 4);
  // The OMS ROOT is the one `fingerprint` prints for the same files.
  Result fp = Run("fingerprint " + Fixture("mini-kimi-mxfp4").string() + " --json --no-tensors");
  EXPECT_EQ(json::parse(v.out)["manifest_root"], json::parse(fp.out)["manifest"]["root_sha256"]);

  fs::remove(model / "config.json");
  Result removed = Run("verify-signature " + model.string() + " --signature " + sig +
                       " --public-key " + ec + ".pub");
  EXPECT_EQ(removed.rc, 1);
  EXPECT_THAT(removed.out, HasSubstr("removed: config.json"));
  // Signing needs an ECDSA key; the Ed25519 evidence key is refused.
  MakeKey();
  EXPECT_EQ(Run("sign " + model.string() + " --key " + Key() + " --signature " + sig).rc, 2);
}

// A pair-audit record (schema 2: the source bound in predicate.source) over the trees on disk,
// with a chosen verdict and, optionally, a different bound source ROOT.
std::string PairAuditEnvelope(const fs::path& derived, const fs::path& source,
                              const evidence::SigningKey& key, const std::string& verdict,
                              const std::string& source_root_override = "") {
  auto d = interop::TreeSubjects(derived.string(), 0, NoProgress());
  auto s = interop::TreeSubjects(source.string(), 0, NoProgress());
  EXPECT_TRUE(d.ok() && s.ok());
  evidence::EvidenceRecord r;
  r.root = derived.string();
  r.subjects = *d;
  evidence::SourceBinding binding;
  binding.root = source.string();
  for (const auto& sub : *s) {
    if (sub.name == evidence::kManifestRootSubject) {
      binding.manifest_root = source_root_override.empty() ? sub.sha256 : source_root_override;
    } else {
      binding.files.push_back(sub);
    }
  }
  r.source = binding;
  r.policy = {"scale-window", "1", {}};
  evidence::CheckResult pair;
  pair.name = "pair_verify";
  pair.verdict = verdict == "pass" ? evidence::Verdict::kPass : evidence::Verdict::kFail;
  r.checks.push_back(pair);
  r.started_at = r.finished_at = "2026-01-01T00:00:00.000Z";
  return *evidence::SignEnvelope(*evidence::RecordPayload(r), evidence::kInTotoPayloadType, key);
}

class ChainCli : public InteropCli {
 protected:
  void SetUp() override {
    MakeKey();
    source_ = Fixture("mini-kimi-mxfp4");
    derived_ = dir_ / "nv";
    Result t = Run("transcode --to nvfp4 " + source_.string() + " " + derived_.string() +
                   " --db " + Db() + " --key " + Key() + " --source-ref hf://org/mini@0123 --json");
    ASSERT_EQ(t.rc, 0) << t.err;
    json tj = json::parse(t.out);
    EXPECT_EQ(tj["provenance_record_id"], 0);
    EXPECT_EQ(tj["provenance"], derived_.string() + ".intoto.jsonl");
    key_ = std::make_unique<evidence::SigningKey>(*evidence::SigningKey::Load(Key()));
  }
  void AppendRecord(const std::string& envelope) {
    auto log = storage::EvidenceLog::Open(Db(), /*create=*/false);
    ASSERT_TRUE(log.ok());
    ASSERT_TRUE((*log)->Append(envelope, *key_).ok());
  }
  Result Chain(const std::string& extra = "") {
    return Run("verify-chain " + derived_.string() + " --db " + Db() + " --trust " + Trust() +
               " " + extra);
  }
  fs::path source_, derived_;
  std::unique_ptr<evidence::SigningKey> key_;
};

TEST_F(ChainCli, ProvenanceNamesBothTreesByDigest) {
  auto bytes = ::ckpt::testing::ReadAll(derived_.string() + ".intoto.jsonl");
  std::string line(bytes.begin(), bytes.end());
  ASSERT_EQ(line.back(), '\n');
  auto env = evidence::ParseEnvelope(line.substr(0, line.size() - 1));
  ASSERT_TRUE(env.ok());
  json p = json::parse(env->payload);
  EXPECT_EQ(p["predicateType"], "https://slsa.dev/provenance/v1");
  auto derived = interop::TreeSubjects(derived_.string(), 0, NoProgress());
  EXPECT_EQ(p["subject"].size(), derived->size());
  const json& deps = p["predicate"]["buildDefinition"]["resolvedDependencies"];
  EXPECT_EQ(deps.back()["uri"], "hf://org/mini@0123");
  EXPECT_EQ(p["predicate"]["buildDefinition"]["externalParameters"]["target_format"], "nvfp4");
  EXPECT_EQ(p["predicate"]["buildDefinition"]["externalParameters"]["layout"],
            "compressed-tensors");
  // The tensor files are byte for byte the committed NVFP4 fixture's (config.json is written by
  // a different JSON serializer, so it and the OMS ROOT differ).
  auto fixture = interop::TreeSubjects(Fixture("mini-kimi-nvfp4").string(), 0, NoProgress());
  auto ours = interop::SubjectMap(*derived), theirs = interop::SubjectMap(*fixture);
  for (const char* f : {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}) {
    EXPECT_EQ(ours.at(f), theirs.at(f)) << f;
  }
  size_t named = 0;
  for (const json& s : p["subject"]) named += ours.at(s["name"]) == s["digest"]["sha256"];
  EXPECT_EQ(named, ours.size());
  // And it is in the log (record 0) and verifies there.
  Result v = Run("verify --db " + Db() + " --id 0 --trust " + Trust());
  EXPECT_EQ(v.rc, 0) << v.out;
}

TEST_F(ChainCli, VerifiesEndToEndWithAPassingPairAudit) {
  Result none = Chain("--source " + source_.string());
  EXPECT_EQ(none.rc, 1) << none.out;
  EXPECT_THAT(none.out, HasSubstr("[FAIL] pair audit: no passing"));

  AppendRecord(PairAuditEnvelope(derived_, source_, *key_, "pass"));
  Result ok = Chain("--source " + source_.string());
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("[ok] provenance: " + derived_.string() + ".intoto.jsonl"));
  EXPECT_THAT(ok.out, HasSubstr("[ok] provenance: entry 0 is included"));
  EXPECT_THAT(ok.out, HasSubstr("[ok] derived: all"));
  EXPECT_THAT(ok.out, HasSubstr("[ok] source: all"));
  EXPECT_THAT(ok.out, HasSubstr("[ok] pair audit: record 1"));
  EXPECT_THAT(ok.out, HasSubstr("hf://org/mini@0123"));
  EXPECT_THAT(ok.out, HasSubstr("CHAIN VERIFIED"));

  // Without the source on this machine, and without the provenance file (found in the log).
  fs::remove(derived_.string() + ".intoto.jsonl");
  Result offline = Chain("--json");
  EXPECT_EQ(offline.rc, 0) << offline.out;
  json oj = json::parse(offline.out);
  EXPECT_EQ(oj["provenance_id"], 0);
  EXPECT_EQ(oj["pair_audit_id"], 1);
}

// The whole chain with nothing constructed by hand: transcode, then `audit --source`.
TEST_F(ChainCli, RealPairAuditCompletesTheChain) {
  Result audit = Run("audit " + derived_.string() + " --source " + source_.string() + " --db " +
                     Db() + " --key " + Key() + " --json");
  ASSERT_EQ(audit.rc, 0) << audit.out << audit.err;
  EXPECT_EQ(json::parse(audit.out)["record_id"], 1);
  Result ok = Chain("--source " + source_.string());
  EXPECT_EQ(ok.rc, 0) << ok.out << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("[ok] pair audit: record 1"));
  EXPECT_THAT(ok.out, HasSubstr("CHAIN VERIFIED"));
  // A single-checkpoint audit of the same content binds no source and does not count.
  Result single = Run("audit " + derived_.string() + " --db " + Db() + " --key " + Key());
  ASSERT_EQ(single.rc, 0) << single.err;
  Result still = Chain();
  EXPECT_EQ(still.rc, 0) << still.out;
  EXPECT_THAT(still.out, HasSubstr("[ok] pair audit: record 1"));
}

TEST_F(ChainCli, EveryBrokenLinkFails) {
  AppendRecord(PairAuditEnvelope(derived_, source_, *key_, "pass"));
  ASSERT_EQ(Chain().rc, 0);

  // The source given is not the one the provenance names.
  fs::path other_source = CopyFixture("mini-kimi-mxfp4", dir_);
  ::ckpt::testing::WriteAll(other_source / "config.json", std::string("{}"));
  Result src = Chain("--source " + other_source.string());
  EXPECT_EQ(src.rc, 1);
  EXPECT_THAT(src.out, HasSubstr("changed: config.json"));

  // The provenance file edited: its signature no longer verifies.
  std::string path = derived_.string() + ".intoto.jsonl";
  auto bytes = ::ckpt::testing::ReadAll(path);
  std::string line(bytes.begin(), bytes.end());
  auto env = *evidence::ParseEnvelope(line.substr(0, line.size() - 1));
  std::string forged = env.payload;
  forged.replace(forged.find("nvfp4"), 5, "NVFP4");
  json fj = json::parse(line);
  fj["payload"] = evidence::Base64Encode(forged);
  fs::permissions(path, fs::perms::owner_write, fs::perm_options::add);
  ::ckpt::testing::WriteAll(path, fj.dump() + "\n");
  Result forged_run = Chain();
  EXPECT_EQ(forged_run.rc, 1);
  EXPECT_THAT(forged_run.out, HasSubstr("[FAIL] provenance:"));
  fs::remove(path);  // from here on the log's copy is used

  // A derived file changed on disk: neither the provenance nor any pair audit names it.
  ::ckpt::testing::WriteAll(derived_ / "config.json", std::string("{}"));
  Result derived = Chain();
  EXPECT_EQ(derived.rc, 1);
  EXPECT_THAT(derived.out, HasSubstr("[FAIL] provenance: no"));
}

TEST_F(ChainCli, PairAuditsThatDoNotFitAreRejectedWithReasons) {
  // Failing, bound to another source, and signed by a key outside the trust file.
  AppendRecord(PairAuditEnvelope(derived_, source_, *key_, "fail"));
  AppendRecord(PairAuditEnvelope(derived_, source_, *key_, "pass", std::string(64, 'f')));
  auto stranger = evidence::SigningKey::Generate();
  AppendRecord(PairAuditEnvelope(derived_, source_, *stranger, "pass"));
  Result r = Chain();
  EXPECT_EQ(r.rc, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("record 1: verdict fail"));
  EXPECT_THAT(r.out, HasSubstr("record 2: audited against source OMS ROOT ffff"));
  EXPECT_THAT(r.out, HasSubstr("record 3: DSSE envelope signed only by untrusted keys"));
  // A record of this content without a bound source (a single-checkpoint audit).
  Result audit = Run("audit " + derived_.string() + " --db " + Db() + " --key " + Key());
  ASSERT_EQ(audit.rc, 0) << audit.err;
  Result again = Chain();
  EXPECT_EQ(again.rc, 1);
  EXPECT_THAT(again.out, HasSubstr("record 4: binds no source"));
}

TEST_F(InteropCli, AuditLogsATestResultAndExportBundlesThem) {
  MakeKey();
  Result a = Run("audit " + Fixture("mini-kimi-mxfp4").string() + " --db " + Db() + " --key " +
                 Key() + " --json");
  ASSERT_EQ(a.rc, 0) << a.err;
  json aj = json::parse(a.out);
  EXPECT_EQ(aj["record_id"], 0);
  EXPECT_EQ(aj["test_result_id"], 1);
  Result e = Run("export --db " + Db() + " --id 0 --format intoto-jsonl");
  ASSERT_EQ(e.rc, 0) << e.err;
  std::vector<std::string> lines = absl::StrSplit(e.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u);
  auto test_result = evidence::ParseEnvelope(lines[1]);
  ASSERT_TRUE(test_result.ok());
  json tj = json::parse(test_result->payload);
  EXPECT_EQ(tj["predicateType"], "https://in-toto.io/attestation/test-result/v0.1");
  EXPECT_EQ(tj["predicate"]["result"], "PASSED");
  json record = json::parse(evidence::ParseEnvelope(lines[0])->payload);
  EXPECT_EQ(tj["subject"][0]["digest"], record["subject"].back()["digest"]);  // the OMS ROOT
  EXPECT_EQ(record["subject"].back()["name"], "oms-manifest-root");
  std::string out = (dir_ / "bundle.intoto.jsonl").string();
  EXPECT_EQ(Run("export --db " + Db() + " --id 1 --format intoto-jsonl --out " + out).rc, 0);
  auto written = ::ckpt::testing::ReadAll(out);
  EXPECT_EQ(std::string(written.begin(), written.end()), e.out);
  EXPECT_EQ(Run("export --db " + Db() + " --id 0 --format sarif").rc, 2);
  Result report = Run("report --db " + Db() + " 1 --trust " + Trust());
  EXPECT_EQ(report.rc, 2);
  EXPECT_THAT(report.err, HasSubstr("test-result/v0.1 statement; report renders evidence records"));
  Result vlog = Run("verify-log --db " + Db() + " --trust " + Trust());
  EXPECT_EQ(vlog.rc, 0) << vlog.out;
}

TEST_F(InteropCli, ProofsVerifyOfflineWithTheLogsVerifierKey) {
  MakeKey();
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(Run("audit " + Fixture("mini-kimi-mxfp4").string() + " --db " + Db() + " --key " +
                  Key()).rc,
              0);
  }
  Result show = Run("keys show --key " + Key() + " --db " + Db() + " --json");
  ASSERT_EQ(show.rc, 0) << show.err;
  std::string vkey = json::parse(show.out)["note_verifier_key"];
  auto log = storage::EvidenceLog::Open(Db(), false);
  EXPECT_EQ(vkey.rfind((*log)->origin() + "+", 0), 0u);

  std::string proof = (dir_ / "r2.tlog-proof").string();
  ASSERT_EQ(Run("proof --db " + Db() + " --id 2 --out " + proof).rc, 0);
  Result v = Run("verify-proof " + proof + " --vkey " + vkey + " --trust " + Trust());
  EXPECT_EQ(v.rc, 0) << v.out << v.err;
  EXPECT_THAT(v.out, HasSubstr("entry 2 is included"));
  EXPECT_THAT(v.out, HasSubstr("entry: https://ckpt-audit.dev/evidence/v1, verdict pass"));
  ::ckpt::testing::WriteAll(dir_ / "vkey", vkey + "\n");
  EXPECT_EQ(Run("verify-proof " + proof + " --vkey " + (dir_ / "vkey").string()).rc, 0);

  Result printed = Run("proof --db " + Db() + " --id 3");
  ASSERT_EQ(printed.rc, 0);
  EXPECT_EQ(printed.out.rfind("c2sp.org/tlog-proof@v1\nextra ", 0), 0u);
  std::string tampered = printed.out;
  tampered.replace(tampered.find("index 3"), 7, "index 2");
  ::ckpt::testing::WriteAll(dir_ / "bad.tlog-proof", tampered);
  Result bad = Run("verify-proof " + (dir_ / "bad.tlog-proof").string() + " --vkey " + vkey);
  EXPECT_EQ(bad.rc, 1);
  EXPECT_THAT(bad.out, HasSubstr("PROOF NOT VERIFIED"));
  EXPECT_EQ(Run("verify-proof " + proof + " --vkey not-a-key").rc, 2);
  EXPECT_EQ(Run("proof --db " + Db() + " --id 99").rc, 2);
}

// `keys show --db LOG` without --key shows the per-user key only when it signs LOG's
// checkpoints: a log signed by another key is refused, naming the per-user key.
TEST_F(InteropCli, KeysShowWithADbShowsOnlyTheLogsSigner) {
  MakeKey();
  const std::string signed_db = (dir_ / "other.db").string();
  ASSERT_EQ(Run("audit " + Fixture("mini-kimi-mxfp4").string() + " --db " + signed_db +
                " --key " + Key()).rc,
            0);
  const std::string per_user_db = (dir_ / "per-user.db").string();
  ASSERT_EQ(Run("audit " + Fixture("mini-kimi-mxfp4").string() + " --db " + per_user_db).rc, 0);

  Result refused = Run("keys show --db " + signed_db);
  EXPECT_EQ(refused.rc, 2);
  EXPECT_THAT(refused.err, HasSubstr("not signed by the per-user key"));
  EXPECT_THAT(refused.err, HasSubstr("--key"));
  EXPECT_EQ(refused.out, "");

  Result shown = Run("keys show --db " + per_user_db + " --json");
  ASSERT_EQ(shown.rc, 0) << shown.err;
  auto log = storage::EvidenceLog::Open(per_user_db, false);
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(json::parse(shown.out)["note_verifier_key"].get<std::string>().rfind(
                (*log)->origin() + "+", 0),
            0u);
  EXPECT_EQ(Run("keys show --key " + Key() + " --db " + signed_db).rc, 0);  // named: shown
}

}  // namespace
}  // namespace ckpt
