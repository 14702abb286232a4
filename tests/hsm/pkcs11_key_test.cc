// Token keys through the library (core/evidence/pkcs11_key.h) in one process, as ckpt-auditd
// uses them: several keys of one module open at once, signatures from many threads on one
// session, and a public key object planted beside a private key (the pair check refuses it).
#include "core/evidence/pkcs11_key.h"

#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/hsm/softhsm_token.h"
#include "tests/test_util.h"

namespace ckpt::evidence {
namespace {

using ::ckpt::testing::kToken;
using ::testing::HasSubstr;

class Pkcs11Key : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!::ckpt::testing::SoftHsmInstalled()) {
      GTEST_SKIP() << CKPT_SOFTHSM_MODULE
                   << " is absent: install Debian's softhsm2 (deploy/install-deps.sh does)";
    }
    ASSERT_TRUE(::ckpt::testing::InitSoftHsmToken(dir_.path()));
  }
  static Pkcs11Uri Uri(const std::string& object, std::vector<uint8_t> id = {}) {
    Pkcs11Uri uri;
    uri.token = kToken;
    uri.object = object;
    if (!id.empty()) uri.id = id;
    return uri;
  }
  const Pkcs11Access access_{CKPT_SOFTHSM_MODULE, ::ckpt::testing::kPin};
  ::ckpt::testing::TempDir dir_;
};

TEST_F(Pkcs11Key, KeysOfOneModuleSignFromManyThreadsAtOnce) {
  ASSERT_TRUE(GeneratePkcs11Key(Uri("ev"), Pkcs11KeyType::kEd25519, access_).ok());
  ASSERT_TRUE(GeneratePkcs11Key(Uri("ec"), Pkcs11KeyType::kEcdsaP256, access_).ok());
  auto ed = OpenPkcs11Ed25519Key(Uri("ev"), access_);
  ASSERT_TRUE(ed.ok()) << ed.status();
  auto ec = OpenPkcs11EcdsaKey(Uri("ec"), access_);  // the module is already initialized
  ASSERT_TRUE(ec.ok()) << ec.status();
  std::vector<std::thread> threads;
  std::vector<int> bad(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 25; ++i) {
        std::string msg = "message " + std::to_string(t) + "/" + std::to_string(i);
        auto s1 = ed->Sign(AsBytes(msg));
        auto s2 = ec->Sign(AsBytes(msg));
        if (!s1.ok() || !ed->public_key().Verify(AsBytes(msg), *s1)) ++bad[t];
        if (!s2.ok() || !ec->public_key().Verify(AsBytes(msg), *s2)) ++bad[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad, std::vector<int>(8, 0));
  // One key going away leaves the other usable (the module stays while either holds it).
  ec = absl::InternalError("dropped");
  auto after = ed->Sign(AsBytes(std::string("after")));
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(ed->public_key().Verify(AsBytes(std::string("after")), *after));
}

TEST_F(Pkcs11Key, APlantedPublicKeyObjectIsRefused) {
  ASSERT_TRUE(GeneratePkcs11Key(Uri("a", {1}), Pkcs11KeyType::kEd25519, access_).ok());
  ASSERT_TRUE(GeneratePkcs11Key(Uri("b", {2}), Pkcs11KeyType::kEd25519, access_).ok());
  ASSERT_TRUE(OpenPkcs11Ed25519Key(Uri("a"), access_).ok());
  {
    // Swap the public key objects' ids: a's private key (id 01) now finds b's public key.
    ::ckpt::testing::TokenSession t;
    ASSERT_TRUE(t.ok());
    CK_OBJECT_HANDLE pa = t.Find(CKO_PUBLIC_KEY, "a"), pb = t.Find(CKO_PUBLIC_KEY, "b");
    ASSERT_NE(pa, CK_INVALID_HANDLE);
    ASSERT_NE(pb, CK_INVALID_HANDLE);
    uint8_t one = 1, two = 2;
    CK_ATTRIBUTE to_two{CKA_ID, &two, 1}, to_one{CKA_ID, &one, 1};
    ASSERT_EQ(t.f()->C_SetAttributeValue(t.s(), pa, &to_two, 1), CKR_OK);
    ASSERT_EQ(t.f()->C_SetAttributeValue(t.s(), pb, &to_one, 1), CKR_OK);
  }
  auto a = OpenPkcs11Ed25519Key(Uri("a"), access_);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(a.status().message(), HasSubstr("does not verify its signature"));
}

TEST_F(Pkcs11Key, GenerationNeverShadowsAnExistingKey) {
  ASSERT_TRUE(GeneratePkcs11Key(Uri("a", {1}), Pkcs11KeyType::kEd25519, access_).ok());
  auto same_label = GeneratePkcs11Key(Uri("a"), Pkcs11KeyType::kEcdsaP256, access_);
  EXPECT_EQ(same_label.code(), absl::StatusCode::kAlreadyExists);
  auto same_id = GeneratePkcs11Key(Uri("other", {1}), Pkcs11KeyType::kEd25519, access_);
  EXPECT_EQ(same_id.code(), absl::StatusCode::kAlreadyExists);
  Pkcs11Uri no_label;
  no_label.token = kToken;
  no_label.id = std::vector<uint8_t>{9};
  EXPECT_EQ(GeneratePkcs11Key(no_label, Pkcs11KeyType::kEd25519, access_).code(),
            absl::StatusCode::kInvalidArgument);
}

// Ambiguity is refused, never resolved by taking the first object or token found.
TEST_F(Pkcs11Key, TwoObjectsOrTokensMatchingTheUriAreRefused) {
  ASSERT_TRUE(GeneratePkcs11Key(Uri("a", {1}), Pkcs11KeyType::kEd25519, access_).ok());
  ASSERT_TRUE(GeneratePkcs11Key(Uri("b", {2}), Pkcs11KeyType::kEd25519, access_).ok());
  // object= and id= naming different keys match neither.
  auto mixed = OpenPkcs11Ed25519Key(Uri("a", {2}), access_);
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kNotFound) << mixed.status();
  {
    // b's private key relabelled "a": two private keys now carry that label.
    ::ckpt::testing::TokenSession t;
    ASSERT_TRUE(t.ok());
    CK_OBJECT_HANDLE b = t.Find(CKO_PRIVATE_KEY, "b");
    ASSERT_NE(b, CK_INVALID_HANDLE);
    std::string a = "a";
    CK_ATTRIBUTE label{CKA_LABEL, a.data(), a.size()};
    ASSERT_EQ(t.f()->C_SetAttributeValue(t.s(), b, &label, 1), CKR_OK);
  }
  auto twice = OpenPkcs11Ed25519Key(Uri("a"), access_);
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument) << twice.status();
  EXPECT_THAT(twice.status().message(), HasSubstr("2 private key objects match"));
  // id= tells them apart (dropped at once: SoftHSM sees new tokens only at its next start).
  EXPECT_TRUE(OpenPkcs11Ed25519Key(Uri("a", {2}), access_).ok());
  // A second token initialized with the same label.
  ASSERT_EQ(std::system((std::string("softhsm2-util --init-token --free --label ") + kToken +
                         " --pin 1234 --so-pin 12345678 > /dev/null 2>&1")
                            .c_str()),
            0);
  auto two_tokens = OpenPkcs11Ed25519Key(Uri("a", {2}), access_);
  EXPECT_EQ(two_tokens.status().code(), absl::StatusCode::kInvalidArgument)
      << two_tokens.status();
  EXPECT_THAT(two_tokens.status().message(), HasSubstr("2 tokens match"));
}

// A key of the wrong type or curve for the role is refused by name.
TEST_F(Pkcs11Key, KeysOfAnotherTypeOrCurveAreRefused) {
  {
    ::ckpt::testing::TokenSession t;
    ASSERT_TRUE(t.ok());
    CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
    uint8_t p384[] = {0x06, 0x05, 0x2b, 0x81, 0x04, 0x00, 0x22};
    CK_ULONG bits = 1024;
    for (const std::string& label : {std::string("p384"), std::string("rsa")}) {
      std::string name = label;
      const bool rsa = label == "rsa";
      CK_ATTRIBUTE pub[] = {{CKA_TOKEN, &yes, 1},
                            {CKA_LABEL, name.data(), name.size()},
                            rsa ? CK_ATTRIBUTE{CKA_MODULUS_BITS, &bits, sizeof bits}
                                : CK_ATTRIBUTE{CKA_EC_PARAMS, p384, sizeof p384}};
      CK_ATTRIBUTE priv[] = {{CKA_TOKEN, &yes, 1},        {CKA_PRIVATE, &yes, 1},
                             {CKA_SENSITIVE, &yes, 1},    {CKA_EXTRACTABLE, &no, 1},
                             {CKA_SIGN, &yes, 1},         {CKA_LABEL, name.data(), name.size()}};
      CK_MECHANISM mech{rsa ? CKM_RSA_PKCS_KEY_PAIR_GEN : CKM_EC_KEY_PAIR_GEN, nullptr, 0};
      CK_OBJECT_HANDLE h1, h2;
      ASSERT_EQ(t.f()->C_GenerateKeyPair(t.s(), &mech, pub, 3, priv, 6, &h1, &h2), CKR_OK);
    }
  }
  auto p384_as_ed = OpenPkcs11Ed25519Key(Uri("p384"), access_);
  EXPECT_EQ(p384_as_ed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p384_as_ed.status().message(), HasSubstr("is not an Ed25519 (CKK_EC_EDWARDS) key"));
  auto p384_as_ec = OpenPkcs11EcdsaKey(Uri("p384"), access_);
  EXPECT_EQ(p384_as_ec.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p384_as_ec.status().message(), HasSubstr("on another curve than P-256"));
  auto rsa = OpenPkcs11EcdsaKey(Uri("rsa"), access_);
  EXPECT_EQ(rsa.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(rsa.status().message(), HasSubstr("is not an EC (CKK_EC) key"));
}

// The module is named by its absolute path only, and must be a regular file that only its owner
// (root or this user) can write: it sees the PIN and makes every signature.
TEST_F(Pkcs11Key, TheModuleIsAnAbsolutePathToAFileOthersCannotWrite) {
  ASSERT_TRUE(GeneratePkcs11Key(Uri("ev"), Pkcs11KeyType::kEd25519, access_).ok());
  auto open_with = [&](const std::string& module) {
    return OpenPkcs11Ed25519Key(Uri("ev"), {module, ::ckpt::testing::kPin}).status();
  };
  // A bare name is not looked up in the working directory (nor the library search path).
  std::filesystem::create_symlink(CKPT_SOFTHSM_MODULE, dir_ / "libsofthsm2.so");
  const std::filesystem::path cwd = std::filesystem::current_path();
  std::filesystem::current_path(dir_.path());
  absl::Status bare = open_with("libsofthsm2.so");
  absl::Status relative = open_with("./libsofthsm2.so");
  std::filesystem::current_path(cwd);
  EXPECT_EQ(bare.code(), absl::StatusCode::kInvalidArgument) << bare;
  EXPECT_THAT(bare.message(), HasSubstr("give its absolute path"));
  EXPECT_EQ(relative.code(), absl::StatusCode::kInvalidArgument) << relative;
  // A FIFO is refused at once (dlopen would wait for a writer forever).
  const std::string fifo = (dir_ / "module.fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  absl::Status from_fifo = open_with(fifo);
  EXPECT_EQ(from_fifo.code(), absl::StatusCode::kInvalidArgument) << from_fifo;
  EXPECT_THAT(from_fifo.message(), HasSubstr("not a regular file"));
  // A copy of the module that group or others may rewrite.
  const std::filesystem::path copy = dir_ / "copy.so";
  std::filesystem::copy_file(CKPT_SOFTHSM_MODULE, copy);
  ::chmod(copy.c_str(), 0664);
  absl::Status writable = open_with(copy.string());
  EXPECT_EQ(writable.code(), absl::StatusCode::kFailedPrecondition) << writable;
  EXPECT_THAT(writable.message(), HasSubstr("writable by group or others (mode 0664)"));
  // The module through an absolute link to it is fine.
  EXPECT_TRUE(open_with((dir_ / "libsofthsm2.so").string()).ok());
}

}  // namespace
}  // namespace ckpt::evidence
