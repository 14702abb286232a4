#include "storage/tlog_proof.h"

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/base64.h"

namespace ckpt::storage {
namespace {

constexpr size_t kMaxPathLength = 64;  // a tree of at most 2^64 leaves

// The next '\n'-terminated line of `text` from `*pos`, without the newline.
std::optional<std::string> NextLine(const std::string& text, size_t* pos) {
  size_t end = text.find('\n', *pos);
  if (end == std::string::npos) return std::nullopt;
  std::string line = text.substr(*pos, end - *pos);
  *pos = end + 1;
  return line;
}

bool CanonicalDecimal(const std::string& s, uint64_t* out) {
  if (s.empty() || (s.size() > 1 && s[0] == '0')) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return absl::SimpleAtoi(s, out);
}

}  // namespace

std::string FormatTlogProof(const TlogProof& proof) {
  std::string out = absl::StrCat(kTlogProofHeader, "\n");
  if (proof.extra) absl::StrAppend(&out, "extra ", evidence::Base64Encode(*proof.extra), "\n");
  absl::StrAppend(&out, "index ", proof.index, "\n");
  for (const Hash& h : proof.path) absl::StrAppend(&out, evidence::Base64Encode(h), "\n");
  absl::StrAppend(&out, "\n", proof.checkpoint);
  return out;
}

absl::StatusOr<TlogProof> ParseTlogProof(const std::string& text) {
  size_t pos = 0;
  int line_no = 0;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("tlog proof line ", line_no, ": ", why));
  };
  auto next = [&]() {
    ++line_no;
    return NextLine(text, &pos);
  };
  std::optional<std::string> line = next();
  if (line != kTlogProofHeader) return bad(absl::StrCat("expected '", kTlogProofHeader, "'"));
  TlogProof proof;
  line = next();
  if (line && line->rfind("extra ", 0) == 0) {
    auto extra = evidence::Base64Decode(line->substr(6));
    if (!extra.ok()) return bad(absl::StrCat("extra: ", extra.status().message()));
    proof.extra = std::string(extra->begin(), extra->end());
    line = next();
  }
  if (!line || line->rfind("index ", 0) != 0 || !CanonicalDecimal(line->substr(6), &proof.index)) {
    return bad("expected 'index N' (decimal, no leading zeros)");
  }
  for (line = next(); line && !line->empty(); line = next()) {
    if (proof.path.size() == kMaxPathLength) return bad("inclusion path longer than 64 hashes");
    auto h = evidence::Base64Decode(*line);
    if (!h.ok() || h->size() != sizeof(Hash)) return bad("not a base64 SHA-256 hash");
    Hash hash;
    std::memcpy(hash.data(), h->data(), hash.size());
    proof.path.push_back(hash);
  }
  if (!line) return bad("missing the empty line before the checkpoint");
  proof.checkpoint = text.substr(pos);
  if (proof.checkpoint.empty()) return bad("missing checkpoint");
  return proof;
}

absl::StatusOr<TlogProof> ProveEntry(const EvidenceLog& log, uint64_t seq) {
  auto latest = log.LatestCheckpoint();
  if (!latest.ok()) return latest.status();
  auto entry = log.Get(seq);
  if (!entry.ok()) return entry.status();
  if (seq >= latest->first) {
    return absl::FailedPreconditionError(absl::StrCat(
        "entry ", seq, " is not covered by the newest checkpoint (size ", latest->first, ")"));
  }
  auto path = log.InclusionProof(seq, latest->first);
  if (!path.ok()) return path.status();
  return TlogProof{entry->envelope, seq, *std::move(path), latest->second};
}

absl::StatusOr<VerifiedTlogProof> VerifyTlogProof(const TlogProof& proof,
                                                  const NoteVerifierKey& vkey,
                                                  const std::optional<std::string>& entry) {
  const std::optional<std::string>& bytes = entry ? entry : proof.extra;
  if (!bytes) {
    return absl::InvalidArgumentError(
        "the proof carries no entry (no 'extra' line); give the entry's bytes");
  }
  evidence::TrustStore trust;
  trust.Add(vkey.key);
  auto head = VerifyCheckpoint(proof.checkpoint, vkey.name, trust);
  if (!head.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(head.status().message()));
  }
  if (proof.index >= head->size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "index ", proof.index, " is outside the checkpointed tree of size ", head->size));
  }
  Hash leaf = LeafHash(evidence::AsBytes(*bytes));
  if (auto s = VerifyInclusion(leaf, proof.index, head->size, proof.path, head->root); !s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("entry ", proof.index, ": ", s.message()));
  }
  return VerifiedTlogProof{*head, proof.index, *bytes};
}

}  // namespace ckpt::storage
