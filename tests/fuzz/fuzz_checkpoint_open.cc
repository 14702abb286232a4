// libFuzzer target: Checkpoint::Open with fuzzed index, config and X4T manifest/contract files.
//
// The first input byte picks which JSON file of a small valid checkpoint the rest of the input
// replaces: 0 model.safetensors.index.json, 1 config.json (sharded root); 2 manifest.json,
// 3 build-contract.json (X4T container root). The roots are built once in a temp directory
// around a tiny valid shard, so every run exercises the cross-checks, not just JSON parsing.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "core/checkpoint.h"

namespace {

namespace fs = std::filesystem;

void Write(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(s.data(), static_cast<std::streamsize>(s.size()));
}

// One U8 tensor "w" of 4 bytes.
std::string TinyShard() {
  std::string header = R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  std::string out;
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((n >> (8 * i)) & 0xff));
  return out + header + std::string("\x01\x02\x03\x04", 4);
}

struct Roots {
  fs::path sharded, x4t;
};

const Roots& MakeRoots() {
  static const Roots roots = [] {
    std::string tmpl = (fs::temp_directory_path() / "ckpt-fuzz-XXXXXX").string();
    fs::path base = ::mkdtemp(tmpl.data());
    Roots r{base / "sharded", base / "x4t"};
    fs::create_directories(r.sharded);
    fs::create_directories(r.x4t / "tensors");
    fs::create_directories(r.x4t / "metadata");
    Write(r.sharded / "model-00001-of-00001.safetensors", TinyShard());
    Write(r.x4t / "tensors/experts-00001.safetensors", TinyShard());
    Write(r.x4t / "metadata/config.json", "{}");
    return r;
  }();
  return roots;
}

void ResetDefaults(const Roots& r) {
  Write(r.sharded / "config.json", R"({"quantization_config":{"quant_method":"mxfp4"}})");
  Write(r.sharded / "model.safetensors.index.json",
        R"({"metadata":{"total_size":4},"weight_map":{"w":"model-00001-of-00001.safetensors"}})");
  Write(r.x4t / "manifest.json", R"({"shards":[{"file":"experts-00001.safetensors"}]})");
  Write(r.x4t / "build-contract.json",
        R"({"source_names":{"w":"experts-00001.safetensors"}})");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const Roots& r = MakeRoots();
  ResetDefaults(r);
  std::string body(reinterpret_cast<const char*>(data) + 1, size - 1);
  fs::path root;
  switch (data[0] & 3) {
    case 0: root = r.sharded; Write(root / "model.safetensors.index.json", body); break;
    case 1: root = r.sharded; Write(root / "config.json", body); break;
    case 2: root = r.x4t; Write(root / "manifest.json", body); break;
    default: root = r.x4t; Write(root / "build-contract.json", body); break;
  }
  absl::StatusOr<std::unique_ptr<ckpt::Checkpoint>> c = ckpt::Checkpoint::Open(root.string());
  if (c.ok()) {
    // An accepted root must be internally consistent: every listed tensor is findable.
    for (const std::string& name : (*c)->TensorNames()) {
      if (!(*c)->Find(name).has_value()) std::abort();
    }
  }
  return 0;
}
