#include "core/fingerprint/partition.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "core/io/hf_layout.h"
#include "core/text/name_encoding.h"

namespace ckpt {
namespace {

using nlohmann::json;

absl::StatusOr<Digest> HexDigest(const std::string& hex) {
  Digest d{};
  if (!FromHex(hex, d)) return absl::InvalidArgumentError("digest is not 64 lower-case hex digits");
  return d;
}

// What one part claims about the files it hashed.
struct ParsedPart {
  PartSpec spec;
  std::string root;
  std::vector<FileFingerprint> files;
  std::vector<TensorFingerprint> tensors;
  uint64_t hashed_bytes = 0;
};

absl::StatusOr<ParsedPart> ParsePart(const json& j, size_t ordinal) {
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("fingerprint part #", ordinal, ": ", why));
  };
  ParsedPart p;
  try {
    p.spec.index = j.at("part").at("index").get<unsigned>();
    p.spec.count = j.at("part").at("count").get<unsigned>();
    p.root = j.at("root").get<std::string>();
    p.hashed_bytes = j.at("hashed_bytes").get<uint64_t>();
    if (j.at("manifest").at("serialization").at("method").get<std::string>() != "files") {
      return bad("only OMS files-mode parts can be merged");
    }
    for (const json& f : j.at("files")) {
      FileFingerprint ff;
      ff.path = f.at("path").get<std::string>();
      ff.size = f.at("size").get<uint64_t>();
      ff.tensor_count = f.at("tensors").get<size_t>();
      auto d = HexDigest(f.at("sha256").get<std::string>());
      if (!d.ok()) return bad(absl::StrCat(ff.path, ": ", d.status().message()));
      ff.sha256 = *d;
      p.files.push_back(std::move(ff));
    }
    for (const json& t : j.at("tensors")) {
      TensorFingerprint tf;
      tf.file = t.at("file").get<std::string>();
      tf.tensor = t.at("tensor").get<std::string>();
      tf.bytes = t.at("bytes").get<uint64_t>();
      auto d = HexDigest(t.at("sha256").get<std::string>());
      if (!d.ok()) return bad(absl::StrCat(tf.file, ":", tf.tensor, ": ", d.status().message()));
      tf.sha256 = *d;
      p.tensors.push_back(std::move(tf));
    }
  } catch (const json::exception& e) {
    return bad(absl::StrCat("not a fingerprint part: ", e.what()));
  }
  if (p.spec.count == 0 || p.spec.index >= p.spec.count) return bad("part index out of range");
  return p;
}

}  // namespace

std::vector<unsigned> AssignLargestFirst(const std::vector<uint64_t>& sizes, unsigned count) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<uint64_t> load(count, 0);
  std::vector<unsigned> part_of(sizes.size(), 0);
  for (size_t i : order) {
    const unsigned part = std::min_element(load.begin(), load.end()) - load.begin();
    load[part] += sizes[i];
    part_of[i] = part;
  }
  return part_of;
}

std::vector<TreeFile> FilesOfPart(const std::vector<TreeFile>& tree, const PartSpec& spec) {
  std::vector<uint64_t> sizes;
  for (const TreeFile& f : tree) sizes.push_back(f.size);
  const std::vector<unsigned> part_of = AssignLargestFirst(sizes, spec.count);
  std::vector<TreeFile> out;
  for (size_t i = 0; i < tree.size(); ++i) {
    if (part_of[i] == spec.index) out.push_back(tree[i]);
  }
  return out;
}

json FingerprintToJson(const Fingerprint& fp, const PartSpec* part) {
  json j;
  j["root"] = EncodeName(fp.root);
  if (part != nullptr) j["part"] = {{"index", part->index}, {"count", part->count}};
  j["hashed_bytes"] = fp.hashed_bytes;
  j["files"] = json::array();
  for (const FileFingerprint& f : fp.files) {
    json e = {{"path", f.path}, {"size", f.size}, {"tensors", f.tensor_count}};
    if (f.sha256) e["sha256"] = ToHex(*f.sha256);
    j["files"].push_back(std::move(e));
  }
  j["tensors"] = json::array();
  for (const TensorFingerprint& t : fp.tensors) {
    j["tensors"].push_back({{"file", t.file}, {"tensor", t.tensor}, {"bytes", t.bytes},
                            {"sha256", ToHex(t.sha256)}});
  }
  j["manifest"] = OmsManifestJson(fp.manifest);
  return j;
}

absl::StatusOr<Fingerprint> MergeFingerprintParts(const std::string& root,
                                                  const std::vector<json>& part_docs,
                                                  const TreeWalkOptions& walk) {
  // Listed by its layout, as the parts were (docs/hf-layouts.md).
  absl::StatusOr<LayoutListing> layout = ListLayout(root, LinkOptions{}, walk);
  if (!layout.ok()) return layout.status();
  const TreeListing* tree = &layout->listing;
  if (part_docs.empty()) return absl::InvalidArgumentError("no fingerprint parts to merge");
  std::vector<ParsedPart> parts;
  for (size_t i = 0; i < part_docs.size(); ++i) {
    auto p = ParsePart(part_docs[i], i);
    if (!p.ok()) return p.status();
    parts.push_back(*std::move(p));
  }
  const unsigned count = parts[0].spec.count;
  std::vector<bool> seen_index(count, false);
  std::map<std::string, std::pair<const FileFingerprint*, unsigned>> by_path;
  for (const ParsedPart& p : parts) {
    const std::string tree_root = EncodeName(tree->root_dir->label());
    if (p.spec.count != count || p.root != tree_root) {
      return absl::InvalidArgumentError(absl::StrCat(
          "fingerprint part ", p.spec.index, "/", p.spec.count, " of ", p.root,
          " does not belong with part 0.. of ", count, " parts of ", tree_root));
    }
    if (seen_index[p.spec.index]) {
      return absl::InvalidArgumentError(absl::StrCat("fingerprint part ", p.spec.index,
                                                     " given twice"));
    }
    seen_index[p.spec.index] = true;
    for (const FileFingerprint& f : p.files) {
      auto [it, inserted] = by_path.emplace(f.path, std::make_pair(&f, p.spec.index));
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("file ", f.path, " is in parts ",
                                                       it->second.second, " and ",
                                                       p.spec.index));
      }
    }
  }
  for (unsigned i = 0; i < count; ++i) {
    if (!seen_index[i]) {
      return absl::InvalidArgumentError(absl::StrCat("fingerprint part ", i, " of ", count,
                                                     " is missing"));
    }
  }
  Fingerprint fp;
  fp.root = tree->root_dir->label();
  std::vector<OmsResource> resources;
  for (const TreeFile& f : tree->files) {
    auto it = by_path.find(f.name);
    if (it == by_path.end()) {
      return absl::InvalidArgumentError(absl::StrCat("file ", f.name, " is in no part"));
    }
    const FileFingerprint& got = *it->second.first;
    if (got.size != f.size) {
      return absl::InvalidArgumentError(absl::StrCat("file ", f.name, " is ", f.size,
                                                     " bytes but part ", it->second.second,
                                                     " hashed ", got.size));
    }
    fp.files.push_back(got);
    resources.push_back({f.name, 0, f.size, *got.sha256});
    by_path.erase(it);
  }
  if (!by_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("file ", by_path.begin()->first,
                                                   " is in a part but not in the tree"));
  }
  std::map<std::string, size_t> file_rank;
  for (size_t i = 0; i < fp.files.size(); ++i) file_rank[fp.files[i].path] = i;
  for (ParsedPart& p : parts) {
    fp.hashed_bytes += p.hashed_bytes;
    for (TensorFingerprint& t : p.tensors) fp.tensors.push_back(std::move(t));
  }
  // Tensors by file in tree order; within a file they keep the part's (offset) order.
  std::stable_sort(fp.tensors.begin(), fp.tensors.end(),
                   [&](const TensorFingerprint& a, const TensorFingerprint& b) {
                     return file_rank[a.file] < file_rank[b.file];
                   });
  const std::string& label = tree->root_dir->label();
  std::string name = EncodeName(label.substr(label.find_last_of('/') + 1));
  fp.manifest = BuildOmsManifest(OmsMode::kFiles, 0, name, layout->walk.ignore_paths,
                                 std::move(resources));
  fp.manifest.allow_symlinks = !tree->links.empty();
  fp.layout = std::move(layout->layout);
  return fp;
}

}  // namespace ckpt
