#include "storage/merkle.h"

#include <bit>

#include "absl/strings/str_cat.h"

namespace ckpt::storage {
namespace {

// Largest power of two strictly below n (n >= 2).
uint64_t SplitPoint(uint64_t n) { return std::bit_floor(n - 1); }

absl::Status Path(const NodeReader& nodes, uint64_t m, uint64_t begin, uint64_t n,
                  std::vector<Hash>* out) {
  if (n == 1) return absl::OkStatus();
  uint64_t k = SplitPoint(n);
  absl::StatusOr<Hash> sibling;
  if (m < k) {
    if (auto s = Path(nodes, m, begin, k, out); !s.ok()) return s;
    sibling = RangeHash(nodes, begin + k, begin + n);
  } else {
    if (auto s = Path(nodes, m - k, begin + k, n - k, out); !s.ok()) return s;
    sibling = RangeHash(nodes, begin, begin + k);
  }
  if (!sibling.ok()) return sibling.status();
  out->push_back(*sibling);
  return absl::OkStatus();
}

absl::Status SubProof(const NodeReader& nodes, uint64_t m, uint64_t begin, uint64_t n,
                      bool complete, std::vector<Hash>* out) {
  if (m == n) {
    if (complete) return absl::OkStatus();
    auto h = RangeHash(nodes, begin, begin + n);
    if (!h.ok()) return h.status();
    out->push_back(*h);
    return absl::OkStatus();
  }
  uint64_t k = SplitPoint(n);
  absl::StatusOr<Hash> sibling;
  if (m <= k) {
    if (auto s = SubProof(nodes, m, begin, k, complete, out); !s.ok()) return s;
    sibling = RangeHash(nodes, begin + k, begin + n);
  } else {
    if (auto s = SubProof(nodes, m - k, begin + k, n - k, false, out); !s.ok()) return s;
    sibling = RangeHash(nodes, begin, begin + k);
  }
  if (!sibling.ok()) return sibling.status();
  out->push_back(*sibling);
  return absl::OkStatus();
}

absl::Status ProofFailure(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrCat(what, " proof does not verify"));
}

}  // namespace

Hash LeafHash(std::span<const uint8_t> entry) {
  Sha256 h;
  const uint8_t prefix = 0x00;
  h.Update({&prefix, 1});
  h.Update(entry);
  return h.Finish();
}

Hash NodeHash(const Hash& left, const Hash& right) {
  Sha256 h;
  const uint8_t prefix = 0x01;
  h.Update({&prefix, 1});
  h.Update(left);
  h.Update(right);
  return h.Finish();
}

Hash EmptyRoot() { return Sha256Of({}); }

absl::StatusOr<Hash> RangeHash(const NodeReader& nodes, uint64_t begin, uint64_t end) {
  uint64_t n = end - begin;
  if (std::has_single_bit(n) && begin % n == 0) {
    return nodes.Node(std::countr_zero(n), begin / n);
  }
  uint64_t k = SplitPoint(n);
  auto left = RangeHash(nodes, begin, begin + k);
  if (!left.ok()) return left.status();
  auto right = RangeHash(nodes, begin + k, end);
  if (!right.ok()) return right.status();
  return NodeHash(*left, *right);
}

absl::StatusOr<Hash> RootAt(const NodeReader& nodes, uint64_t size) {
  if (size == 0) return EmptyRoot();
  return RangeHash(nodes, 0, size);
}

absl::StatusOr<std::vector<Hash>> InclusionProof(const NodeReader& nodes, uint64_t index,
                                                 uint64_t size) {
  if (index >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("inclusion proof: index ", index, " is not below tree size ", size));
  }
  std::vector<Hash> out;
  if (auto s = Path(nodes, index, 0, size, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::vector<Hash>> ConsistencyProof(const NodeReader& nodes, uint64_t old_size,
                                                   uint64_t new_size) {
  if (old_size > new_size) {
    return absl::InvalidArgumentError(absl::StrCat("consistency proof: old size ", old_size,
                                                   " exceeds new size ", new_size));
  }
  std::vector<Hash> out;
  if (old_size == 0 || old_size == new_size) return out;
  if (auto s = SubProof(nodes, old_size, 0, new_size, true, &out); !s.ok()) return s;
  return out;
}

absl::Status VerifyInclusion(const Hash& leaf_hash, uint64_t index, uint64_t size,
                             const std::vector<Hash>& proof, const Hash& root) {
  if (index >= size) return ProofFailure("inclusion (index >= size)");
  uint64_t fn = index, sn = size - 1;
  Hash r = leaf_hash;
  for (const Hash& p : proof) {
    if (sn == 0) return ProofFailure("inclusion (proof too long)");
    if ((fn & 1) || fn == sn) {
      r = NodeHash(p, r);
      while (!(fn & 1) && fn != 0) {
        fn >>= 1;
        sn >>= 1;
      }
    } else {
      r = NodeHash(r, p);
    }
    fn >>= 1;
    sn >>= 1;
  }
  if (sn != 0 || r != root) return ProofFailure("inclusion");
  return absl::OkStatus();
}

absl::Status VerifyConsistency(uint64_t old_size, uint64_t new_size,
                               const std::vector<Hash>& proof, const Hash& old_root,
                               const Hash& new_root) {
  if (old_size > new_size) return ProofFailure("consistency (old size > new size)");
  if (old_size == new_size) {
    if (!proof.empty() || old_root != new_root) return ProofFailure("consistency (same size)");
    return absl::OkStatus();
  }
  if (old_size == 0) {
    // Every tree extends the empty tree; nothing to prove.
    if (!proof.empty()) return ProofFailure("consistency (from empty)");
    return absl::OkStatus();
  }
  std::vector<Hash> path;
  if (std::has_single_bit(old_size)) path.push_back(old_root);
  path.insert(path.end(), proof.begin(), proof.end());
  if (path.empty()) return ProofFailure("consistency (empty)");
  uint64_t fn = old_size - 1, sn = new_size - 1;
  while (fn & 1) {
    fn >>= 1;
    sn >>= 1;
  }
  Hash fr = path[0], sr = path[0];
  for (size_t i = 1; i < path.size(); ++i) {
    const Hash& c = path[i];
    if (sn == 0) return ProofFailure("consistency (proof too long)");
    if ((fn & 1) || fn == sn) {
      fr = NodeHash(c, fr);
      sr = NodeHash(c, sr);
      while (!(fn & 1) && fn != 0) {
        fn >>= 1;
        sn >>= 1;
      }
    } else {
      sr = NodeHash(sr, c);
    }
    fn >>= 1;
    sn >>= 1;
  }
  if (sn != 0 || fr != old_root || sr != new_root) return ProofFailure("consistency");
  return absl::OkStatus();
}

void MemoryTree::Append(const Hash& leaf_hash) {
  if (levels_.empty()) levels_.emplace_back();
  levels_[0].push_back(leaf_hash);
  // Every level whose last pair just became complete gains a parent.
  for (size_t level = 0; levels_[level].size() % 2 == 0; ++level) {
    if (level + 1 == levels_.size()) levels_.emplace_back();
    const auto& row = levels_[level];
    levels_[level + 1].push_back(NodeHash(row[row.size() - 2], row.back()));
  }
}

absl::StatusOr<Hash> MemoryTree::Node(int level, uint64_t index) const {
  if (level < 0 || static_cast<size_t>(level) >= levels_.size() ||
      index >= levels_[level].size()) {
    return absl::NotFoundError(absl::StrCat("no tree node at level ", level, " index ", index));
  }
  return levels_[level][index];
}

}  // namespace ckpt::storage
