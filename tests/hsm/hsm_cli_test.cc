// Signing keys on a SoftHSM2 token through the ckpt-audit binary (docs/evidence.md, "Keys in an
// HSM"): keys made by `keys generate --pkcs11` sign evidence records (Ed25519) and OpenSSF model
// signatures (ECDSA P-256) that the usual verifiers and the openssl CLI accept; an extractable
// key, a wrong PIN (tried once), a PIN in the URI and a missing object are refused by name.
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/evidence/base64.h"
#include "core/evidence/dsse.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "storage/evidence_log.h"
#include "tests/daemon/daemon_process.h"
#include "tests/hsm/softhsm_token.h"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
using ::ckpt::testing::CopyFixture;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::ReadAll;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;
using Result = ::ckpt::testing::CliResult;

using ::ckpt::testing::kPin;
using ::ckpt::testing::kToken;

// Creates a P-256 key pair labelled `label` whose private key has CKA_SENSITIVE false, straight
// through SoftHSM's C API (neither ckpt-audit nor pkcs11-tool makes such a key).
bool MakeNonSensitiveKey(const std::string& label) {
  ::ckpt::testing::TokenSession t;
  if (!t.ok()) return false;
  CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
  uint8_t p256[] = {0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07};
  std::string name = label;
  CK_ATTRIBUTE pub[] = {{CKA_TOKEN, &yes, 1},
                        {CKA_EC_PARAMS, p256, sizeof p256},
                        {CKA_LABEL, name.data(), name.size()}};
  CK_ATTRIBUTE priv[] = {{CKA_TOKEN, &yes, 1},
                         {CKA_SENSITIVE, &no, 1},
                         {CKA_EXTRACTABLE, &no, 1},
                         {CKA_SIGN, &yes, 1},
                         {CKA_LABEL, name.data(), name.size()}};
  CK_MECHANISM mech{CKM_EC_KEY_PAIR_GEN, nullptr, 0};
  CK_OBJECT_HANDLE a, b;
  return t.f()->C_GenerateKeyPair(t.s(), &mech, pub, 3, priv, 5, &a, &b) == CKR_OK;
}

// A fresh SoftHSM2 token in a temporary directory (its own SOFTHSM2_CONF, which the CLI
// processes inherit), a PIN file, and the flags that reach it.
class HsmCli : public ::ckpt::testing::CliWorkspace {
 protected:
  void SetUp() override {
    if (!::ckpt::testing::SoftHsmInstalled()) {
      GTEST_SKIP() << CKPT_SOFTHSM_MODULE
                   << " is absent: install Debian's softhsm2 (deploy/install-deps.sh does)";
    }
    ASSERT_TRUE(::ckpt::testing::InitSoftHsmToken(dir_.path()));
    WriteAll(PinFile(), std::string(kPin) + "\n");
    ::chmod(PinFile().c_str(), 0600);
  }

  static int Shell(const std::string& cmd) {
    return std::system((cmd + " > /dev/null 2>&1").c_str());
  }
  std::string PinFile() { return (dir_ / "pin").string(); }
  static std::string Uri(const std::string& object) {
    return absl::StrCat("'pkcs11:token=", kToken, ";object=", object, "'");
  }
  // --pkcs11-module and the PIN, as every signing command takes them.
  std::string Access(const std::string& module = CKPT_SOFTHSM_MODULE) {
    return absl::StrCat(" --pkcs11-module ", module, " --pin-file ", PinFile());
  }
  json Generate(const std::string& object, const std::string& type) {
    Result r = Run(absl::StrCat("keys generate --pkcs11 --type ", type, " --key ", Uri(object),
                                Access(), " --json",
                                type == "ed25519" ? " --trust " + Trust() : ""));
    EXPECT_EQ(r.rc, 0) << r.out << r.err;
    return r.rc == 0 ? json::parse(r.out) : json();
  }
  // The token's objects as OpenSC's pkcs11-tool lists them (an independent reader).
  std::string ListObjects() {
    std::string out_file = (dir_ / "objects.txt").string();
    std::system(absl::StrCat("pkcs11-tool --module ", CKPT_SOFTHSM_MODULE, " --token-label ",
                             kToken, " --login --pin ", kPin, " -O > ", out_file, " 2>&1")
                    .c_str());
    auto b = ReadAll(out_file);
    return std::string(b.begin(), b.end());
  }
  std::string TokenFlags() {
    std::string out_file = (dir_ / "slots.txt").string();
    std::system(absl::StrCat("pkcs11-tool --module ", CKPT_SOFTHSM_MODULE, " -L > ", out_file,
                             " 2>&1")
                    .c_str());
    auto b = ReadAll(out_file);
    return std::string(b.begin(), b.end());
  }
};

TEST_F(HsmCli, GeneratedKeysStayOnTheTokenSensitiveAndNotExtractable) {
  json ed = Generate("evidence", "ed25519");
  EXPECT_EQ(ed["type"], "ed25519");
  EXPECT_EQ(ed["keyid"].get<std::string>().size(), 64u);
  EXPECT_THAT(ed["public_key_pem"].get<std::string>(), HasSubstr("BEGIN PUBLIC KEY"));
  json ec = Generate("model", "ecdsa-p256");
  EXPECT_EQ(ec["type"], "ecdsa-p256");
  // The trust line went to the trust file, as `keys generate --trust` does for a file key.
  auto trust = ReadAll(Trust());
  EXPECT_THAT(std::string(trust.begin(), trust.end()), HasSubstr("ed25519 "));
  // No key file was written: the key exists only on the token.
  EXPECT_FALSE(fs::exists(dir_ / "pkcs11:token=ckpt-test;object=evidence"));
  std::string objects = ListObjects();
  EXPECT_THAT(objects, HasSubstr("label:      evidence"));
  EXPECT_THAT(objects, HasSubstr("label:      model"));
  EXPECT_THAT(objects, HasSubstr("sensitive"));
  EXPECT_THAT(objects, HasSubstr("never extractable"));
  // The same label again is refused, never a second key beside the first.
  Result again = Run(absl::StrCat("keys generate --pkcs11 --key ", Uri("evidence"), Access()));
  EXPECT_EQ(again.rc, 2);
  EXPECT_THAT(again.err, HasSubstr("already holds a key object with label evidence"));
}

TEST_F(HsmCli, RecordsSignedOnTheTokenVerifyWithTheUsualVerifiersAndOpenssl) {
  json ed = Generate("evidence", "ed25519");
  fs::path vsa = dir_ / "vsa.json";
  Result audit = Run(absl::StrCat("audit ", Fixture("mini-kimi-mxfp4").string(), " --db ", Db(),
                                  " --key ", Uri("evidence"), Access(), " --vsa ", vsa.string(),
                                  " --json"));
  ASSERT_EQ(audit.rc, 0) << audit.out << audit.err;
  EXPECT_EQ(json::parse(audit.out)["keyid"], ed["keyid"]);
  Result verify = Run(absl::StrCat("verify --db ", Db(), " --trust ", Trust()));
  EXPECT_EQ(verify.rc, 0) << verify.out << verify.err;
  Result log = Run(absl::StrCat("verify-log --db ", Db(), " --trust ", Trust()));
  EXPECT_EQ(log.rc, 0) << log.out << log.err;
  EXPECT_THAT(log.out, HasSubstr("LOG VERIFIED"));
  // `keys show` of the token key: the same key id, and the log's note verifier key.
  Result show = Run(absl::StrCat("keys show --key ", Uri("evidence"), Access(), " --db ", Db(),
                                 " --json"));
  ASSERT_EQ(show.rc, 0) << show.err;
  json shown = json::parse(show.out);
  EXPECT_EQ(shown["keyid"], ed["keyid"]);
  EXPECT_TRUE(shown.contains("note_verifier_key"));

  // openssl checks the VSA's DSSE signature with the exported public key.
  auto vsa_bytes = ReadAll(vsa);
  auto env = evidence::ParseEnvelope(std::string(vsa_bytes.begin(), vsa_bytes.end()));
  ASSERT_TRUE(env.ok()) << env.status();
  ASSERT_EQ(env->signatures.size(), 1u);
  EXPECT_EQ(env->signatures[0].keyid, ed["keyid"]);
  WriteAll(dir_ / "pub.pem", ed["public_key_pem"].get<std::string>());
  WriteAll(dir_ / "pae.bin", evidence::Pae(env->payload_type, env->payload));
  WriteAll(dir_ / "bad.bin", evidence::Pae(env->payload_type, env->payload + " "));
  WriteAll(dir_ / "sig.bin", env->signatures[0].sig);
  std::string base = absl::StrCat("openssl pkeyutl -verify -pubin -inkey ",
                                  (dir_ / "pub.pem").string(), " -rawin -sigfile ",
                                  (dir_ / "sig.bin").string(), " -in ");
  EXPECT_EQ(Shell(base + (dir_ / "pae.bin").string()), 0);
  EXPECT_NE(Shell(base + (dir_ / "bad.bin").string()), 0);

  // Audit parts are signed with the token key too, and merged into a record signed by it.
  Result part = Run(absl::StrCat("audit ", Fixture("mini-kimi-mxfp4").string(),
                                 " --part 0/1 --part-key ", Uri("evidence"), Access(), " --out ",
                                 (dir_ / "part.json").string()));
  EXPECT_EQ(part.rc, 0) << part.err;
  Result merged = Run(absl::StrCat("audit --merge ", (dir_ / "part.json").string(),
                                   " --part-trust ", Trust(), " --db ", Db(), " --key ",
                                   Uri("evidence"), Access()));
  EXPECT_EQ(merged.rc, 0) << merged.out << merged.err;
}

TEST_F(HsmCli, ModelSignaturesSignedOnTheTokenVerifyWithTheUsualVerifierAndOpenssl) {
  json ec = Generate("model", "ecdsa-p256");
  fs::path model = CopyFixture("mini-kimi-mxfp4", dir_);
  std::string sig = (dir_ / "model.sig").string();
  Result sign = Run(absl::StrCat("sign ", model.string(), " --key ", Uri("model"), Access(),
                                 " --signature ", sig));
  ASSERT_EQ(sign.rc, 0) << sign.out << sign.err;
  EXPECT_THAT(sign.out, HasSubstr(ec["hint"].get<std::string>()));
  WriteAll(dir_ / "ec.pub", ec["public_key_pem"].get<std::string>());
  Result verify = Run(absl::StrCat("verify-signature ", model.string(), " --signature ", sig,
                                   " --public-key ", (dir_ / "ec.pub").string(), " --json"));
  EXPECT_EQ(verify.rc, 0) << verify.out << verify.err;

  // openssl checks the DER signature over the DSSE PAE with SHA-256, as model_signing does.
  auto bundle_bytes = ReadAll(sig);
  json bundle = json::parse(std::string(bundle_bytes.begin(), bundle_bytes.end()));
  EXPECT_EQ(bundle["verificationMaterial"]["publicKey"]["hint"], ec["hint"]);
  auto payload = evidence::Base64Decode(bundle["dsseEnvelope"]["payload"].get<std::string>());
  auto der = evidence::Base64Decode(
      bundle["dsseEnvelope"]["signatures"][0]["sig"].get<std::string>());
  ASSERT_TRUE(payload.ok() && der.ok());
  std::string body(payload->begin(), payload->end());
  WriteAll(dir_ / "pae.bin", evidence::Pae(evidence::kInTotoPayloadType, body));
  WriteAll(dir_ / "bad.bin", evidence::Pae(evidence::kInTotoPayloadType, body + " "));
  WriteAll(dir_ / "sig.der", *der);
  std::string base = absl::StrCat("openssl dgst -sha256 -verify ", (dir_ / "ec.pub").string(),
                                  " -signature ", (dir_ / "sig.der").string(), " ");
  EXPECT_EQ(Shell(base + (dir_ / "pae.bin").string()), 0);
  EXPECT_NE(Shell(base + (dir_ / "bad.bin").string()), 0);

  // Each key type signs only what it is for: the Ed25519 key cannot sign a model signature.
  Generate("evidence", "ed25519");
  Result wrong = Run(absl::StrCat("sign ", model.string(), " --key ", Uri("evidence"), Access(),
                                  " --signature ", sig));
  EXPECT_EQ(wrong.rc, 2);
  EXPECT_THAT(wrong.err, HasSubstr("is not an EC (CKK_EC) key"));
}

TEST_F(HsmCli, ExtractableOrNonSensitiveKeyObjectsAreRefused) {
  // Made with OpenSC's pkcs11-tool and SoftHSM's C API, not with ckpt-audit.
  ASSERT_EQ(Shell(absl::StrCat("pkcs11-tool --module ", CKPT_SOFTHSM_MODULE, " --token-label ",
                               kToken, " --login --pin ", kPin,
                               " --keypairgen --key-type EC:edwards25519 --usage-sign",
                               " --label extractable --id 01 --sensitive --extractable")),
            0);
  ASSERT_TRUE(MakeNonSensitiveKey("plain"));
  Result ext = Run(absl::StrCat("audit ", Fixture("mini-kimi-mxfp4").string(), " --db ", Db(),
                                " --key ", Uri("extractable"), Access()));
  EXPECT_EQ(ext.rc, 2);
  EXPECT_THAT(ext.err, HasSubstr("extractable key refused"));
  EXPECT_THAT(ext.err, HasSubstr("CKA_EXTRACTABLE=true"));
  EXPECT_FALSE(fs::exists(Db())) << "nothing is appended with a refused key";
  fs::path model = CopyFixture("mini-kimi-mxfp4", dir_);
  Result plain = Run(absl::StrCat("sign ", model.string(), " --key ", Uri("plain"), Access(),
                                  " --signature ", (dir_ / "model.sig").string()));
  EXPECT_EQ(plain.rc, 2);
  EXPECT_THAT(plain.err, HasSubstr("non-sensitive key refused"));
  EXPECT_FALSE(fs::exists(dir_ / "model.sig"));
}

TEST_F(HsmCli, AWrongPinIsTriedOnceAndReported) {
  Generate("evidence", "ed25519");
  WriteAll(dir_ / "wrong-pin", std::string("000000\n"));
  ::chmod((dir_ / "wrong-pin").c_str(), 0600);
  std::string logins = (dir_ / "logins.txt").string();
  ::setenv("CKPT_TEST_LOGIN_LOG", logins.c_str(), 1);
  Result r = Run(absl::StrCat("audit ", Fixture("mini-kimi-mxfp4").string(), " --db ", Db(),
                              " --key ", Uri("evidence"), " --pkcs11-module ",
                              CKPT_COUNTING_MODULE, " --pin-file ",
                              (dir_ / "wrong-pin").string()));
  ::unsetenv("CKPT_TEST_LOGIN_LOG");
  EXPECT_EQ(r.rc, 2);
  EXPECT_THAT(r.err, HasSubstr("CKR_PIN_INCORRECT"));
  EXPECT_THAT(r.err, HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(r.err, HasSubstr("not retried"));
  EXPECT_THAT(r.err, Not(HasSubstr("000000")));
  auto log = ReadAll(logins);
  EXPECT_EQ(std::string(log.begin(), log.end()), "C_Login\n") << "exactly one PIN attempt";
  // The token itself saw the failed attempt (OpenSC reads its flags).
  EXPECT_THAT(TokenFlags(), HasSubstr("user PIN count low"));
}

TEST_F(HsmCli, PinSourcesAreFlagsNeverTheUri) {
  Generate("evidence", "ed25519");
  std::string root = Fixture("mini-kimi-mxfp4").string();
  Result in_uri = Run(absl::StrCat("audit ", root, " --db ", Db(), " --key 'pkcs11:token=",
                                   kToken, ";object=evidence?pin-value=", kPin, "'",
                                   " --pkcs11-module ", CKPT_SOFTHSM_MODULE));
  EXPECT_EQ(in_uri.rc, 2);
  EXPECT_THAT(in_uri.err, HasSubstr("'pin-value' is refused"));
  // From the environment instead of a file.
  Result env = ::ckpt::testing::RunCli(
      absl::StrCat("audit ", root, " --db ", Db(), " --key ", Uri("evidence"),
                   " --pkcs11-module ", CKPT_SOFTHSM_MODULE, " --pin-env CKPT_TEST_PIN"),
      dir_.path(), absl::StrCat("XDG_DATA_HOME='", (dir_ / "xdg").string(), "' CKPT_TEST_PIN=",
                                kPin));
  EXPECT_EQ(env.rc, 0) << env.err;
  Result none = Run(absl::StrCat("audit ", root, " --db ", Db(), " --key ", Uri("evidence"),
                                 " --pkcs11-module ", CKPT_SOFTHSM_MODULE));
  EXPECT_EQ(none.rc, 2);
  EXPECT_THAT(none.err, HasSubstr("exactly one of --pin-file PATH and --pin-env NAME"));
  // A PIN file others may read is refused like a key file.
  ::chmod(PinFile().c_str(), 0644);
  Result loose = Run(absl::StrCat("audit ", root, " --db ", Db(), " --key ", Uri("evidence"),
                                  Access()));
  EXPECT_EQ(loose.rc, 2);
  EXPECT_THAT(loose.err, HasSubstr("PIN file"));
  // PKCS#11 flags beside a key file are a mistake, not silently ignored.
  MakeKey();
  Result mixed = Run(absl::StrCat("audit ", root, " --db ", Db(), " --key ", Key(),
                                  " --pkcs11-module ", CKPT_SOFTHSM_MODULE));
  EXPECT_EQ(mixed.rc, 2);
  EXPECT_THAT(mixed.err, HasSubstr("belong to a pkcs11: key"));
}

// ckpt-auditd takes the same flags: with the token key it starts serving (deriving its job-row
// key by a token signature on the way); with a wrong PIN it stops at once, naming the code.
TEST_F(HsmCli, DaemonSignsWithATokenKey) {
  Generate("evidence", "ed25519");
  fs::create_directories(dir_ / "models");
  auto daemon = [&](const std::string& pin_file) {
    std::string log = (dir_ / "daemon.log").string();
    std::string cmd = absl::StrCat(
        "timeout 3 '", ::ckpt::testing::kBinaryDir, "/services/daemon/ckpt-auditd' --listen 127.0.0.1:0 ",
        "--insecure-no-auth --db ", Db(), " --allow-root ", (dir_ / "models").string(),
        " --key ", Uri("evidence"), " --pkcs11-module ", CKPT_SOFTHSM_MODULE, " --pin-file ",
        pin_file, " > ", log, " 2>&1");
    int status = std::system(cmd.c_str());
    auto text = ReadAll(log);
    return std::make_pair(WIFEXITED(status) ? WEXITSTATUS(status) : -1,
                          std::string(text.begin(), text.end()));
  };
  auto [rc, out] = daemon(PinFile());
  EXPECT_EQ(rc, 124) << "serving until timeout stops it: " << out;
  EXPECT_THAT(out, HasSubstr("serving on port"));
  WriteAll(dir_ / "wrong-pin", std::string("000000\n"));
  ::chmod((dir_ / "wrong-pin").c_str(), 0600);
  auto [bad_rc, bad_out] = daemon((dir_ / "wrong-pin").string());
  EXPECT_EQ(bad_rc, 2) << bad_out;
  EXPECT_THAT(bad_out, HasSubstr("CKR_PIN_INCORRECT"));
}

// The number of entries in the log at `db` (0 when there is none).
uint64_t LogSize(const std::string& db) {
  auto log = storage::EvidenceLog::OpenReadOnly(db, "test log");
  if (!log.ok()) return 0;
  auto size = (*log)->Size();
  return size.ok() ? *size : 0;
}

// A token that signs the pair-check probe correctly and then returns a wrong signature: nothing
// it signed is appended; every signature is verified before it is used.
TEST_F(HsmCli, AWrongSignatureFromTheTokenIsNeverStored) {
  Generate("evidence", "ed25519");
  std::string root = Fixture("mini-kimi-mxfp4").string();
  ::setenv("CKPT_TEST_SIGN_FAULT", "2:flip", 1);
  Result audit = Run(absl::StrCat("audit ", root, " --db ", Db(), " --key ", Uri("evidence"),
                                  Access(CKPT_COUNTING_MODULE)));
  ::unsetenv("CKPT_TEST_SIGN_FAULT");
  EXPECT_EQ(audit.rc, 2) << audit.out;
  EXPECT_THAT(audit.err, HasSubstr("DATA_LOSS"));
  EXPECT_THAT(audit.err, HasSubstr("does not verify with its public key"));
  EXPECT_EQ(LogSize(Db()), 0u);
  // The same for a model signature: no signature file is written.
  Generate("model", "ecdsa-p256");
  fs::path model = CopyFixture("mini-kimi-mxfp4", dir_);
  ::setenv("CKPT_TEST_SIGN_FAULT", "2:flip", 1);
  Result sign = Run(absl::StrCat("sign ", model.string(), " --key ", Uri("model"),
                                 Access(CKPT_COUNTING_MODULE), " --signature ",
                                 (dir_ / "model.sig").string()));
  ::unsetenv("CKPT_TEST_SIGN_FAULT");
  EXPECT_EQ(sign.rc, 2) << sign.out;
  EXPECT_THAT(sign.err, HasSubstr("does not verify with its public key"));
  EXPECT_FALSE(fs::exists(dir_ / "model.sig"));
}

// The token going away at each signature of an audit in turn: the audit fails naming the code,
// an append whose signature failed rolls back, and the log still verifies.
TEST_F(HsmCli, ATokenRemovedMidAuditLosesNothingStored) {
  Generate("evidence", "ed25519");
  std::string root = Fixture("mini-kimi-mxfp4").string();
  std::string audit = absl::StrCat("audit ", root, " --db ", Db(), " --key ", Uri("evidence"),
                                   Access(CKPT_COUNTING_MODULE));
  Result first = Run(audit);
  ASSERT_EQ(first.rc, 0) << first.err;
  uint64_t size = LogSize(Db());
  ASSERT_GT(size, 0u);
  // publish.h: the record and its test result are separate appends, so a failure at the test
  // result's signatures leaves the record, whole; a failure at an append's own signatures
  // (the entry's, the checkpoint's) leaves the log as it was.
  int unchanged = 0;
  for (int n = 2; n < 12; ++n) {  // the probe is the first signature
    ::setenv("CKPT_TEST_SIGN_FAULT", absl::StrCat(n, ":removed").c_str(), 1);
    Result r = Run(audit);
    ::unsetenv("CKPT_TEST_SIGN_FAULT");
    const uint64_t now = LogSize(Db());
    if (r.rc == 0) break;  // n is past this audit's last signature
    EXPECT_EQ(r.rc, 2) << "signature " << n;
    EXPECT_THAT(r.err, HasSubstr("CKR_DEVICE_REMOVED")) << "signature " << n;
    EXPECT_TRUE(now == size || now == size + 1) << "signature " << n << ": " << now;
    unchanged += now == size;
    size = now;
    Result verify = Run(absl::StrCat("verify-log --db ", Db(), " --trust ", Trust()));
    EXPECT_EQ(verify.rc, 0) << "signature " << n << ": " << verify.out << verify.err;
  }
  EXPECT_GE(unchanged, 2) << "an entry's and its checkpoint's signature";
  Result verify = Run(absl::StrCat("verify --db ", Db(), " --trust ", Trust()));
  EXPECT_EQ(verify.rc, 0) << verify.out << verify.err;
}

// --pin-env's variable does not reach the daemon's children: sbatch exports its whole
// environment to the cluster's nodes by default. A stand-in sbatch records what it was given.
TEST_F(HsmCli, ThePinVariableNeverReachesTheSlurmExecutor) {
  Generate("evidence", "ed25519");
  fs::path parts = dir_ / "parts", bin = dir_ / "bin";
  fs::create_directories(parts);
  fs::create_directories(bin);
  fs::path root = CopyFixture("mini-kimi-mxfp4", dir_);
  Result node = Run(absl::StrCat("keys generate --name node --out ", (dir_ / "node.pem").string(),
                                 " --trust ", (dir_ / "part-trust").string()));
  ASSERT_EQ(node.rc, 0) << node.err;
  fs::path seen = dir_ / "sbatch-env";
  WriteAll(bin / "squeue", std::string("#!/bin/sh\nexit 0\n"));
  WriteAll(bin / "sbatch", absl::StrCat("#!/bin/sh\nenv > '", seen.string(),
                                        "'\necho 'sbatch: stand-in refuses' >&2\nexit 1\n"));
  ::chmod((bin / "squeue").c_str(), 0755);
  ::chmod((bin / "sbatch").c_str(), 0755);
  ::setenv("CKPT_TEST_PIN", kPin, 1);
  ::ckpt::testing::DaemonProcess daemon;
  bool started = daemon.Start(
      {"--listen", "127.0.0.1:0", "--insecure-no-auth", "--db", Db(), "--allow-root",
       dir_.path().string(), "--key", absl::StrCat("pkcs11:token=", kToken, ";object=evidence"),
       "--pkcs11-module", CKPT_SOFTHSM_MODULE, "--pin-env", "CKPT_TEST_PIN", "--executor",
       "slurm", "--slurm-parts-dir", parts.string(), "--slurm-node-key",
       (dir_ / "node.pem").string(), "--part-trust", (dir_ / "part-trust").string(),
       "--drain-seconds", "0"},
      dir_ / "daemon.log",
      {"/usr/bin/env", absl::StrCat("PATH=", bin.string(), ":", std::getenv("PATH"))});
  ::unsetenv("CKPT_TEST_PIN");
  ASSERT_TRUE(started) << ::ckpt::testing::ReadText(dir_ / "daemon.log");
  Result submit = Run(absl::StrCat("submit ", root.string(), " --server ", daemon.address(),
                                   " --insecure-loopback"));
  EXPECT_NE(submit.rc, 0);
  EXPECT_THAT(submit.out + submit.err, HasSubstr("stand-in refuses"));
  daemon.Stop();
  ASSERT_TRUE(fs::exists(seen)) << "the stand-in sbatch ran";
  std::string env = ::ckpt::testing::ReadText(seen);
  EXPECT_THAT(env, HasSubstr("PATH="));
  EXPECT_THAT(env, Not(HasSubstr("CKPT_TEST_PIN")));
  EXPECT_THAT(env, Not(HasSubstr(kPin)));
}

TEST_F(HsmCli, MissingTokenOrObjectIsNamed) {
  Generate("evidence", "ed25519");
  std::string root = Fixture("mini-kimi-mxfp4").string();
  Result object = Run(absl::StrCat("audit ", root, " --db ", Db(), " --key ", Uri("nope"),
                                   Access()));
  EXPECT_EQ(object.rc, 2);
  EXPECT_THAT(object.err, HasSubstr("NOT_FOUND"));
  EXPECT_THAT(object.err, HasSubstr("no private key object matches token ckpt-test"));
  EXPECT_THAT(object.err, HasSubstr("object=nope"));
  Result token = Run(absl::StrCat("audit ", root, " --db ", Db(),
                                  " --key 'pkcs11:token=other;object=evidence'", Access()));
  EXPECT_EQ(token.rc, 2);
  EXPECT_THAT(token.err, HasSubstr("no token of"));
  EXPECT_THAT(token.err, HasSubstr("tokens present: ckpt-test"));
  Result module = Run(absl::StrCat("audit ", root, " --db ", Db(), " --key ", Uri("evidence"),
                                   Access((dir_ / "no-such.so").string())));
  EXPECT_EQ(module.rc, 2);
  EXPECT_THAT(module.err, HasSubstr("no-such.so"));
}

}  // namespace
}  // namespace ckpt
