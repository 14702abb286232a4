// OpenSSF model signing (OMS v1.0) compatibility: the upstream model_signing vectors verify, every
// tampered copy fails with its named reason, the spec's invalid vectors are rejected, and bundles
// made here follow the upstream layout field by field (golden comparisons against
// tests/data/interop/model-signing, documented in docs/interop.md "Golden tests").
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/evidence/base64.h"
#include "core/evidence/cert_chain.h"
#include "core/evidence/dsse.h"
#include "core/evidence/ecdsa.h"
#include "core/evidence/oms_bundle.h"
#include "core/interop/model_signature.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_util.h"

namespace ckpt::interop {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;
using evidence::OmsReason;

const std::string kVectors = "interop/model-signing/model-transparency/";
const std::string kSpec = "interop/model-signing/model-signing-spec/test-vectors/v1.0/";

std::string Text(const fs::path& p) {
  auto b = ::ckpt::testing::ReadAll(p);
  return std::string(b.begin(), b.end());
}

evidence::EcdsaPublicKey UpstreamKey() {
  auto key = evidence::EcdsaPublicKey::FromPem(Text(Fixture(kVectors + "certificate/signing-key-pub.pem")));
  EXPECT_TRUE(key.ok()) << key.status();
  return *key;
}

ModelTrust KeyTrust() { return ModelTrust{UpstreamKey(), std::nullopt}; }

ModelTrust ChainTrust(const std::vector<std::string>& files) {
  std::vector<std::string> pems;
  for (const auto& f : files) pems.push_back(Text(Fixture(kVectors + "certificate/" + f)));
  auto trust = evidence::CertificateTrust::FromPem(pems);
  EXPECT_TRUE(trust.ok()) << trust.status();
  return ModelTrust{std::nullopt, *trust};
}

// Copies an upstream model directory (writable) into `dir` under its own name.
fs::path CopyModel(const std::string& name, const TempDir& dir) {
  fs::path dst = dir / name;
  fs::copy(Fixture(kVectors + name), dst, fs::copy_options::recursive);
  for (auto& e : fs::directory_iterator(dst)) {
    fs::permissions(e.path(), fs::perms::owner_write, fs::perm_options::add);
  }
  fs::permissions(dst, fs::perms::owner_write, fs::perm_options::add);
  return dst;
}

ModelSignatureCheck Verify(const fs::path& root, const std::string& bundle, const ModelTrust& trust,
                           std::vector<std::string> ignore = {"model.sig"}) {
  ModelSigningOptions options;
  options.ignore_paths = std::move(ignore);
  auto check = VerifyModelSignature(root.string(), bundle, trust, options, NoProgress());
  EXPECT_TRUE(check.ok()) << check.status();
  return check.ok() ? *check : ModelSignatureCheck{};
}

std::string ReasonOf(const ModelSignatureCheck& c) {
  return c.failure ? evidence::OmsReasonName(c.failure->reason) : "verified";
}

TEST(OmsUpstreamVectors, KeySignedV11Verifies) {
  fs::path root = Fixture(kVectors + "v1.1.0-elliptic-key");
  auto c = Verify(root, Text(root / "model.sig"), KeyTrust());
  ASSERT_TRUE(c.ok()) << ReasonOf(c) << ": " << (c.failure ? c.failure->detail : "");
  EXPECT_EQ(c.statement.model_name, "v1.1.0-elliptic-key");
  EXPECT_EQ(c.statement.root_sha256,
            "92745110b1ab4368471cbe31664e10174e954b113a3df333db860317b2c6dec4");
  ASSERT_EQ(c.statement.resources.size(), 2u);  // ignore-me is excluded by the signed ignore_paths
  EXPECT_EQ(c.signer, "key e8450dec4eb99dae995da9af1bc2cc9f76ed669ee2e744f57abba763df3e3f8e");
  EXPECT_TRUE(c.notes.empty());
}

TEST(OmsUpstreamVectors, OlderV101LayoutVerifiesWithCliIgnorePath) {
  fs::path root = Fixture(kVectors + "v1.0.1-elliptic-key");
  const std::string sig = Text(root / "model.sig");
  // v1.0.1 signatures carry no ignore_paths: upstream verifies with --ignore-paths DIR/ignore-me.
  auto c = Verify(root, sig, KeyTrust(), {"model.sig", "ignore-me"});
  ASSERT_TRUE(c.ok()) << ReasonOf(c) << ": " << (c.failure ? c.failure->detail : "");
  EXPECT_THAT(c.notes.at(0), HasSubstr("older bundle layout"));
  auto without = Verify(root, sig, KeyTrust());
  EXPECT_EQ(ReasonOf(without), "files-differ");
  EXPECT_THAT(without.differences.at(0), HasSubstr("added: ignore-me"));
}

TEST(OmsUpstreamVectors, CertificateSignedV11VerifiesAgainstTheRootCa) {
  fs::path root = Fixture(kVectors + "v1.1.0-certificate");
  const std::string sig = Text(root / "model.sig");
  auto c = Verify(root, sig, ChainTrust({"ca-cert.pem"}));
  ASSERT_TRUE(c.ok()) << ReasonOf(c) << ": " << (c.failure ? c.failure->detail : "");
  EXPECT_THAT(c.signer, HasSubstr("certificate /CN=intermediate-ca"));
  EXPECT_TRUE(Verify(root, sig, ChainTrust({"ca-cert.pem", "int-ca-cert.pem"})).ok());

  // Trusting only the intermediate: OpenSSL needs a self-signed anchor, as upstream's store does.
  auto partial = Verify(root, sig, ChainTrust({"int-ca-cert.pem"}));
  EXPECT_EQ(ReasonOf(partial), "certificate-invalid");
  // An unrelated trust anchor.
  auto other = Verify(root, sig, ChainTrust({"signing-key-cert.pem"}));
  EXPECT_EQ(ReasonOf(other), "certificate-invalid");
  // A certificate bundle checked with a bare key is a usage error, not a verification.
  EXPECT_EQ(ReasonOf(Verify(root, sig, KeyTrust())), "unsupported-bundle");
  // And a key bundle checked with certificates.
  fs::path key_root = Fixture(kVectors + "v1.1.0-elliptic-key");
  EXPECT_EQ(ReasonOf(Verify(key_root, Text(key_root / "model.sig"), ChainTrust({"ca-cert.pem"}))),
            "unsupported-bundle");
}

TEST(OmsUpstreamVectors, TheTestKeyIsP384) {
  EXPECT_EQ(UpstreamKey().curve(), evidence::EcCurve::kP384);
  EXPECT_EQ(UpstreamKey().Hint(),
            "e8450dec4eb99dae995da9af1bc2cc9f76ed669ee2e744f57abba763df3e3f8e");
}

TEST(OmsSpecVectors, ValidKeyAndCertificateBundlesVerify) {
  // Both sign the same two files as the v1.1.0 directories (subject name "model").
  fs::path root = Fixture(kVectors + "v1.1.0-elliptic-key");
  auto key = Verify(root, Text(Fixture(kSpec + "valid/key.bundle.json")), KeyTrust());
  ASSERT_TRUE(key.ok()) << ReasonOf(key) << ": " << (key.failure ? key.failure->detail : "");
  EXPECT_THAT(key.notes.at(0), HasSubstr("signed model name 'model'"));
  auto cert = Verify(root, Text(Fixture(kSpec + "valid/certificate.bundle.json")),
                     ChainTrust({"ca-cert.pem"}));
  EXPECT_TRUE(cert.ok()) << ReasonOf(cert) << ": " << (cert.failure ? cert.failure->detail : "");
}

TEST(OmsSpecVectors, KeylessSigstoreBundleIsRecognizedAndRefused) {
  fs::path root = Fixture(kVectors + "v1.1.0-elliptic-key");
  auto c = Verify(root, Text(Fixture(kSpec + "valid/sigstore.bundle.json")), KeyTrust());
  EXPECT_EQ(ReasonOf(c), "unsupported-bundle");
  EXPECT_THAT(c.failure->detail, HasSubstr("keyless Sigstore"));
}

TEST(OmsSpecVectors, InvalidVectorsAreRejected) {
  fs::path root = Fixture(kVectors + "v1.1.0-elliptic-key");
  struct Case {
    const char* file;
    const char* reason;
    const char* detail;
  } cases[] = {
      {"invalid/empty.bundle.json", "malformed-bundle", "invalid JSON"},
      {"invalid/missing-envelope.bundle.json", "malformed-bundle", "dsseEnvelope is missing"},
      {"invalid/missing-verification-material.bundle.json", "malformed-bundle",
       "verificationMaterial is missing"},
      {"invalid/missing-tlog-entries.bundle.json", "unsupported-bundle", "keyless Sigstore"},
      // Its signature was made over a different statement than the one it carries.
      {"invalid-payload/wrong-predicate.bundle.json", "signature-invalid", "does not verify"},
  };
  for (const Case& k : cases) {
    auto c = Verify(root, Text(Fixture(kSpec + k.file)), KeyTrust());
    EXPECT_EQ(ReasonOf(c), k.reason) << k.file;
    if (c.failure) {
      EXPECT_THAT(c.failure->detail, HasSubstr(k.detail)) << k.file;
    }
  }
}

// Golden: the statement and bundle serializers reproduce upstream's bytes exactly when given
// upstream's inputs (ECDSA signatures are randomized, so the signature is taken from upstream).
TEST(OmsGolden, SerializersReproduceTheUpstreamBundleByteForByte) {
  const std::string upstream = Text(Fixture(kVectors + "v1.1.0-elliptic-key/model.sig"));
  evidence::OmsBundle b;
  ASSERT_FALSE(evidence::ParseOmsBundle(upstream, &b));
  evidence::OmsStatement st;
  ASSERT_FALSE(evidence::ParseOmsStatement(b.payload, &st));
  EXPECT_EQ(evidence::OmsStatementPayload(st), b.payload);
  EXPECT_EQ(evidence::OmsKeyBundleJson(b.payload, b.signature, b.key_hint), upstream);
}

// Recursively: same keys in the same order, same JSON types; arrays compared element-wise
// against the first upstream element.
void ExpectSameShape(const nlohmann::ordered_json& ours, const nlohmann::ordered_json& theirs,
                     const std::string& where) {
  ASSERT_EQ(ours.type_name(), std::string(theirs.type_name())) << where;
  if (ours.is_object()) {
    std::vector<std::string> a, b;
    for (auto it = ours.begin(); it != ours.end(); ++it) a.push_back(it.key());
    for (auto it = theirs.begin(); it != theirs.end(); ++it) b.push_back(it.key());
    ASSERT_EQ(a, b) << where;
    for (const std::string& k : a) ExpectSameShape(ours[k], theirs[k], where + "." + k);
  } else if (ours.is_array() && !theirs.empty()) {
    for (size_t i = 0; i < ours.size(); ++i) {
      ExpectSameShape(ours[i], theirs[0], absl::StrCat(where, "[", i, "]"));
    }
  }
}

TEST(OmsGolden, OurBundleFollowsTheUpstreamLayoutFieldByField) {
  TempDir dir;
  fs::path root = CopyModel("v1.1.0-elliptic-key", dir);
  fs::path key_path = dir / "signing-key.pem";
  fs::copy_file(Fixture(kVectors + "certificate/signing-key.pem"), key_path);
  fs::permissions(key_path, fs::perms::owner_read | fs::perms::owner_write,
                  fs::perm_options::replace);
  auto key = evidence::EcdsaSigningKey::Load(key_path.string());
  ASSERT_TRUE(key.ok()) << key.status();
  ModelSigningOptions options;
  options.ignore_paths = {"ignore-me", "model.sig"};
  auto ours = SignModel(root.string(), *key, options, NoProgress());
  ASSERT_TRUE(ours.ok()) << ours.status();
  const std::string upstream = Text(root / "model.sig");

  auto oj = nlohmann::ordered_json::parse(*ours);
  auto uj = nlohmann::ordered_json::parse(upstream);
  ExpectSameShape(oj, uj, "bundle");
  EXPECT_EQ(oj.dump(), *ours) << "compact, as bundle.to_json() writes it";
  EXPECT_EQ(oj["verificationMaterial"], uj["verificationMaterial"]);  // same key: same hint
  EXPECT_EQ(oj["dsseEnvelope"]["payloadType"], uj["dsseEnvelope"]["payloadType"]);
  EXPECT_EQ(oj["dsseEnvelope"]["signatures"][0]["keyid"], "");

  evidence::OmsBundle ob, ub;
  ASSERT_FALSE(evidence::ParseOmsBundle(*ours, &ob));
  ASSERT_FALSE(evidence::ParseOmsBundle(upstream, &ub));
  auto op = nlohmann::ordered_json::parse(ob.payload);
  auto up = nlohmann::ordered_json::parse(ub.payload);
  ExpectSameShape(op, up, "statement");
  EXPECT_EQ(op.dump(2), ob.payload) << "two-space indent, as MessageToJson writes it";
  // Everything but the order of the ignore-path set is identical.
  auto sorted = [](nlohmann::ordered_json j) {
    std::vector<std::string> v = j.get<std::vector<std::string>>();
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(op["predicate"]["serialization"]["ignore_paths"]),
            sorted(up["predicate"]["serialization"]["ignore_paths"]));
  op["predicate"]["serialization"].erase("ignore_paths");
  up["predicate"]["serialization"].erase("ignore_paths");
  EXPECT_EQ(op, up);

  // And it verifies, here and with the published public key.
  auto c = Verify(root, *ours, KeyTrust());
  EXPECT_TRUE(c.ok()) << ReasonOf(c);
}

class OmsTamper : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = CopyModel("v1.1.0-elliptic-key", dir_);
    bundle_ = Text(root_ / "model.sig");
  }
  ModelSignatureCheck Check(const std::string& bundle) { return Verify(root_, bundle, KeyTrust()); }
  // The bundle with its JSON changed by `edit`.
  std::string Edited(const std::function<void(nlohmann::ordered_json&)>& edit) {
    auto j = nlohmann::ordered_json::parse(bundle_);
    edit(j);
    return j.dump();
  }
  TempDir dir_;
  fs::path root_;
  std::string bundle_;
};

TEST_F(OmsTamper, UntouchedCopyVerifies) { EXPECT_TRUE(Check(bundle_).ok()); }

TEST_F(OmsTamper, FileChanged) {
  ::ckpt::testing::WriteAll(root_ / "signme-1", std::string("signme-1 changed\n"));
  auto c = Check(bundle_);
  EXPECT_EQ(ReasonOf(c), "files-differ");
  ASSERT_EQ(c.differences.size(), 1u);
  EXPECT_THAT(c.differences[0], HasSubstr("changed: signme-1"));
}

TEST_F(OmsTamper, FileAdded) {
  ::ckpt::testing::WriteAll(root_ / "extra.bin", std::string("x"));
  auto c = Check(bundle_);
  EXPECT_EQ(ReasonOf(c), "files-differ");
  EXPECT_THAT(c.differences.at(0), HasSubstr("added: extra.bin"));
}

TEST_F(OmsTamper, FileAddedUnderAnIgnoredPathIsNotSigned) {
  // The signed ignore_paths are the signer's choice (upstream honours them too).
  ::ckpt::testing::WriteAll(root_ / "ignore-me", std::string("anything"));
  EXPECT_TRUE(Check(bundle_).ok());
}

TEST_F(OmsTamper, FileRemoved) {
  fs::remove(root_ / "signme-2");
  auto c = Check(bundle_);
  EXPECT_EQ(ReasonOf(c), "files-differ");
  EXPECT_THAT(c.differences.at(0), HasSubstr("removed: signme-2"));
}

TEST_F(OmsTamper, SignatureByteFlipped) {
  std::string edited = Edited([](nlohmann::ordered_json& j) {
    auto sig = *evidence::Base64Decode(j["dsseEnvelope"]["signatures"][0]["sig"]);
    sig[sig.size() / 2] ^= 0x01;
    j["dsseEnvelope"]["signatures"][0]["sig"] = evidence::Base64Encode(sig);
  });
  EXPECT_EQ(ReasonOf(Check(edited)), "signature-invalid");
}

TEST_F(OmsTamper, PayloadByteChanged) {
  std::string edited = Edited([](nlohmann::ordered_json& j) {
    auto p = *evidence::Base64Decode(j["dsseEnvelope"]["payload"]);
    std::string s(p.begin(), p.end());
    s.replace(s.find("signme-2"), 8, "signme-3");
    j["dsseEnvelope"]["payload"] = evidence::Base64Encode(s);
  });
  EXPECT_EQ(ReasonOf(Check(edited)), "signature-invalid");
}

TEST_F(OmsTamper, HintNamesAnotherKey) {
  std::string edited = Edited([](nlohmann::ordered_json& j) {
    j["verificationMaterial"]["publicKey"]["hint"] = std::string(64, '0');
  });
  auto c = Check(edited);
  EXPECT_EQ(ReasonOf(c), "key-mismatch");
  EXPECT_THAT(c.failure->detail, HasSubstr(std::string(64, '0')));
}

TEST_F(OmsTamper, ExtraJsonFieldAnywhereIsRejected) {
  const std::vector<std::pair<std::string, std::function<void(nlohmann::ordered_json&)>>> edits = {
      {"bundle.extra", [](auto& j) { j["extra"] = 1; }},
      {"verificationMaterial.extra", [](auto& j) { j["verificationMaterial"]["extra"] = 1; }},
      {"verificationMaterial.publicKey.extra",
       [](auto& j) { j["verificationMaterial"]["publicKey"]["extra"] = "x"; }},
      {"dsseEnvelope.extra", [](auto& j) { j["dsseEnvelope"]["extra"] = true; }},
      {"dsseEnvelope.signatures[0].extra",
       [](auto& j) { j["dsseEnvelope"]["signatures"][0]["extra"] = "x"; }},
  };
  for (const auto& [field, edit] : edits) {
    auto c = Check(Edited(edit));
    EXPECT_EQ(ReasonOf(c), "malformed-bundle") << field;
    if (c.failure) {
      EXPECT_THAT(c.failure->detail, HasSubstr("unknown field " + field));
    }
  }
}

TEST_F(OmsTamper, StructuralEditsAreRejectedWithTheirReason) {
  struct Case {
    const char* what;
    std::function<void(nlohmann::ordered_json&)> edit;
    const char* reason;
  } cases[] = {
      {"second signature", [](auto& j) {
         j["dsseEnvelope"]["signatures"].push_back(j["dsseEnvelope"]["signatures"][0]);
       }, "malformed-bundle"},
      {"no signatures", [](auto& j) { j["dsseEnvelope"]["signatures"] = nlohmann::ordered_json::array(); },
       "malformed-bundle"},
      {"media type v0.2",
       [](auto& j) { j["mediaType"] = "application/vnd.dev.sigstore.bundle+json;version=0.2"; },
       "unsupported-bundle"},
      {"a tlog entry", [](auto& j) { j["verificationMaterial"]["tlogEntries"].push_back({}); },
       "unsupported-bundle"},
      {"two key materials",
       [](auto& j) { j["verificationMaterial"]["x509CertificateChain"] = {{"certificates", {}}}; },
       "malformed-bundle"},
      {"payload type", [](auto& j) { j["dsseEnvelope"]["payloadType"] = "text/plain"; },
       "statement-invalid"},  // PAE uses the in-toto type whatever the envelope says
      {"non-base64 sig", [](auto& j) { j["dsseEnvelope"]["signatures"][0]["sig"] = "*"; },
       "malformed-bundle"},
  };
  for (const Case& k : cases) EXPECT_EQ(ReasonOf(Check(Edited(k.edit))), k.reason) << k.what;
}

TEST_F(OmsTamper, DuplicateJsonKeyIsRejected) {
  std::string dup = bundle_;
  dup.insert(1, "\"mediaType\":\"application/vnd.dev.sigstore.bundle.v0.3+json\",");
  auto c = Check(dup);
  EXPECT_EQ(ReasonOf(c), "malformed-bundle");
  EXPECT_THAT(c.failure->detail, HasSubstr("duplicate JSON key 'mediaType'"));
}

// Statements that are signed correctly but are not consistent OMS statements.
class OmsStatementChecks : public ::testing::Test {
 protected:
  void SetUp() override {
    auto k = evidence::EcdsaSigningKey::Generate(evidence::EcCurve::kP256);
    ASSERT_TRUE(k.ok());
    key_ = std::make_unique<evidence::EcdsaSigningKey>(*k);
    root_ = CopyModel("v1.1.0-elliptic-key", dir_);
    auto st = ModelStatement(root_.string(), {{"ignore-me", "model.sig"}, 0}, NoProgress());
    ASSERT_TRUE(st.ok());
    statement_ = *st;
  }
  std::string Reason(const std::string& payload) {
    auto bundle = evidence::SignOmsKeyBundle(payload, *key_);
    EXPECT_TRUE(bundle.ok());
    return ReasonOf(Verify(root_, *bundle, ModelTrust{key_->public_key(), std::nullopt}));
  }
  TempDir dir_;
  fs::path root_;
  std::unique_ptr<evidence::EcdsaSigningKey> key_;
  evidence::OmsStatement statement_;
};

TEST_F(OmsStatementChecks, ConsistentStatementVerifies) {
  EXPECT_EQ(Reason(evidence::OmsStatementPayload(statement_)), "verified");
}

TEST_F(OmsStatementChecks, RootThatDoesNotMatchTheResources) {
  statement_.root_sha256 = std::string(64, 'a');
  EXPECT_EQ(Reason(evidence::OmsStatementPayload(statement_)), "statement-invalid");
}

TEST_F(OmsStatementChecks, DuplicateResource) {
  statement_.resources.push_back(statement_.resources[0]);
  statement_.root_sha256 = *evidence::OmsRootOf(statement_.resources);
  EXPECT_EQ(Reason(evidence::OmsStatementPayload(statement_)), "statement-invalid");
}

TEST_F(OmsStatementChecks, WrongPredicateTypeAndTwoSubjects) {
  auto j = nlohmann::ordered_json::parse(evidence::OmsStatementPayload(statement_));
  auto wrong = j;
  wrong["predicateType"] = "https://example.com/wrong-predicate/v1.0";
  EXPECT_EQ(Reason(wrong.dump(2)), "statement-invalid");
  auto two = j;
  two["subject"].push_back(two["subject"][0]);
  EXPECT_EQ(Reason(two.dump(2)), "statement-invalid");
  auto shards = j;
  shards["predicate"]["serialization"]["method"] = "shards";
  EXPECT_EQ(Reason(shards.dump(2)), "unsupported-bundle");
}

TEST(OmsKeys, EveryCurveSignsAndVerifiesAndKeysAreNotInterchangeable) {
  TempDir dir;
  fs::path root = CopyModel("v1.1.0-elliptic-key", dir);
  for (auto curve : {evidence::EcCurve::kP256, evidence::EcCurve::kP384, evidence::EcCurve::kP521}) {
    auto key = evidence::EcdsaSigningKey::Generate(curve);
    ASSERT_TRUE(key.ok());
    auto bundle = SignModel(root.string(), *key, {{"model.sig"}, 0}, NoProgress());
    ASSERT_TRUE(bundle.ok());
    EXPECT_TRUE(Verify(root, *bundle, ModelTrust{key->public_key(), std::nullopt}).ok())
        << evidence::EcCurveName(curve);
    // The upstream key is not this key: its hint differs.
    EXPECT_EQ(ReasonOf(Verify(root, *bundle, KeyTrust())), "key-mismatch");
  }
}

TEST(OmsKeys, KeyFilesFollowTheEvidenceKeyRules) {
  TempDir dir;
  auto key = evidence::EcdsaSigningKey::Generate(evidence::EcCurve::kP256);
  ASSERT_TRUE(key.ok());
  std::string path = (dir / "k.pem").string();
  ASSERT_TRUE(key->Save(path).ok());
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(key->Save(path).code(), absl::StatusCode::kAlreadyExists);
  auto loaded = evidence::EcdsaSigningKey::Load(path);
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded->public_key().Hint(), key->public_key().Hint());
  ::chmod(path.c_str(), 0644);
  EXPECT_EQ(evidence::EcdsaSigningKey::Load(path).status().code(),
            absl::StatusCode::kFailedPrecondition);
  // An Ed25519 key is not a model-signing key.
  auto ed = evidence::SigningKey::Generate();
  ASSERT_TRUE(ed.ok());
  std::string ed_path = (dir / "ed.pem").string();
  ASSERT_TRUE(ed->Save(ed_path).ok());
  auto refused = evidence::EcdsaSigningKey::Load(ed_path);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("ECDSA P-256, P-384 and P-521"));
}

TEST(OmsIgnorePaths, ResolvedAgainstTheWorkingDirectoryLikeUpstream) {
  TempDir dir;
  fs::create_directories(dir / "m" / "sub");
  std::string root = (dir / "m").string();
  auto rel = RelativeIgnorePaths(root, {(dir / "m" / "sub").string(), (dir / "m.sig").string(),
                                        (dir / "m" / "model.sig").string()});
  EXPECT_EQ(rel, (std::vector<std::string>{"sub", "model.sig"}));  // m.sig is outside: dropped
}

}  // namespace
}  // namespace ckpt::interop
