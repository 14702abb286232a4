// Token keys through the library (core/evidence/pkcs11_key.h) in one process, as ckpt-auditd
// uses them: several keys of one module open at once, signatures from many threads on one
// session, and a public key object planted beside a private key (the pair check refuses it).
#include "core/evidence/pkcs11_key.h"

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

}  // namespace
}  // namespace ckpt::evidence
