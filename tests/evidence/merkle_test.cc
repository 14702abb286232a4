// RFC 6962 Merkle tree against the public test vectors (certificate-transparency's
// merkle_tree_test / transparency-dev/merkle testdata: the 8 standard leaves), plus exhaustive
// proof round trips for small trees.
#include "storage/merkle.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::storage {
namespace {

std::vector<std::string> Leaves() {
  return {std::string(),
          std::string("\x00", 1),
          "\x10",
          "\x20\x21",
          "\x30\x31",
          "\x40\x41\x42\x43",
          "\x50\x51\x52\x53\x54\x55\x56\x57",
          "\x60\x61\x62\x63\x64\x65\x66\x67\x68\x69\x6a\x6b\x6c\x6d\x6e\x6f"};
}

Hash FromHex(const std::string& hex) {
  Hash h{};
  for (size_t i = 0; i < h.size(); ++i) h[i] = std::stoi(hex.substr(2 * i, 2), nullptr, 16);
  return h;
}

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

MemoryTree VectorTree(size_t n) {
  MemoryTree t;
  auto leaves = Leaves();
  for (size_t i = 0; i < n; ++i) t.Append(LeafHash(Bytes(leaves[i])));
  return t;
}

const char* kRoots[] = {
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
};

TEST(Merkle, EmptyRootIsSha256OfNothing) {
  EXPECT_EQ(ToHex(EmptyRoot()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(*RootAt(MemoryTree(), 0), EmptyRoot());
}

TEST(Merkle, RootsMatchRfc6962Vectors) {
  MemoryTree t = VectorTree(8);
  for (uint64_t n = 1; n <= 8; ++n) {
    auto root = RootAt(t, n);
    ASSERT_TRUE(root.ok());
    EXPECT_EQ(ToHex(*root), kRoots[n - 1]) << "size " << n;
  }
}

std::vector<std::string> Hexes(const std::vector<Hash>& hs) {
  std::vector<std::string> out;
  for (const Hash& h : hs) out.push_back(ToHex(h));
  return out;
}

TEST(Merkle, InclusionProofsMatchVectors) {
  MemoryTree t = VectorTree(8);
  EXPECT_TRUE(InclusionProof(t, 0, 1)->empty());
  EXPECT_EQ(Hexes(*InclusionProof(t, 0, 8)),
            (std::vector<std::string>{
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"}));
  EXPECT_EQ(Hexes(*InclusionProof(t, 5, 8)),
            (std::vector<std::string>{
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"}));
  EXPECT_FALSE(InclusionProof(t, 8, 8).ok());
}

TEST(Merkle, ConsistencyProofsMatchVectors) {
  MemoryTree t = VectorTree(8);
  EXPECT_TRUE(ConsistencyProof(t, 1, 1)->empty());
  EXPECT_EQ(Hexes(*ConsistencyProof(t, 1, 8)),
            (std::vector<std::string>{
                "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4"}));
  EXPECT_EQ(Hexes(*ConsistencyProof(t, 6, 8)),
            (std::vector<std::string>{
                "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
                "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
                "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7"}));
  EXPECT_EQ(Hexes(*ConsistencyProof(t, 2, 5)),
            (std::vector<std::string>{
                "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
                "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b"}));
  EXPECT_FALSE(ConsistencyProof(t, 5, 2).ok());
}

// Every proof for every size up to 70 verifies, and fails against a wrong root, index or leaf.
TEST(Merkle, AllProofsRoundTrip) {
  MemoryTree t;
  std::vector<Hash> leaves;
  for (int i = 0; i < 70; ++i) {
    std::string s = "leaf " + std::to_string(i);
    leaves.push_back(LeafHash(Bytes(s)));
    t.Append(leaves.back());
  }
  Hash wrong = LeafHash(Bytes("wrong"));
  for (uint64_t n = 1; n <= 70; ++n) {
    Hash root = *RootAt(t, n);
    for (uint64_t i = 0; i < n; ++i) {
      auto p = InclusionProof(t, i, n);
      ASSERT_TRUE(p.ok());
      EXPECT_TRUE(VerifyInclusion(leaves[i], i, n, *p, root).ok()) << i << "/" << n;
      EXPECT_FALSE(VerifyInclusion(wrong, i, n, *p, root).ok());
      if (n > 1) EXPECT_FALSE(VerifyInclusion(leaves[i], (i + 1) % n, n, *p, root).ok());
    }
    for (uint64_t m = 1; m <= n; ++m) {
      auto p = ConsistencyProof(t, m, n);
      ASSERT_TRUE(p.ok());
      Hash old_root = *RootAt(t, m);
      EXPECT_TRUE(VerifyConsistency(m, n, *p, old_root, root).ok()) << m << "->" << n;
      if (m < n) {
        EXPECT_FALSE(VerifyConsistency(m, n, *p, wrong, root).ok());
        EXPECT_FALSE(VerifyConsistency(m, n, *p, old_root, wrong).ok());
      }
    }
  }
}

TEST(Merkle, TruncatedOrPaddedProofFails) {
  MemoryTree t = VectorTree(8);
  Hash root = *RootAt(t, 8);
  auto leaves = Leaves();
  auto p = *InclusionProof(t, 5, 8);
  Hash leaf = LeafHash(Bytes(leaves[5]));
  ASSERT_TRUE(VerifyInclusion(leaf, 5, 8, p, root).ok());
  auto shorter = p;
  shorter.pop_back();
  EXPECT_FALSE(VerifyInclusion(leaf, 5, 8, shorter, root).ok());
  auto longer = p;
  longer.push_back(root);
  EXPECT_FALSE(VerifyInclusion(leaf, 5, 8, longer, root).ok());
}

}  // namespace
}  // namespace ckpt::storage
