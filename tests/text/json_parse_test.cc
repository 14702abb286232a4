// The bounded JSON parser (core/text/json_parse.h): what it builds, and each limit it enforces.
#include "core/text/json_parse.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ckpt {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string Nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// The message of a rejected parse, checked to be INVALID_ARGUMENT with the label first.
std::string Rejection(const std::string& text, const JsonLimits& limits = {}) {
  auto j = ParseBoundedJson(text, "in.json", limits);
  if (j.ok()) return "accepted";
  EXPECT_EQ(j.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(j.status().message()), StartsWith("in.json: "));
  return std::string(j.status().message());
}

TEST(ParseBoundedJson, BuildsTheSameDocumentAsNlohmann) {
  const std::string ok =
      R"({"a":[1,-2,3.5,"s",true,false,null,{"x":{}}],"b":{"c":[[],[{"d":18446744073709551615}]]},)"
      R"("e":"caf\u00e9\u0000"})";
  auto j = ParseBoundedJson(ok, "in.json");
  ASSERT_TRUE(j.ok()) << j.status();
  EXPECT_EQ(*j, nlohmann::json::parse(ok));
  EXPECT_TRUE((*j)["b"]["c"][1][0]["d"].is_number_unsigned());
  EXPECT_TRUE((*j)["a"][1].is_number_integer());
  EXPECT_THAT(Rejection(R"({"f":1e400})"), HasSubstr("invalid JSON"));  // overflows a double
  auto scalar = ParseBoundedJson(" 42 ", "in.json");
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(*scalar, 42);
}

TEST(ParseBoundedJson, DepthCapCountsObjectsAndArrays) {
  JsonLimits limits;
  limits.max_depth = 3;
  EXPECT_EQ(Rejection(R"({"a":[{}]})", limits), "accepted");
  EXPECT_THAT(Rejection(R"({"a":[{"b":[]}]})", limits), HasSubstr("nested deeper than 3"));
  EXPECT_EQ(Rejection(Nested(64)), "accepted");
  EXPECT_THAT(Rejection(Nested(65)), HasSubstr("JSON nested deeper than 64 levels"));
}

TEST(ParseBoundedJson, DeepNestingIsRefusedWithoutRecursion) {
  EXPECT_THAT(Rejection(Nested(1'000'000)), HasSubstr("nested deeper"));
  EXPECT_THAT(Rejection(std::string(1'000'000, '[')), HasSubstr("nested deeper"));
}

TEST(ParseBoundedJson, DuplicateKeysAreRefusedAtAnyDepthWithTheirPlace) {
  EXPECT_THAT(Rejection(R"({"a":1,"a":1})"),
              HasSubstr("duplicate JSON key 'a' in the object at /"));
  EXPECT_THAT(Rejection(R"({"x":{"y":[0,{"k":1,"j":2,"k":3}]}})"),
              HasSubstr("duplicate JSON key 'k' in the object at /x/y/1"));
  EXPECT_THAT(Rejection(R"({"a/b~":{"q":0,"q":0}})"), HasSubstr("at /a~1b~0"));
  // The same key in sibling objects is fine.
  EXPECT_EQ(Rejection(R"({"a":{"k":1},"b":{"k":1},"c":[{"k":1},{"k":2}]})"), "accepted");
}

TEST(ParseBoundedJson, CapsTopLevelEntriesOnly) {
  JsonLimits limits;
  limits.max_top_level_entries = 2;
  EXPECT_EQ(Rejection(R"({"a":{"x":1,"y":2,"z":3},"b":2})", limits), "accepted");
  EXPECT_THAT(Rejection(R"({"a":1,"b":2,"c":3})", limits), HasSubstr("more than 2 top-level"));
}

TEST(ParseBoundedJson, RefusesWhatTheReferenceReadersRefuse) {
  EXPECT_THAT(Rejection("\xEF\xBB\xBF{}"), HasSubstr("byte-order mark"));
  EXPECT_THAT(Rejection(R"({"a":1} x)"), HasSubstr("invalid JSON"));
  EXPECT_THAT(Rejection("{\"a\xFF\":1}"), HasSubstr("invalid JSON"));
  EXPECT_THAT(Rejection(R"({"a":"\ud800"})"), HasSubstr("invalid JSON"));
  EXPECT_THAT(Rejection("{\"a\":1,}"), HasSubstr("invalid JSON"));
  EXPECT_THAT(Rejection("// c\n{}"), HasSubstr("invalid JSON"));
  EXPECT_THAT(Rejection(""), HasSubstr("invalid JSON"));
  EXPECT_EQ(Rejection(" \t\r\n{}\n "), "accepted");
}

// A config-shaped document of 40,000 objects (what took 5.8 s with the callback parser).
TEST(ParseBoundedJson, ParsesFortyThousandObjects) {
  std::string text = R"({"model_type":"kimi","layers":[)";
  for (int i = 0; i < 40000; ++i) {
    absl::StrAppend(&text, i ? "," : "", R"({"index":)", i, R"(,"kind":"moe","rope":{"theta":)",
                    i * 10, "}}");
  }
  text += "]}";
  auto j = ParseBoundedJson(text, "config.json");
  ASSERT_TRUE(j.ok()) << j.status();
  ASSERT_EQ((*j)["layers"].size(), 40000u);
  EXPECT_EQ((*j)["layers"][39999]["rope"]["theta"], 399990);
}

}  // namespace
}  // namespace ckpt
