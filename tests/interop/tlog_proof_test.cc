// Portable proofs: C2SP note verifier keys and tlog-proof@v1 files made from a real log, verified
// offline; every tampered field fails. (The same proofs are cross-checked with Go's sumdb/note and
// sumdb/tlog by go_crosscheck.sh.)
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/evidence/base64.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "storage/evidence_log.h"
#include "storage/note_key.h"
#include "storage/tlog_proof.h"
#include "tests/evidence/log_test_util.h"
#include "tests/test_util.h"

namespace ckpt::storage {
namespace {

using ::ckpt::testing::TempDir;
using ::testing::HasSubstr;

class TlogProofTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto key = evidence::SigningKey::Generate();
    ASSERT_TRUE(key.ok());
    key_ = std::make_unique<evidence::SigningKey>(*key);
    auto log = EvidenceLog::Open((dir_ / "log.db").string(), /*create=*/true);
    ASSERT_TRUE(log.ok());
    log_ = *std::move(log);
    for (int i = 0; i < 7; ++i) {
      ASSERT_TRUE(log_->Append(::ckpt::testing::SampleEnvelope(*key_, i), *key_).ok());
    }
    auto vkey = FormatNoteVerifierKey(log_->origin(), key_->public_key());
    ASSERT_TRUE(vkey.ok());
    vkey_text_ = *vkey;
    vkey_ = std::make_unique<NoteVerifierKey>(*ParseNoteVerifierKey(vkey_text_));
  }
  absl::Status VerifyText(const std::string& text) {
    auto proof = ParseTlogProof(text);
    if (!proof.ok()) return proof.status();
    return VerifyTlogProof(*proof, *vkey_).status();
  }

  TempDir dir_;
  std::unique_ptr<evidence::SigningKey> key_;
  std::unique_ptr<EvidenceLog> log_;
  std::string vkey_text_;
  std::unique_ptr<NoteVerifierKey> vkey_;
};

TEST_F(TlogProofTest, VerifierKeyHasTheC2spForm) {
  std::vector<std::string> parts = absl::StrSplit(vkey_text_, absl::MaxSplits('+', 2));
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0], log_->origin());
  EXPECT_EQ(parts[1].size(), 8u);
  auto blob = evidence::Base64Decode(parts[2]);
  ASSERT_TRUE(blob.ok());
  ASSERT_EQ(blob->size(), 33u);
  EXPECT_EQ((*blob)[0], 0x01);
  EXPECT_TRUE(std::equal(blob->begin() + 1, blob->end(), key_->public_key().raw().begin()));
  auto id = NoteKeyId(log_->origin(), key_->public_key());
  char hex[9];
  std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", id[0], id[1], id[2], id[3]);
  EXPECT_EQ(parts[1], hex);
}

TEST_F(TlogProofTest, BadVerifierKeysAreRejected) {
  std::string wrong_hash = vkey_text_;
  size_t plus = wrong_hash.find('+');
  wrong_hash[plus + 1] = wrong_hash[plus + 1] == '0' ? '1' : '0';
  EXPECT_THAT(ParseNoteVerifierKey(wrong_hash).status().message(), HasSubstr("key hash"));
  EXPECT_FALSE(ParseNoteVerifierKey("name+0000").ok());
  EXPECT_FALSE(ParseNoteVerifierKey("bad name+00000000+AQ==").ok());
  EXPECT_FALSE(FormatNoteVerifierKey("a+b", key_->public_key()).ok());
  EXPECT_FALSE(FormatNoteVerifierKey("", key_->public_key()).ok());
}

TEST_F(TlogProofTest, EveryEntryProvesAndRoundTrips) {
  for (uint64_t seq = 0; seq < 7; ++seq) {
    auto proof = ProveEntry(*log_, seq);
    ASSERT_TRUE(proof.ok()) << proof.status();
    std::string text = FormatTlogProof(*proof);
    EXPECT_EQ(text.rfind("c2sp.org/tlog-proof@v1\nextra ", 0), 0u);
    EXPECT_THAT(text, HasSubstr(absl::StrCat("\nindex ", seq, "\n")));
    auto parsed = ParseTlogProof(text);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(FormatTlogProof(*parsed), text);
    auto verified = VerifyTlogProof(*parsed, *vkey_);
    ASSERT_TRUE(verified.ok()) << verified.status();
    EXPECT_EQ(verified->head.size, 7u);
    EXPECT_EQ(verified->entry, log_->Get(seq)->envelope);
  }
}

TEST_F(TlogProofTest, TamperedProofsFail) {
  std::string good = FormatTlogProof(*ProveEntry(*log_, 2));
  ASSERT_TRUE(VerifyText(good).ok());

  // Another entry's bytes in `extra`.
  auto other = ProveEntry(*log_, 3);
  auto p = *ParseTlogProof(good);
  p.extra = other->extra;
  EXPECT_THAT(VerifyTlogProof(p, *vkey_).status().message(), HasSubstr("entry 2"));
  // Another index.
  p = *ParseTlogProof(good);
  p.index = 3;
  EXPECT_FALSE(VerifyTlogProof(p, *vkey_).ok());
  p.index = 7;
  EXPECT_THAT(VerifyTlogProof(p, *vkey_).status().message(), HasSubstr("outside"));
  // A path hash changed, dropped, or one added.
  p = *ParseTlogProof(good);
  p.path[0][5] ^= 1;
  EXPECT_FALSE(VerifyTlogProof(p, *vkey_).ok());
  p = *ParseTlogProof(good);
  p.path.pop_back();
  EXPECT_FALSE(VerifyTlogProof(p, *vkey_).ok());
  p = *ParseTlogProof(good);
  p.path.push_back(p.path[0]);
  EXPECT_FALSE(VerifyTlogProof(p, *vkey_).ok());
  // The checkpoint's root or signature changed.
  p = *ParseTlogProof(good);
  size_t root_line = p.checkpoint.find('\n', p.checkpoint.find('\n') + 1) + 1;
  p.checkpoint[root_line] = p.checkpoint[root_line] == 'A' ? 'B' : 'A';
  EXPECT_FALSE(VerifyTlogProof(p, *vkey_).ok());
  p = *ParseTlogProof(good);
  p.checkpoint[p.checkpoint.size() - 4] ^= 1;
  EXPECT_THAT(VerifyTlogProof(p, *vkey_).status().message(), HasSubstr("no signature"));
  // Another log's key.
  auto stranger = evidence::SigningKey::Generate();
  NoteVerifierKey wrong{log_->origin(), stranger->public_key()};
  EXPECT_FALSE(VerifyTlogProof(*ParseTlogProof(good), wrong).ok());
  NoteVerifierKey renamed{"other.example/log", key_->public_key()};
  EXPECT_FALSE(VerifyTlogProof(*ParseTlogProof(good), renamed).ok());
}

TEST_F(TlogProofTest, MalformedProofTextIsRejectedWithTheLine) {
  std::string good = FormatTlogProof(*ProveEntry(*log_, 1));
  EXPECT_THAT(ParseTlogProof("c2sp.org/tlog-proof@v2\n").status().message(), HasSubstr("line 1"));
  std::string lead = good;
  lead.replace(lead.find("index 1"), 7, "index 01");
  EXPECT_THAT(ParseTlogProof(lead).status().message(), HasSubstr("no leading zeros"));
  std::string no_blank = good.substr(0, good.find("\n\n") + 1);
  EXPECT_FALSE(ParseTlogProof(no_blank).ok());
  std::string bad_hash = good;
  size_t index_end = bad_hash.find('\n', bad_hash.find("index 1")) + 1;
  bad_hash.insert(index_end, "AAAA\n");
  EXPECT_THAT(ParseTlogProof(bad_hash).status().message(), HasSubstr("SHA-256"));
  // A proof without extra needs the entry from elsewhere.
  auto p = *ParseTlogProof(good);
  std::string entry = *p.extra;
  p.extra.reset();
  std::string bare = FormatTlogProof(p);
  EXPECT_EQ(bare.find("extra"), std::string::npos);
  auto parsed = *ParseTlogProof(bare);
  EXPECT_EQ(VerifyTlogProof(parsed, *vkey_).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(VerifyTlogProof(parsed, *vkey_, entry).ok());
}

}  // namespace
}  // namespace ckpt::storage
