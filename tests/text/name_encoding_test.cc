// The name encoding (core/text/name_encoding.h): which bytes count as UTF-8, the recorded form,
// its inverse, collision detection, and DumpJson on strings that are not UTF-8.
#include "core/text/name_encoding.h"

#include <random>
#include <string>
#include <vector>

#include "core/text/json_dump.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using namespace std::string_literals;

TEST(IsValidUtf8, AcceptsWellFormedSequencesAtTheirBounds) {
  for (const std::string& s : {""s, "plain ascii"s, "\0"s, "caf\xC3\xA9"s, "\xE2\x82\xAC"s,
                               "\xF0\x9F\x98\x80"s, "\xC2\x80"s, "\xDF\xBF"s,
                               "\xE0\xA0\x80"s,      // U+0800, the first 3-byte code point
                               "\xED\x9F\xBF"s,      // U+D7FF, just below the surrogates
                               "\xEE\x80\x80"s,      // U+E000, just above them
                               "\xF0\x90\x80\x80"s,  // U+10000
                               "\xF4\x8F\xBF\xBF"s}) {  // U+10FFFF
    EXPECT_TRUE(IsValidUtf8(s)) << EncodeName(s);
  }
}

TEST(IsValidUtf8, RejectsOverlongSurrogatesTruncationAndStrayBytes) {
  for (const std::string& s : {
           "\xC0\x80"s, "\xC1\xBF"s,          // overlong 2-byte forms (C0, C1)
           "\xE0\x80\x80"s, "\xE0\x9F\xBF"s,  // overlong 3-byte forms
           "\xF0\x80\x80\x80"s, "\xF0\x8F\xBF\xBF"s,  // overlong 4-byte forms
           "\xED\xA0\x80"s, "\xED\xBF\xBF"s,  // UTF-16 surrogates U+D800, U+DFFF
           "\xF4\x90\x80\x80"s, "\xF5\x80\x80\x80"s,  // above U+10FFFF
           "\xE2\x82"s, "\xF0\x9F\x98"s, "\xC3"s,     // truncated at the end
           "\xE2\x82x"s, "\xF0\x9F\x98x"s,            // truncated before another character
           "\x80"s, "\xBF"s, "\xFE"s, "\xFF"s,        // stray bytes
       }) {
    EXPECT_FALSE(IsValidUtf8(s)) << EncodeName(s);
  }
}

TEST(EncodeName, KeepsValidNamesByteForByte) {
  for (const std::string& s : {"model-00001-of-00002.safetensors"s, "100%"s, "a%FFb"s,
                               "d\xC3\xA9j\xC3\xA0/vu.txt"s, "%25"s}) {
    EXPECT_EQ(EncodeName(s), s);
  }
}

TEST(EncodeName, EscapesBadBytesNulAndPercentInNamesThatNeedIt) {
  EXPECT_EQ(EncodeName("notes-\xFF.txt"), "notes-%FF.txt");
  EXPECT_EQ(EncodeName("50%-\xFF"), "50%25-%FF");
  EXPECT_EQ(EncodeName("a\0b"s), "a%00b");
  EXPECT_EQ(EncodeName("x\xE2\x82"), "x%E2%82");          // truncated: each byte escaped
  EXPECT_EQ(EncodeName("\xED\xA0\x80"), "%ED%A0%80");     // a surrogate is three bad bytes
  EXPECT_EQ(EncodeName("\xC0\x80"), "%C0%80");            // overlong NUL
  EXPECT_EQ(EncodeName("caf\xC3\xA9\xFF"), "caf\xC3\xA9%FF");  // valid sequences stay as is
  EXPECT_EQ(EncodeName("\xE2\x82\xE2\x82\xAC"), "%E2%82\xE2\x82\xAC");
}

TEST(DecodeName, InvertsEscapedNamesAndLeavesRecordedAsIsNamesAlone) {
  EXPECT_EQ(*DecodeName("notes-%FF.txt"), "notes-\xFF.txt");
  EXPECT_EQ(*DecodeName("50%25-%FF"), "50%-\xFF");
  EXPECT_EQ(*DecodeName("a%00b"), "a\0b"s);
  EXPECT_EQ(*DecodeName("100%"), "100%");       // not an escape
  EXPECT_EQ(*DecodeName("%41"), "%41");         // "A" needs no escaping: recorded as is
  EXPECT_EQ(*DecodeName("%ff"), "%ff");         // escapes are upper-case only
  EXPECT_EQ(*DecodeName("%FF%41"), "%FF%41");   // not canonical (A would be written as A)
  EXPECT_EQ(*DecodeName("plain"), "plain");
}

TEST(DecodeName, RefusesWhatNoNameEncodesTo) {
  for (const std::string& s : {"raw-\xFF"s, "a\0b"s}) {
    auto d = DecodeName(s);
    ASSERT_FALSE(d.ok());
    EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(IsValidUtf8(std::string(d.status().message())));
  }
}

// Random byte strings biased towards the interesting bytes: every encoding is valid UTF-8
// without NUL, and decoding gives the raw name back except where a valid name is spelled like
// the escaped form of another (the collision CheckNoEncodingCollisions refuses).
TEST(NameEncoding, RoundTripsRandomNames) {
  const std::vector<uint8_t> alphabet = {'a', '%', 'F', '0', '/', 0x00, 0x80, 0xBF, 0xC2, 0xC3,
                                         0xE0, 0xE2, 0xED, 0xA0, 0x82, 0xAC, 0xF0, 0xF4, 0x9F,
                                         0x90, 0xFF};
  std::mt19937 rng(12345);
  for (int i = 0; i < 20000; ++i) {
    std::string raw(rng() % 12, '\0');
    for (char& c : raw) c = static_cast<char>(alphabet[rng() % alphabet.size()]);
    const std::string encoded = EncodeName(raw);
    ASSERT_TRUE(IsValidUtf8(encoded));
    ASSERT_EQ(encoded.find('\0'), std::string::npos);
    absl::StatusOr<std::string> decoded = DecodeName(encoded);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    if (*decoded != raw) {
      // Only a valid name can be misread, and only as a name that encodes to it.
      EXPECT_EQ(encoded, raw);
      EXPECT_EQ(EncodeName(*decoded), raw);
      EXPECT_FALSE(CheckNoEncodingCollisions({raw, *decoded}).ok());
    }
  }
}

TEST(CheckNoEncodingCollisions, NamesBothNamesOfAClash) {
  absl::Status s = CheckNoEncodingCollisions({"a.txt", "notes-\xFF.txt", "notes-%FF.txt"});
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"notes-%FF.txt\""));
  EXPECT_THAT(std::string(s.message()), HasSubstr("\"notes-\\xFF.txt\""));
  EXPECT_TRUE(IsValidUtf8(std::string(s.message())));
  // Whole relative paths are compared, and NUL counts like a bad byte.
  EXPECT_FALSE(CheckNoEncodingCollisions({"d\xFF/x", "d%FF/x"}).ok());
  EXPECT_FALSE(CheckNoEncodingCollisions({"t%00", "t\0"s}).ok());
}

TEST(CheckNoEncodingCollisions, AcceptsDistinctRecordedNames) {
  EXPECT_TRUE(CheckNoEncodingCollisions({}).ok());
  EXPECT_TRUE(CheckNoEncodingCollisions({"a", "b", "100%"}).ok());
  EXPECT_TRUE(CheckNoEncodingCollisions({"notes-\xFF.txt", "notes-%ff.txt"}).ok());
  EXPECT_TRUE(CheckNoEncodingCollisions({"notes-\xFF.txt", "notes-\xFE.txt"}).ok());
}

TEST(DumpJson, MatchesNlohmannOnValidText) {
  nlohmann::json j = {{"b", {1, 2, "x"}}, {"a", "caf\xC3\xA9 100%"}, {"n", nullptr}};
  EXPECT_EQ(DumpJson(j), j.dump());
  EXPECT_EQ(DumpJson(j, 2), j.dump(2));
  nlohmann::ordered_json o = {{"z", 1}, {"a", "s"}};
  EXPECT_EQ(DumpJson(o), o.dump());
}

TEST(DumpJson, EnsureAsciiEscapesLikeNlohmannAndStillNeverThrows) {
  nlohmann::ordered_json j = {{"name", "caf\xC3\xA9 \xF0\x9F\x98\x80"}};
  EXPECT_EQ(DumpJson(j, 2, /*ensure_ascii=*/true), j.dump(2, ' ', true));
  EXPECT_THAT(DumpJson(j, -1, true), HasSubstr("caf\\u00e9 \\ud83d\\ude00"));
  j["raw"] = "x\xFF";
  EXPECT_THAT(DumpJson(j, -1, true), HasSubstr("\"x%FF\""));
}

TEST(DumpJson, WritesBadStringsAndKeysInTheNameEncodingInsteadOfThrowing) {
  nlohmann::ordered_json j;
  j["subject"] = {{"name", "notes-\xFF.txt"}};
  j["by_name"] = {{"k\xFE", "50%"}};
  j["list"] = {"ok", "bad\xC0\x80"};
  EXPECT_THROW(j.dump(), nlohmann::json::type_error);  // what DumpJson protects against
  const std::string text = DumpJson(j);
  EXPECT_EQ(text, DumpJson(j));  // deterministic
  auto back = nlohmann::json::parse(text);
  EXPECT_EQ(back["subject"]["name"], "notes-%FF.txt");
  EXPECT_EQ(back["by_name"]["k%FE"], "50%");  // valid strings are untouched
  EXPECT_EQ(back["list"][1], "bad%C0%80");
}

}  // namespace
}  // namespace ckpt
