// RFC 6962 / RFC 9162 Merkle trees: hashing, inclusion and consistency proofs, verification.
//
// leaf = SHA-256(0x00 || entry), node = SHA-256(0x01 || left || right), and a tree of n leaves
// splits at the largest power of two below n. Proof generation reads only hashes of complete
// subtrees (level L, index i covers leaves [i*2^L, (i+1)*2^L)) through a NodeReader, so a
// store that keeps those nodes answers a proof with O(log n) lookups whatever its size.
#ifndef CKPT_STORAGE_MERKLE_H_
#define CKPT_STORAGE_MERKLE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/sha256.h"

namespace ckpt::storage {

using Hash = Digest;

Hash LeafHash(std::span<const uint8_t> entry);
Hash NodeHash(const Hash& left, const Hash& right);
Hash EmptyRoot();  // SHA-256 of the empty string

// Source of complete-subtree hashes.
class NodeReader {
 public:
  virtual ~NodeReader() = default;
  virtual absl::StatusOr<Hash> Node(int level, uint64_t index) const = 0;
};

// MTH(D[begin:end]) for the ranges RFC 6962's recursion produces (and any range, slower).
absl::StatusOr<Hash> RangeHash(const NodeReader& nodes, uint64_t begin, uint64_t end);
absl::StatusOr<Hash> RootAt(const NodeReader& nodes, uint64_t size);

// RFC 6962 §2.1.1 PATH(index, D[size]); INVALID_ARGUMENT unless index < size.
absl::StatusOr<std::vector<Hash>> InclusionProof(const NodeReader& nodes, uint64_t index,
                                                 uint64_t size);
// RFC 6962 §2.1.2 PROOF(old_size, D[new_size]); INVALID_ARGUMENT unless old_size <= new_size.
absl::StatusOr<std::vector<Hash>> ConsistencyProof(const NodeReader& nodes, uint64_t old_size,
                                                   uint64_t new_size);

// RFC 9162 §2.1.3.2 and §2.1.4.2. FAILED_PRECONDITION when the proof does not verify.
absl::Status VerifyInclusion(const Hash& leaf_hash, uint64_t index, uint64_t size,
                             const std::vector<Hash>& proof, const Hash& root);
absl::Status VerifyConsistency(uint64_t old_size, uint64_t new_size,
                               const std::vector<Hash>& proof, const Hash& old_root,
                               const Hash& new_root);

// A whole tree in memory: complete-subtree hashes by level. For tests and for recomputing a
// log's tree independently of what the log stored.
class MemoryTree final : public NodeReader {
 public:
  void Append(const Hash& leaf_hash);
  uint64_t size() const { return levels_.empty() ? 0 : levels_[0].size(); }
  absl::StatusOr<Hash> Node(int level, uint64_t index) const override;
  Hash Root() const { return *RootAt(*this, size()); }

 private:
  std::vector<std::vector<Hash>> levels_;
};

}  // namespace ckpt::storage

#endif  // CKPT_STORAGE_MERKLE_H_
