// DSSE/PAE, Ed25519 keys and key files, trust files, the float guard and the record schema.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "core/evidence/base64.h"
#include "core/evidence/dsse.h"
#include "core/evidence/ecdsa.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/json_guard.h"
#include "core/evidence/record.h"
#include "core/evidence/test_result.h"
#include "core/evidence/trust_store.h"
#include "core/sha256.h"
#include "core/text/json_dump.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::evidence {
namespace {

using ::ckpt::testing::TempDir;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

TEST(Pae, MatchesHandComputedBytes) {
  // "DSSEv1" SP len(type)=29 SP type SP len(body)=11 SP body, lengths in ASCII decimal.
  EXPECT_EQ(Pae("http://example.com/HelloWorld", "hello world"),
            "DSSEv1 29 http://example.com/HelloWorld 11 hello world");
  EXPECT_EQ(Pae("", ""), "DSSEv1 0  0 ");
  // Length counts bytes, not characters: U+00E9 is two bytes in UTF-8.
  EXPECT_EQ(Pae("t", "\xC3\xA9"), "DSSEv1 1 t 2 \xC3\xA9");
}

TEST(Base64, RoundTripsAndRejectsNonCanonical) {
  for (std::string s : {"", "f", "fo", "foo", "foob", "fooba", "foobar"}) {
    auto d = Base64Decode(Base64Encode(s));
    ASSERT_TRUE(d.ok()) << s;
    EXPECT_EQ(std::string(d->begin(), d->end()), s);
  }
  EXPECT_EQ(Base64Encode(std::string("foobar")), "Zm9vYmFy");
  EXPECT_FALSE(Base64Decode("Zm9").ok());     // bad length
  EXPECT_FALSE(Base64Decode("Zm9=").ok());    // stray bits under the padding
  EXPECT_FALSE(Base64Decode("Zm 9v").ok());   // whitespace
  EXPECT_FALSE(Base64Decode("Zm9v_mFy").ok());  // URL alphabet
}

TEST(Dsse, SignVerifyAndTamper) {
  auto key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  std::string env_text = *SignEnvelope("{\"a\":1}", kInTotoPayloadType, *key);
  auto env = ParseEnvelope(env_text);
  ASSERT_TRUE(env.ok()) << env.status();
  EXPECT_EQ(env->payload, "{\"a\":1}");
  ASSERT_EQ(env->signatures.size(), 1u);
  EXPECT_EQ(env->signatures[0].keyid, key->public_key().KeyId());

  TrustStore trust;
  trust.Add(key->public_key());
  auto ok = VerifyEnvelope(*env, trust);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(*ok, key->public_key().KeyId());

  Envelope changed = *env;
  changed.payload = "{\"a\":2}";
  EXPECT_FALSE(VerifyEnvelope(changed, trust).ok());
  changed = *env;
  changed.payload_type = "application/json";  // PAE binds the type too
  EXPECT_FALSE(VerifyEnvelope(changed, trust).ok());

  auto other = SigningKey::Generate();
  TrustStore stranger;
  stranger.Add(other->public_key());
  auto untrusted = VerifyEnvelope(*env, stranger);
  ASSERT_FALSE(untrusted.ok());
  EXPECT_THAT(std::string(untrusted.status().message()), HasSubstr("untrusted"));
  EXPECT_THAT(std::string(untrusted.status().message()), HasSubstr(key->public_key().KeyId()));
}

TEST(Dsse, KeyIdIsSha256OfRawPublicKey) {
  auto key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->public_key().KeyId(), ToHex(Sha256Of(key->public_key().raw())));
  EXPECT_EQ(key->public_key().KeyId().size(), 64u);
}

// An independent verifier: the openssl CLI checks our Ed25519 signature over the PAE bytes.
TEST(Dsse, OpensslCliVerifiesSignature) {
  ASSERT_EQ(std::system("openssl version > /dev/null 2>&1"), 0)
      << "the openssl CLI is required (deploy/install-deps.sh installs package 'openssl')";
  TempDir dir;
  auto key = SigningKey::Generate();
  ASSERT_TRUE(key.ok());
  std::string payload = R"({"_type":"https://in-toto.io/Statement/v1"})";
  auto env = ParseEnvelope(*SignEnvelope(payload, kInTotoPayloadType, *key));
  ASSERT_TRUE(env.ok());
  WriteAll(dir / "pub.pem", key->public_key().ToPem());
  WriteAll(dir / "pae.bin", Pae(kInTotoPayloadType, payload));
  WriteAll(dir / "sig.bin", env->signatures[0].sig);
  WriteAll(dir / "bad.bin", Pae(kInTotoPayloadType, payload + " "));
  std::string base = "openssl pkeyutl -verify -pubin -inkey " + (dir / "pub.pem").string() +
                     " -rawin -sigfile " + (dir / "sig.bin").string() + " -in ";
  EXPECT_EQ(std::system((base + (dir / "pae.bin").string() + " > /dev/null 2>&1").c_str()), 0);
  EXPECT_NE(std::system((base + (dir / "bad.bin").string() + " > /dev/null 2>&1").c_str()), 0);
}

TEST(Keys, SavedWith0600AndReloaded) {
  TempDir dir;
  auto key = SigningKey::Generate();
  std::string path = (dir / "k.pem").string();
  ASSERT_TRUE(key->Save(path).ok());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto again = SigningKey::Load(path);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->public_key().raw(), key->public_key().raw());
  EXPECT_EQ(key->Save(path).code(), absl::StatusCode::kAlreadyExists);  // never overwrites
}

TEST(Keys, RefusesGroupOrOtherReadableKey) {
  TempDir dir;
  auto key = SigningKey::Generate();
  std::string path = (dir / "k.pem").string();
  ASSERT_TRUE(key->Save(path).ok());
  for (mode_t mode : {0640, 0604, 0660}) {
    ::chmod(path.c_str(), mode);
    auto loaded = SigningKey::Load(path);
    ASSERT_FALSE(loaded.ok()) << mode;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(loaded.status().message()), HasSubstr(path));
  }
}

// A key path is followed if it is a link (secret mounts), but what it leads to must be a small
// regular file: a FIFO planted there is refused at once instead of blocking the open or the read
// forever, and a huge file is refused before it is read. Both key types share these rules.
TEST(Keys, KeyFileMustBeASmallRegularFile) {
  TempDir dir;
  const std::string fifo = (dir / "fifo.pem").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(SigningKey::Load(fifo).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(EcdsaSigningKey::Load(fifo).status().code(), absl::StatusCode::kInvalidArgument);

  const std::string big = (dir / "big.pem").string();
  WriteAll(big, std::string((1 << 20) + 1, 'A'));
  ::chmod(big.c_str(), 0600);
  auto loaded = SigningKey::Load(big);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(loaded.status().message()), HasSubstr("too large"));

  auto key = SigningKey::Generate();
  const std::string real = (dir / "k.pem").string();
  ASSERT_TRUE(key->Save(real).ok());
  std::filesystem::create_symlink(real, dir / "link.pem");
  auto linked = SigningKey::Load((dir / "link.pem").string());
  ASSERT_TRUE(linked.ok()) << linked.status();
  EXPECT_EQ(linked->public_key().raw(), key->public_key().raw());
  // Saving never writes through a link, and never replaces what is there.
  EXPECT_FALSE(key->Save((dir / "link.pem").string()).ok());
  EXPECT_EQ(EcdsaSigningKey::Load("/nonexistent/key.pem").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Keys, PublicKeyPemRoundTrip) {
  auto key = SigningKey::Generate();
  auto pub = PublicKey::FromPem(key->public_key().ToPem());
  ASSERT_TRUE(pub.ok());
  EXPECT_EQ(pub->raw(), key->public_key().raw());
  EXPECT_FALSE(PublicKey::FromPem("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n")
                   .ok());
}

TEST(TrustStore, RotationKeepsOldRecordsVerifiable) {
  TempDir dir;
  std::string path = (dir / "trusted").string();
  auto old_key = SigningKey::Generate();
  auto new_key = SigningKey::Generate();
  std::string old_env = *SignEnvelope("{}", kInTotoPayloadType, *old_key);
  ASSERT_TRUE(TrustStore::AppendToFile(path, old_key->public_key(), "old").ok());
  ASSERT_TRUE(TrustStore::AppendToFile(path, new_key->public_key(), "new").ok());
  ASSERT_TRUE(TrustStore::AppendToFile(path, new_key->public_key(), "new").ok());  // no dup
  auto trust = TrustStore::Load(path);
  ASSERT_TRUE(trust.ok()) << trust.status();
  EXPECT_EQ(trust->keys().size(), 2u);
  EXPECT_TRUE(VerifyEnvelope(*ParseEnvelope(old_env), *trust).ok());
  // Revoking the old key (removing its line) makes its records fail.
  WriteAll(dir / "trusted", TrustStore::Line(new_key->public_key(), "new"));
  auto revoked = TrustStore::Load(path);
  ASSERT_TRUE(revoked.ok());
  EXPECT_FALSE(VerifyEnvelope(*ParseEnvelope(old_env), *revoked).ok());
}

// Finding 9: whoever can write the trust file chooses which signatures verify.
TEST(TrustStore, FileOthersCanWriteIsRefused) {
  TempDir dir;
  std::string path = (dir / "trusted").string();
  auto key = SigningKey::Generate();
  mode_t old = ::umask(0);
  ASSERT_TRUE(TrustStore::AppendToFile(path, key->public_key(), "k").ok());
  ::umask(old);
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::all,
            std::filesystem::perms(0644));  // created 0644 whatever the umask
  EXPECT_TRUE(TrustStore::Load(path).ok());
  for (auto mode : {std::filesystem::perms(0664), std::filesystem::perms(0646)}) {
    std::filesystem::permissions(path, mode);
    auto refused = TrustStore::Load(path);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(std::string(refused.status().message()), HasSubstr("trust file is writable by "));
  }
}

TEST(TrustStore, MalformedLineNamed) {
  auto t = TrustStore::Parse("# comment\n\ned25519 notbase64!\n", "trust.txt");
  ASSERT_FALSE(t.ok());
  EXPECT_THAT(std::string(t.status().message()), HasSubstr("trust.txt:3"));
  EXPECT_FALSE(TrustStore::Parse("rsa AAAA\n", "t").ok());
}

TEST(JsonGuard, RejectsFloatsAnywhere) {
  EXPECT_TRUE(RejectFloats(nlohmann::json::parse(R"({"a":[1,"1.5",true,null,{"b":-3}]})")).ok());
  auto s = RejectFloats(nlohmann::json::parse(R"({"a":[1,{"b/c":1.5}]})"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("/a/1/b~1c"));
  EXPECT_FALSE(RejectFloats(nlohmann::json(0.0)).ok());
}

EvidenceRecord SampleRecord() {
  EvidenceRecord r;
  r.root = "/models/m";
  r.subjects = {{"model.safetensors", std::string(64, 'a')},
                {kManifestRootSubject, std::string(64, 'b')}};
  r.policy = {"scale-window", "1", {{"max_span", 17}}};
  CheckResult digests;
  digests.name = "file_digests";
  digests.counts["files"] = 1;
  r.checks.push_back(digests);
  CheckResult window;
  window.name = "scale_window";
  window.verdict = Verdict::kFail;
  for (int i = 0; i < 30; ++i) {
    Finding f;
    f.tensor = "t";
    f.row = i;
    window.findings.push_back(f);
  }
  r.checks.push_back(window);
  r.environment = CollectEnvironment();
  r.started_at = "2026-01-01T00:00:00.000Z";
  r.finished_at = "2026-01-01T00:00:01.000Z";
  return r;
}

TEST(Record, StatementShapeAndVerdict) {
  EvidenceRecord r = SampleRecord();
  auto payload = RecordPayload(r);
  ASSERT_TRUE(payload.ok()) << payload.status();
  auto j = nlohmann::json::parse(*payload);
  EXPECT_EQ(j["_type"], "https://in-toto.io/Statement/v1");
  EXPECT_EQ(j["predicateType"], kEvidencePredicateType);
  EXPECT_EQ(j["subject"][1]["name"], kManifestRootSubject);
  EXPECT_EQ(j["subject"][0]["digest"]["sha256"], std::string(64, 'a'));
  const auto& p = j["predicate"];
  EXPECT_EQ(p["verdict"], "fail");
  EXPECT_EQ(p["schema_version"], kEvidenceSchemaVersion);
  EXPECT_EQ(p["checks"][1]["findings"].size(), kMaxFindings);
  EXPECT_EQ(p["checks"][1]["findings_total"], 30);
  EXPECT_FALSE(p["environment"]["git_commit"].get<std::string>().empty());
  auto idx = IndexPayload(*payload);
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_EQ(idx->verdict, "fail");
  EXPECT_EQ(idx->policy, "scale-window");
  EXPECT_EQ(idx->subjects.size(), 2u);

  r.checks[1].verdict = Verdict::kPass;
  EXPECT_EQ(nlohmann::json::parse(*RecordPayload(r))["predicate"]["verdict"], "pass");
}

// The typed values' JSON (check_result.h): unset fields are left out; a finding's keys come as
// code, status, path, the rest by name, fails; details keep the order they were set in; a
// tensor name that is not UTF-8 is written in the name encoding.
TEST(Record, CheckValuesAreWrittenInTheirDocumentedOrder) {
  CheckResult c;
  c.name = "hf_layout";
  c.verdict = Verdict::kFail;
  Finding layout;
  layout.code = "etag-mismatch";
  layout.path = "config.json";
  layout.message = "differs";
  layout.fails = true;
  Finding window;
  window.code = "over-span";
  window.message = "m";
  window.tensor = std::string("w\xff", 2);
  window.row = 1;
  window.group = 2;
  window.numbers = {{"k", -25}, {"a_first", 3}};
  c.findings = {layout, window};
  c.series.push_back({"t", "u", 17, std::nullopt, {{"L1", 5}}});
  c.details.Set("verdict", std::string("over-span"));
  c.details.Set("snapshot_is_main", false);
  c.details.Set("root_map", std::vector<std::string>{"/a=/b"});
  c.details.Set("policy", ScaleWindowThresholds{"p", 2, 17, 15, -6, 64});
  c.details.Set("verdict", std::string("again"));  // replaced where it was
  EXPECT_EQ(DumpJson(c.ToJson()),
            R"({"name":"hf_layout","verdict":"fail","counts":{},"findings_total":2,"findings":[)"
            R"({"code":"etag-mismatch","path":"config.json","message":"differs","fails":true},)"
            R"({"code":"over-span","a_first":3,"group":2,"k":-25,"message":"m","row":1,)"
            R"("tensor":"w%FF"}],"series":[{"title":"t","unit":"u","limit":17,)"
            R"("points":[{"label":"L1","value":5}]}],"details":{"verdict":"again",)"
            R"("snapshot_is_main":false,"root_map":["/a=/b"],"policy":{"id":"p/2",)"
            R"("marlin_min_scale_log2":-6,"marlin_span":15,"max_listed":64,"max_span":17,)"
            R"("name":"p","version":2}}})");
  EXPECT_EQ(c.details.String("verdict"), "again");
  EXPECT_EQ(c.details.String("snapshot_is_main"), "");
  EXPECT_EQ(c.details.String("absent"), "");
}

TEST(Record, FloatsAndBadDigestsAreRefusedBeforeSigning) {
  EvidenceRecord r = SampleRecord();
  // Checks and the block forward carry integers and strings by type; a policy's thresholds are
  // still JSON (provenance statements carry them on unchanged).
  r.policy.thresholds = {{"ratio", 0.25}};
  auto s = RecordPayload(r);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.status().message()),
              HasSubstr("/predicate/policy/thresholds/ratio"));
  r = SampleRecord();
  r.subjects[0].sha256 = "ABC";
  EXPECT_FALSE(RecordPayload(r).ok());
}

// Whatever a database file holds is read back with the bounded parser: an envelope or payload
// nested without end, or one with a duplicate key (two parsers could read two different
// statements from it), is an error, never a deep recursion in a later dump or comparison.
TEST(Record, StoredJsonIsReadBackBounded) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  EXPECT_EQ(ParseEnvelope(deep).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(IndexPayload(deep).ok());
  EXPECT_FALSE(TestResultRecordLink(deep).ok());
  const std::string twice =
      R"({"_type":"https://in-toto.io/Statement/v1","_type":"https://in-toto.io/Statement/v1",)"
      R"("subject":[],"predicateType":"x","predicate":{}})";
  auto idx = IndexPayload(twice);
  ASSERT_FALSE(idx.ok());
  EXPECT_THAT(std::string(idx.status().message()), HasSubstr("duplicate"));
}

// An OCI binding is a typed field (docs/evidence.md): written only when set, read back by the
// index, and refused in either direction unless it is sha256:<64 hex>. A file named like a
// subject that names no file is refused.
TEST(Record, OciManifestIsATypedFieldReadBackByTheIndex) {
  EvidenceRecord r = SampleRecord();
  EXPECT_FALSE(nlohmann::json::parse(*RecordPayload(r))["predicate"].contains("oci_manifest"));
  EXPECT_TRUE(IndexPayload(*RecordPayload(r))->oci_manifest.empty());
  r.oci_manifest = "sha256:" + std::string(64, 'e');
  auto payload = RecordPayload(r);
  ASSERT_TRUE(payload.ok()) << payload.status();
  auto idx = IndexPayload(*payload);
  ASSERT_TRUE(idx.ok()) << idx.status();
  EXPECT_EQ(idx->oci_manifest, r.oci_manifest);
  for (const std::string bad : {"sha256:" + std::string(63, 'e'), std::string(64, 'e'),
                                "sha256:" + std::string(64, 'E')}) {
    r.oci_manifest = bad;
    EXPECT_EQ(RecordPayload(r).status().code(), absl::StatusCode::kInvalidArgument) << bad;
    std::string forged = *payload;
    forged.replace(forged.find("sha256:" + std::string(64, 'e')), 71, bad);
    EXPECT_THAT(std::string(IndexPayload(forged).status().message()),
                HasSubstr("oci_manifest is not sha256:<64 hex>"))
        << bad;
  }
  EXPECT_TRUE(CheckFileSubjectName("/m", "config.json").ok());
  EXPECT_TRUE(CheckFileSubjectName("/m", "sub/oci-manifest").ok());
  for (const char* reserved : {kOciManifestSubject, kManifestRootSubject}) {
    auto s = CheckFileSubjectName("/m", reserved);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr(std::string("/m/") + reserved + ": "));
  }
}

TEST(Record, VerificationSummary) {
  EvidenceRecord r = SampleRecord();
  auto vsa = VerificationSummaryPayload(r, "https://ckpt-audit.dev/verifier", "log#3",
                                        std::string(64, 'c'));
  ASSERT_TRUE(vsa.ok()) << vsa.status();
  auto j = nlohmann::json::parse(*vsa);
  EXPECT_EQ(j["predicateType"], "https://slsa.dev/verification_summary/v1");
  EXPECT_EQ(j["predicate"]["verificationResult"], "FAILED");
  EXPECT_EQ(j["predicate"]["resourceUri"], "file:///models/m");
  auto idx = IndexPayload(*vsa);
  ASSERT_TRUE(idx.ok());
  EXPECT_EQ(idx->verdict, "fail");
  ASSERT_EQ(j["predicate"]["inputAttestations"].size(), 1u);
  EXPECT_EQ(j["predicate"]["inputAttestations"][0]["uri"], "log#3");
  // A decision that rests on no record names no input attestation, and a policy URI given
  // with the policy is stated as is.
  r.policy.uri = "ckpt-audit:gate/none@1?policy=scale-window";
  auto none = nlohmann::json::parse(*VerificationSummaryPayload(r, "https://v", "", ""));
  EXPECT_TRUE(none["predicate"]["inputAttestations"].empty());
  EXPECT_EQ(none["predicate"]["policy"]["uri"], r.policy.uri);
  EXPECT_FALSE(none["predicate"].contains("source"));
  // A decision that rests on a source names its OMS ROOT (docs/evidence.md).
  r.source = SourceBinding{"/models/src", std::string(64, 'd'), {}};
  auto sourced = nlohmann::json::parse(*VerificationSummaryPayload(r, "https://v", "", ""));
  EXPECT_EQ(sourced["predicate"]["source"]["manifest_root"], std::string(64, 'd'));
  EXPECT_FALSE(sourced["predicate"]["source"].contains("root"));
}

}  // namespace
}  // namespace ckpt::evidence
