#include "core/safetensors.h"

#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_paths.h"

namespace ckpt {
namespace {

namespace fs = std::filesystem;
const fs::path kMalformed = fs::path(::ckpt::testing::kTestDataDir) / "malformed";

nlohmann::json Verdicts() {
  std::ifstream in(kMalformed / "verdicts.json");
  return nlohmann::json::parse(in);
}

// Every file in the malformed corpus gets the reference reader's verdict, except duplicate keys.
TEST(SafetensorsMalformedCorpus, AgreesWithReferenceVerdicts) {
  nlohmann::json cases = Verdicts().at("cases");
  size_t files = 0;
  for (const auto& entry : fs::directory_iterator(kMalformed)) {
    if (entry.path().extension() != ".safetensors") continue;
    ++files;
    std::string name = entry.path().stem().string();
    SCOPED_TRACE(name);
    ASSERT_TRUE(cases.contains(name)) << "no verdict for " << name;
    const nlohmann::json& verdict = cases.at(name);
    auto file = SafetensorsFile::Open(entry.path().string());
    bool expect_accept = verdict.at("accept").get<bool>() && name != "duplicate_key_identical";
    EXPECT_EQ(file.ok(), expect_accept) << (file.ok() ? "accepted" : file.status().ToString());
    if (file.ok()) {
      EXPECT_EQ((*file)->tensors().size(), verdict.at("tensors").get<size_t>());
    } else {
      // Errors start with the file path so an operator can find the file.
      EXPECT_THAT(std::string(file.status().message()),
                  ::testing::StartsWith(entry.path().string()));
    }
  }
  EXPECT_EQ(files, cases.size());
}

TEST(SafetensorsMalformedCorpus, DuplicateKeyIsNamed) {
  auto file = SafetensorsFile::Open((kMalformed / "duplicate_key_identical.safetensors").string());
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(file.status().message()), ::testing::HasSubstr("duplicate JSON key"));
}

std::vector<uint8_t> Build(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0xAB);
  return out;
}

absl::StatusOr<SafetensorsHeader> Parse(const std::string& header, size_t data_bytes,
                                        const SafetensorsLimits& limits = {}) {
  std::vector<uint8_t> bytes = Build(header, data_bytes);
  return ParseSafetensorsHeader(bytes, bytes.size(), "mem.safetensors", limits);
}

TEST(SafetensorsHeader, ParsesEntriesSortedByOffset) {
  auto h = Parse(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]},)"
                 R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("__metadata__":{"format":"pt"}})",
                 12);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 2u);
  EXPECT_EQ(h->tensors[0].name, "a");
  EXPECT_EQ(h->tensors[1].name, "b");
  EXPECT_EQ(h->tensors[1].dtype, DType::kF32);
  EXPECT_EQ(h->metadata.at("format"), "pt");
}

TEST(SafetensorsHeader, RejectsOddF4Count) {
  auto h = Parse(R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), ::testing::HasSubstr("whole number of bytes"));
}

TEST(SafetensorsHeader, RejectsFloatShapeAndShortOffsets) {
  EXPECT_FALSE(Parse(R"({"a":{"dtype":"U8","shape":[4.0],"data_offsets":[0,4]}})", 4).ok());
  EXPECT_FALSE(Parse(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0]}})", 4).ok());
  EXPECT_FALSE(Parse(R"({"a":{"dtype":"U8","shape":[4]}})", 4).ok());
}

TEST(SafetensorsHeader, CapsDepthAndEntries) {
  SafetensorsLimits limits;
  limits.max_json_depth = 4;
  std::string deep = R"({"__metadata__":{"x":[[[[["a"]]]]]}})";
  auto h = Parse(deep, 0, limits);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), ::testing::HasSubstr("nested deeper"));
  limits = {};
  limits.max_entries = 1;
  h = Parse(R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
            R"("b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]},)"
            R"("c":{"dtype":"U8","shape":[1],"data_offsets":[2,3]}})",
            3, limits);
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), ::testing::HasSubstr("entries"));
}

TEST(SafetensorsHeader, HugeLengthDoesNotAllocate) {
  // A length prefix of 2^63 in a 16-byte file must be rejected before anything is sized by it.
  std::vector<uint8_t> bytes(16, 0);
  bytes[7] = 0x80;
  auto h = ParseSafetensorsHeader(bytes, bytes.size(), "huge");
  ASSERT_FALSE(h.ok());
  EXPECT_THAT(std::string(h.status().message()), ::testing::HasSubstr("header too large"));
}

TEST(SafetensorsHeader, TrailingBytesAreDataLoss) {
  auto h = Parse(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", 5);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(h.status().message()), ::testing::HasSubstr("not fully covered"));
}

TEST(SafetensorsHeader, InvalidUtf8IsRejected) {
  std::string header = "{\"a\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}";
  EXPECT_FALSE(Parse(header, 1).ok());
}

// 100,000 entries listed in reverse offset order (the callback parser took seconds for 40k).
TEST(SafetensorsHeader, ParsesAHundredThousandTensors) {
  constexpr int kTensors = 100'000;
  std::string header = R"({"__metadata__":{"format":"pt"})";
  for (int i = kTensors - 1; i >= 0; --i) {
    absl::StrAppend(&header, ",\"layers.", i, ".w\":{\"dtype\":\"F32\",\"shape\":[2],",
                    "\"data_offsets\":[", 8 * i, ",", 8 * i + 8, "]}");
  }
  header += "}";
  auto h = Parse(header, 8 * kTensors);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(h->metadata.at("format"), "pt");
  for (int i = 0; i < kTensors; ++i) {
    const TensorInfo& t = h->tensors[i];
    ASSERT_EQ(t.begin, 8u * i) << i;
    ASSERT_EQ(t.end, 8u * i + 8) << i;
    ASSERT_EQ(t.name, absl::StrCat("layers.", i, ".w"));
  }
  EXPECT_EQ(h->tensors.back().shape, (std::vector<uint64_t>{2}));
}

TEST(SafetensorsHeader, DuplicateKeysAreRejectedAtEveryDepth) {
  const std::string entry = R"("a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]})";
  for (const std::string& header : std::vector<std::string>{
           R"({"__metadata__":{"k":"x","k":"y"},)" + entry + "}",
           R"({"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
           R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{"y":[{"z":1,"z":1}]}}})",
       }) {
    SCOPED_TRACE(header);
    auto h = Parse(header, 1);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(h.status().message()), ::testing::HasSubstr("duplicate JSON key"));
  }
  auto deep = Parse(
      R"({"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":{"y":[{"z":1,"z":1}]}}})", 1);
  EXPECT_THAT(std::string(deep.status().message()), ::testing::HasSubstr("at /a/x/y/0"));
}

TEST(SafetensorsHeader, DeepNestingIsInvalidArgumentNotAStackOverflow) {
  const std::string deep(200'000, '[');
  for (const std::string& header : {R"({"__metadata__":)" + deep + std::string(200'000, ']') + "}",
                                    R"({"__metadata__":)" + deep}) {
    auto h = Parse(header, 0);
    ASSERT_FALSE(h.ok());
    EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(h.status().message()),
                ::testing::HasSubstr("nested deeper than 8 levels"));
  }
}

// "a\u0000b" is recorded as "a%00b" (docs/evidence.md, "Name encoding"): both in one header
// would be two tensors with one recorded name.
TEST(SafetensorsHeader, TensorNamesWithTheSameRecordedNameAreRejected) {
  auto alone = Parse(R"({"a\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1);
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->tensors[0].name, std::string("a\0b", 3));
  auto both = Parse(R"({"a\u0000b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                    R"("a%00b":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                    2);
  ASSERT_FALSE(both.ok());
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(both.status().message()), ::testing::HasSubstr("\"a%00b\""));
}

TEST(DType, RoundTripsEveryName) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ",
                           "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
                           "I64", "U64", "F64", "C64", "F4", "F6_E2M3", "F6_E3M2"}) {
    auto d = ParseDType(name);
    ASSERT_TRUE(d.has_value()) << name;
    EXPECT_EQ(DTypeName(*d), name);
  }
  EXPECT_FALSE(ParseDType("f32").has_value());
  EXPECT_EQ(DTypeBits(DType::kF4), 4);
  EXPECT_EQ(DTypeBits(DType::kF6_E2M3), 6);
  EXPECT_EQ(DTypeBits(DType::kC64), 64);
}

}  // namespace
}  // namespace ckpt
