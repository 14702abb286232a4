#include "core/interop/transcode_provenance.h"

#include <sys/stat.h>

#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/audit/audit_checks.h"
#include "core/checkpoint.h"
#include "core/fingerprint/tree_walk.h"
#include "core/interop/tree_subjects.h"

namespace ckpt::interop {
namespace {

// What changes when a file is rewritten, replaced or touched.
struct FileStamp {
  std::string path;
  uint64_t size, dev, ino;
  int64_t mtime_ns, ctime_ns;
  bool operator==(const FileStamp&) const = default;
};

absl::StatusOr<std::vector<FileStamp>> Stamps(const std::string& root) {
  auto listing = ListTree(root);
  if (!listing.ok()) return listing.status();
  std::vector<FileStamp> out;
  for (const TreeFile& f : listing->files) {
    struct stat st;
    if (::lstat(f.absolute.c_str(), &st) != 0) {
      return absl::DataLossError(absl::StrCat(f.absolute, ": vanished during the transcode"));
    }
    out.push_back({f.path, static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_dev),
                   static_cast<uint64_t>(st.st_ino),
                   st.st_mtim.tv_sec * 1'000'000'000LL + st.st_mtim.tv_nsec,
                   st.st_ctim.tv_sec * 1'000'000'000LL + st.st_ctim.tv_nsec});
  }
  return out;
}

}  // namespace

std::string DefaultProvenancePath(const std::string& output) {
  std::string base = output;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + ".intoto.jsonl";
}

absl::StatusOr<ProvenancedTranscode> TranscodeWithProvenance(const std::string& source,
                                                             const std::string& output,
                                                             const quant::TranscodeOptions& options,
                                                             const std::string& source_ref,
                                                             Progress& progress) {
  ProvenancedTranscode out;
  evidence::TranscodeProvenance& p = out.provenance;
  p.started_at = evidence::Rfc3339Now();
  p.environment = evidence::CollectEnvironment();
  auto src_root = RealPath(source);
  if (!src_root.ok()) return src_root.status();
  auto before = Stamps(*src_root);
  if (!before.ok()) return before.status();
  auto src_subjects = TreeSubjects(*src_root, options.threads, progress);
  if (!src_subjects.ok()) return src_subjects.status();
  auto ckpt = Checkpoint::Open(*src_root);
  if (!ckpt.ok()) return ckpt.status();
  auto result = quant::TranscodeToNvfp4(**ckpt, output, options, progress);
  if (!result.ok()) return result.status();
  auto after = Stamps(*src_root);
  if (!after.ok()) return after.status();
  if (*after != *before) {
    return absl::DataLossError(absl::StrCat(
        *src_root, ": the source changed during the transcode; ", output,
        " was written but no provenance is, because it could not name the bytes that were read"));
  }
  auto out_root = RealPath(output);
  if (!out_root.ok()) return out_root.status();
  auto dst_subjects = TreeSubjects(*out_root, options.threads, progress);
  if (!dst_subjects.ok()) return dst_subjects.status();
  p.source = *std::move(src_subjects);
  p.derived = *std::move(dst_subjects);
  p.source_ref = source_ref;
  p.target_format = "nvfp4";
  p.policy = audit::PolicyRefOf(options.policy);
  p.source_path = *src_root;
  p.output_path = *out_root;
  p.finished_at = evidence::Rfc3339Now();
  out.result = *std::move(result);
  return out;
}

}  // namespace ckpt::interop
