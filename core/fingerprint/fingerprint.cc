#include "core/fingerprint/fingerprint.h"

#include <algorithm>
#include <condition_variable>
#include <limits>
#include <memory>
#include <mutex>

#include "core/fingerprint/partition.h"
#include "core/mapped_file.h"
#include "core/parallel.h"
#include "core/safetensors.h"
#include "core/text/name_encoding.h"

namespace ckpt {
namespace {

// Bytes hashed between progress reports, pacing checks and readahead hints.
constexpr uint64_t kChunk = 8ull << 20;
// Small tensors are hashed in batches of about this many bytes to keep task overhead low.
constexpr uint64_t kTensorBatch = 4ull << 20;
constexpr uint64_t kDone = std::numeric_limits<uint64_t>::max();
// Files mapped at once: keeps a tree of any size under the kernel's limit on mappings
// (vm.max_map_count, 65530 by default) while giving the pool many files to spread over.
constexpr size_t kFilesPerBatch = 4096;

struct OpenedFile {
  TreeFile entry;
  std::unique_ptr<MappedFile> map;
  uint64_t data_start = 0;
  std::vector<TensorInfo> tensors;  // safetensors files only, sorted by offset
  size_t first_tensor = 0;          // index of tensors[0] in the flat tensor output
};

// Where each file's whole-file digest has got to. Range hashing of a file waits until it is
// within `window` bytes of that position, so both passes read the same pages while they are in
// the page cache instead of reading a file larger than memory twice from disk.
class Pacer {
 public:
  Pacer(size_t files, uint64_t window) : pos_(files, kDone), window_(window) {}
  void Start(size_t file) { pos_[file] = 0; }  // before any task runs
  void Set(size_t file, uint64_t pos) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      pos_[file] = pos;
    }
    cv_.notify_all();
  }
  void WaitFor(size_t file, uint64_t offset) {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t needed = offset > window_ ? offset - window_ : 0;  // no pos + window overflow
    cv_.wait(lock, [&] { return pos_[file] >= needed; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> pos_;  // guarded by mu_
  const uint64_t window_;
};

struct Task {
  enum Kind { kWholeFile, kTensors, kShard } kind;
  size_t file;
  uint64_t begin, end;  // file offsets this task hashes
  size_t first, last;   // kTensors: [first, last) in OpenedFile::tensors; kShard: resource index
};

class Hasher {
 public:
  Hasher(std::vector<OpenedFile>& files, Pacer& pacer, Progress& progress)
      : files_(files), pacer_(pacer), progress_(progress) {}

  // SHA-256 of [begin, end) of `file`. Range passes (`paced`) wait for the whole-file pass;
  // the whole-file pass publishes its position instead.
  Digest Hash(size_t file, uint64_t begin, uint64_t end, bool paced, bool whole) {
    const MappedFile& map = *files_[file].map;
    Sha256 h;
    for (uint64_t pos = begin; pos < end;) {
      uint64_t n = std::min(kChunk, end - pos);
      if (paced) pacer_.WaitFor(file, pos + n);
      map.WillNeed(pos + n, kChunk);
      h.Update(map.bytes().subspan(pos, n));
      pos += n;
      if (whole) pacer_.Set(file, pos);
      progress_.Advance(n);
    }
    if (whole) pacer_.Set(file, kDone);
    return h.Finish();
  }

 private:
  std::vector<OpenedFile>& files_;
  Pacer& pacer_;
  Progress& progress_;
};

absl::Status CheckOptions(const FingerprintOptions& o) {
  if (o.manifest_mode == OmsMode::kFiles && !o.file_digests) {
    return absl::InvalidArgumentError("fingerprint: files-mode manifest needs file digests");
  }
  if (o.part.count == 0 || o.part.index >= o.part.count) {
    return absl::InvalidArgumentError("fingerprint: part index must be below the part count");
  }
  if (o.part.count > 1 && o.manifest_mode != OmsMode::kFiles) {
    return absl::InvalidArgumentError("fingerprint: parts are supported in files mode only");
  }
  if (o.manifest_mode == OmsMode::kShards && o.shard_size == 0) {
    return absl::InvalidArgumentError("fingerprint: shard size must be positive");
  }
  return absl::OkStatus();
}

bool IsSafetensors(const std::string& path) {
  constexpr std::string_view kExt = ".safetensors";
  return path.size() >= kExt.size() &&
         path.compare(path.size() - kExt.size(), kExt.size(), kExt) == 0;
}

absl::StatusOr<std::vector<OpenedFile>> OpenAll(std::vector<TreeFile> tree,
                                                const FingerprintOptions& options) {
  std::vector<OpenedFile> files;
  size_t tensors = 0;
  for (TreeFile& entry : tree) {
    absl::StatusOr<std::unique_ptr<MappedFile>> map = MappedFile::Open(entry.absolute);
    if (!map.ok()) return map.status();
    OpenedFile f;
    f.entry = std::move(entry);
    f.map = *std::move(map);
    f.entry.size = f.map->size();  // the mapped size is what gets hashed
    if (options.tensor_digests && IsSafetensors(f.entry.path)) {
      absl::StatusOr<SafetensorsHeader> header =
          ParseSafetensorsHeader(f.map->bytes(), f.map->size(), f.map->path());
      if (!header.ok()) return header.status();
      f.data_start = 8 + header->header_len;
      f.tensors = std::move(header->tensors);
      f.first_tensor = tensors;
      tensors += f.tensors.size();
    }
    files.push_back(std::move(f));
  }
  return files;
}

// Whole-file tasks first, longest first, so that every one has started before any range task
// can wait on it (ParallelFor hands out indices in order: no range task blocks a whole-file
// task from starting). Range tasks follow in offset order so that all files advance together.
std::vector<Task> PlanTasks(const std::vector<OpenedFile>& files,
                            const FingerprintOptions& options, Pacer& pacer,
                            std::vector<OmsResource>* shards) {
  std::vector<Task> whole, ranges;
  for (size_t i = 0; i < files.size(); ++i) {
    const OpenedFile& f = files[i];
    if (options.file_digests) {
      whole.push_back({Task::kWholeFile, i, 0, f.entry.size, 0, 0});
      pacer.Start(i);
    }
    for (size_t t = 0; t < f.tensors.size();) {
      size_t last = t;
      uint64_t begin = f.data_start + f.tensors[t].begin, end = begin;
      while (last < f.tensors.size() && (last == t || end - begin < kTensorBatch)) {
        end = f.data_start + f.tensors[last].end;
        ++last;
      }
      ranges.push_back({Task::kTensors, i, begin, end, t, last});
      t = last;
    }
    if (options.manifest_mode == OmsMode::kShards) {
      for (auto [start, end] : OmsShardRanges(f.entry.size, options.shard_size)) {
        ranges.push_back({Task::kShard, i, start, end, shards->size(), 0});
        shards->push_back({f.entry.name, start, end, {}});
      }
    }
  }
  std::stable_sort(whole.begin(), whole.end(),
                   [](const Task& a, const Task& b) { return a.end > b.end; });
  std::stable_sort(ranges.begin(), ranges.end(),
                   [](const Task& a, const Task& b) { return a.begin < b.begin; });
  whole.insert(whole.end(), ranges.begin(), ranges.end());
  return whole;
}

std::string BaseName(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Hashes one batch of files (all mapped at once) and appends its results to `fp`; file
// digests go to `resources` in files mode, shard digests in shards mode.
absl::Status HashBatch(std::vector<TreeFile> batch, const FingerprintOptions& options,
                       Progress& progress, Fingerprint* fp,
                       std::vector<OmsResource>* resources) {
  absl::StatusOr<std::vector<OpenedFile>> opened = OpenAll(std::move(batch), options);
  if (!opened.ok()) return opened.status();
  std::vector<OpenedFile>& files = *opened;
  // The tensor pass never reads a header; count it as done so the bar ends at 100%.
  for (const OpenedFile& f : files) progress.Advance(f.data_start);

  Pacer pacer(files.size(), options.readahead_window);
  std::vector<OmsResource> shards;
  std::vector<Task> tasks = PlanTasks(files, options, pacer, &shards);
  std::vector<Digest> file_digests(files.size());
  size_t tensor_count = 0;
  for (const OpenedFile& f : files) tensor_count += f.tensors.size();
  std::vector<Digest> tensor_digests(tensor_count);
  for (const Task& t : tasks) fp->hashed_bytes += t.end - t.begin;

  Hasher hasher(files, pacer, progress);
  absl::Status run = ParallelFor(tasks.size(), options.threads, [&](size_t i) {
    const Task& t = tasks[i];
    const OpenedFile& f = files[t.file];
    switch (t.kind) {
      case Task::kWholeFile:
        file_digests[t.file] = hasher.Hash(t.file, 0, f.entry.size, false, true);
        break;
      case Task::kTensors:
        for (size_t k = t.first; k < t.last; ++k) {
          tensor_digests[f.first_tensor + k] =
              hasher.Hash(t.file, f.data_start + f.tensors[k].begin,
                          f.data_start + f.tensors[k].end, true, false);
        }
        break;
      case Task::kShard:
        shards[t.first].digest = hasher.Hash(t.file, t.begin, t.end, true, false);
        break;
    }
    return absl::OkStatus();
  });
  if (!run.ok()) return run;
  for (const OpenedFile& f : files) {
    if (absl::Status s = f.map->CheckUnchanged(); !s.ok()) return s;
  }

  for (size_t i = 0; i < files.size(); ++i) {
    const OpenedFile& f = files[i];
    FileFingerprint out{f.entry.name, f.entry.size, std::nullopt, f.tensors.size()};
    if (options.file_digests) {
      out.sha256 = file_digests[i];
      if (options.manifest_mode == OmsMode::kFiles) {
        resources->push_back({f.entry.name, 0, f.entry.size, file_digests[i]});
      }
    }
    fp->files.push_back(std::move(out));
    for (size_t k = 0; k < f.tensors.size(); ++k) {
      fp->tensors.push_back({f.entry.name, EncodeName(f.tensors[k].name),
                             f.tensors[k].num_bytes(), tensor_digests[f.first_tensor + k]});
    }
  }
  resources->insert(resources->end(), shards.begin(), shards.end());
  return absl::OkStatus();
}

// Bytes the progress bar counts for a file: one pass per kind of digest taken of it.
uint64_t PlannedBytes(const TreeFile& f, const FingerprintOptions& o) {
  int passes = (o.file_digests ? 1 : 0) + (o.manifest_mode == OmsMode::kShards ? 1 : 0) +
               (o.tensor_digests && IsSafetensors(f.path) ? 1 : 0);
  return f.size * passes;
}

}  // namespace

absl::StatusOr<Fingerprint> FingerprintTree(const std::string& root,
                                            const FingerprintOptions& options,
                                            Progress& progress) {
  if (absl::Status s = CheckOptions(options); !s.ok()) return s;
  absl::StatusOr<TreeListing> tree = ListTree(root, options.walk);
  if (!tree.ok()) return tree.status();
  if (options.part.count > 1) tree->files = FilesOfPart(tree->files, options.part);
  Fingerprint fp;
  fp.root = tree->root;
  uint64_t planned = 0;
  for (const TreeFile& f : tree->files) planned += PlannedBytes(f, options);

  progress.Begin("fingerprint", planned);
  std::vector<OmsResource> resources;
  const std::vector<TreeFile>& all = tree->files;
  for (size_t b = 0; b < all.size(); b += kFilesPerBatch) {
    std::vector<TreeFile> batch(all.begin() + b,
                                all.begin() + std::min(all.size(), b + kFilesPerBatch));
    absl::Status s = HashBatch(std::move(batch), options, progress, &fp, &resources);
    if (!s.ok()) {
      progress.End();
      return s;
    }
  }
  progress.End();
  fp.manifest = BuildOmsManifest(options.manifest_mode, options.shard_size,
                                 EncodeName(BaseName(fp.root)),
                                 options.walk.ignore_paths, std::move(resources));
  return fp;
}

}  // namespace ckpt
