// A directory whose real path is longer than PATH_MAX, reached through a short path of relative
// symbolic links: base/h5 -> h4/C5, ..., base/h1 -> C1, each Ck about 1 KB of nested
// directories. No single system call can name the deep directory by its real path, so each
// level is created and removed through the links.
#ifndef CKPT_TESTS_CORE_DEEP_TREE_H_
#define CKPT_TESTS_CORE_DEEP_TREE_H_

#include <climits>
#include <filesystem>
#include <string>

namespace ckpt::testing {

class DeepTree {
 public:
  static constexpr int kLevels = 5;

  explicit DeepTree(const std::filesystem::path& base) : base_(base) {
    namespace fs = std::filesystem;
    for (int k = 1; k <= kLevels; ++k) {
      const fs::path above = k == 1 ? base_ : base_ / Link(k - 1);
      fs::create_directories(above / Chunk(k));
      const fs::path target = k == 1 ? fs::path(Chunk(k)) : fs::path(Link(k - 1)) / Chunk(k);
      fs::create_directory_symlink(target, base_ / Link(k));
    }
  }
  ~DeepTree() {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (int k = kLevels; k >= 1; --k) {  // deepest first: each removal stays short
      const fs::path above = k == 1 ? base_ : base_ / Link(k - 1);
      fs::remove_all(above / Component(k, 0), ec);
      fs::remove(base_ / Link(k), ec);
    }
  }
  DeepTree(const DeepTree&) = delete;
  DeepTree& operator=(const DeepTree&) = delete;

  // A short name for the deepest directory (through the links).
  std::filesystem::path deep() const { return base_ / Link(kLevels); }
  // The length of its real path: over PATH_MAX.
  size_t real_length() const {
    return std::filesystem::absolute(base_).string().size() + kLevels * (Chunk(1).size() + 1);
  }

 private:
  static std::string Link(int k) { return "h" + std::to_string(k); }
  static std::string Component(int k, int i) {
    return std::string(250, static_cast<char>('a' + k)) + std::to_string(i);
  }
  static std::string Chunk(int k) {
    std::string c;
    for (int i = 0; i < 4; ++i) c += (i ? "/" : "") + Component(k, i);
    return c;
  }

  std::filesystem::path base_;
};

static_assert(DeepTree::kLevels * 1000 > PATH_MAX, "the tree must be deeper than PATH_MAX");

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_CORE_DEEP_TREE_H_
