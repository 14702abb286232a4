// RFC 7512 URIs as --key takes them (core/evidence/pkcs11_uri.h): what is matched, decoded and
// refused, with the reason named.
#include "core/evidence/pkcs11_uri.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt::evidence {
namespace {

using ::testing::HasSubstr;

TEST(Pkcs11Uri, TokenObjectAndIdArePercentDecoded) {
  auto uri = ParsePkcs11Uri("pkcs11:token=My%20Token;object=ev%3bkey;id=%01%ff%A0;type=private");
  ASSERT_TRUE(uri.ok()) << uri.status();
  EXPECT_EQ(uri->token, "My Token");
  EXPECT_EQ(uri->object, "ev;key");
  EXPECT_EQ(uri->id, (std::vector<uint8_t>{0x01, 0xff, 0xa0}));
  EXPECT_EQ(uri->type, "private");
  EXPECT_FALSE(uri->serial.has_value());
  auto only_id = ParsePkcs11Uri("pkcs11:id=%00");
  ASSERT_TRUE(only_id.ok());
  EXPECT_EQ(only_id->id, std::vector<uint8_t>{0});
  auto token_attrs = ParsePkcs11Uri(
      "pkcs11:manufacturer=SoftHSM%20project;model=SoftHSM%20v2;serial=abc;object=k");
  ASSERT_TRUE(token_attrs.ok()) << token_attrs.status();
  EXPECT_EQ(token_attrs->manufacturer, "SoftHSM project");
  EXPECT_EQ(token_attrs->model, "SoftHSM v2");
  EXPECT_EQ(token_attrs->serial, "abc");
}

// Each refusal is INVALID_ARGUMENT and says why.
TEST(Pkcs11Uri, MalformedOrRefusedUrisNameTheReason) {
  const std::pair<const char*, const char*> cases[] = {
      {"token=t;object=k", "does not start with 'pkcs11:'"},
      {"pkcs11:", "names no object"},
      {"pkcs11:token=t", "names no object"},
      {"pkcs11:object=k%2", "'%' at offset 1"},
      {"pkcs11:object=k%zz", "two hex digits"},
      {"pkcs11:object=a b", "must be percent-encoded"},
      {"pkcs11:object=a/b", "must be percent-encoded"},
      {"pkcs11:object=k;object=j", "'object' appears twice"},
      {"pkcs11:object=", "'object' is empty"},
      {"pkcs11:object=k;id=%01;id=%02", "'id' appears twice"},
      {"pkcs11:object", "is not NAME=VALUE"},
      {"pkcs11:object=k;type=public", "type=public"},
      {"pkcs11:object=k;slot-id=1", "'slot-id' is not one this tool matches"},
      {"pkcs11:object=k;x-vendor=1", "'x-vendor' is not one this tool matches"},
      {"pkcs11:object=k;library-description=x", "refused rather than ignored"},
      {"pkcs11:object=k?pin-value=1234", "'pin-value' is refused"},
      {"pkcs11:object=k;pin-value=1234", "'pin-value' is refused"},
      {"pkcs11:object=k?pin-source=file:/p", "'pin-source' is refused"},
      {"pkcs11:object=k?module-path=/tmp/evil.so", "'module-path' is refused"},
      {"pkcs11:object=k#frag", "fragment"},
  };
  for (const auto& [text, why] : cases) {
    auto uri = ParsePkcs11Uri(text);
    ASSERT_FALSE(uri.ok()) << text;
    EXPECT_EQ(uri.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(uri.status().message(), HasSubstr(why)) << text;
  }
}

TEST(Pkcs11Uri, ThePinNeverAppearsInTheError) {
  auto uri = ParsePkcs11Uri("pkcs11:token=t;object=k?pin-value=s3cret");
  ASSERT_FALSE(uri.ok());
  EXPECT_THAT(std::string(uri.status().message()), ::testing::Not(HasSubstr("s3cret")));
}

}  // namespace
}  // namespace ckpt::evidence
