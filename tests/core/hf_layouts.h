// Builds the two Hugging Face download layouts from a fixture directory, the way
// huggingface_hub lays them out (docs/hf-layouts.md), for tests to audit:
//  - a hub cache repo folder `models--ORG--NAME/` with `blobs/` (LFS files named by their
//    SHA-256, other files by their git blob id), `refs/main` and `snapshots/COMMIT/` whose
//    files are relative links `../../blobs/X`;
//  - a `--local-dir` download: the files themselves plus `.cache/huggingface/` with a
//    `.gitignore`, and `download/F.metadata` (commit, etag, timestamp) and `download/F.lock`.
// Blob names are computed here with OpenSSL directly, not with the code under test.
#ifndef CKPT_TESTS_CORE_HF_LAYOUTS_H_
#define CKPT_TESTS_CORE_HF_LAYOUTS_H_

#include <openssl/evp.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_replace.h"
#include "core/sha256.h"
#include "tests/test_util.h"

namespace ckpt::testing {

inline std::string GitBlobIdHex(const std::vector<uint8_t>& content) {
  std::string data = "blob " + std::to_string(content.size());
  data.push_back('\0');
  data.append(content.begin(), content.end());
  unsigned char md[20];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), md, &len, EVP_sha1(), nullptr);
  return ToHex(std::span<const uint8_t>(md, len));
}

// The name huggingface_hub gives a file's blob (and its etag): SHA-256 for LFS files (here the
// safetensors shards), the git blob id for the others.
inline std::string HubBlobName(const std::filesystem::path& file) {
  std::vector<uint8_t> bytes = ReadAll(file);
  if (file.extension() == ".safetensors") return ToHex(Sha256Of(bytes));
  return GitBlobIdHex(bytes);
}

struct HubSnapshot {
  std::filesystem::path repo;      // models--ORG--NAME
  std::filesystem::path snapshot;  // repo/snapshots/COMMIT
};

inline HubSnapshot MakeHubSnapshot(const std::string& fixture, const std::filesystem::path& cache,
                                   const std::string& repo_id, const std::string& commit) {
  namespace fs = std::filesystem;
  HubSnapshot h;
  h.repo = cache / ("models--" + absl::StrReplaceAll(repo_id, {{"/", "--"}}));
  h.snapshot = h.repo / "snapshots" / commit;
  fs::create_directories(h.repo / "blobs");
  fs::create_directories(h.repo / "refs");
  fs::create_directories(h.snapshot);
  WriteAll(h.repo / "refs" / "main", commit);
  for (const auto& e : fs::directory_iterator(Fixture(fixture))) {
    const std::string blob = HubBlobName(e.path());
    fs::copy_file(e.path(), h.repo / "blobs" / blob, fs::copy_options::overwrite_existing);
    fs::create_symlink("../../blobs/" + blob, h.snapshot / e.path().filename());
  }
  return h;
}

// Metadata file of `name` in a local-dir download at `dir`.
inline std::filesystem::path MetadataOf(const std::filesystem::path& dir, const std::string& name) {
  return dir / ".cache" / "huggingface" / "download" / (name + ".metadata");
}

inline std::filesystem::path MakeLocalDir(const std::string& fixture, const std::filesystem::path& dir,
                                          const std::string& commit) {
  namespace fs = std::filesystem;
  const fs::path download = dir / ".cache" / "huggingface" / "download";
  fs::create_directories(download);
  WriteAll(dir / ".cache" / "huggingface" / ".gitignore", "*\n");
  for (const auto& e : fs::directory_iterator(Fixture(fixture))) {
    const std::string name = e.path().filename().string();
    fs::copy_file(e.path(), dir / name);
    WriteAll(MetadataOf(dir, name), commit + "\n" + HubBlobName(e.path()) + "\n1764460800.25\n");
    WriteAll(download / (name + ".lock"), "");
  }
  return dir;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_CORE_HF_LAYOUTS_H_
