// The one engine every command that reads tensor bytes runs (docs/audit-engine.md, "Checks and
// commands"): a checkpoint root, and optionally its source, read once in a bounded memory
// window, feeding a set of checks.
//
// Engine::Open reads the listing, small files and safetensors headers of both trees and opens
// the checkpoints; no tensor data is read yet. A Check then plans its units of work from those
// headers (Plan), and consumes their tensors when Engine::Run streams the data past (the units'
// `run`, on the stream's threads). After Run, each concrete check finishes into a typed result
// of its own (its Result()). A command is the set of checks it runs and what it prints or
// signs: audit runs them all, quant-check the scale window, verify-pair the pair comparison,
// forward the block forward.
#ifndef CKPT_CORE_AUDIT_ENGINE_H_
#define CKPT_CORE_AUDIT_ENGINE_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/io/hf_layout.h"
#include "core/io/tree_image.h"
#include "core/io/tree_stream.h"
#include "core/progress.h"

namespace ckpt::audit {

struct EngineOptions {
  std::string root;
  std::string source;  // empty (and no source_dir): one tree
  // When set, the engine reads through these already-opened directories (the daemon opens and
  // checks a root when a job is submitted) and `root` / `source` are not resolved again.
  std::shared_ptr<const io::Directory> root_dir, source_dir;
  LinkOptions links;  // generic trees; hub snapshots and local-dirs: docs/hf-layouts.md
  unsigned threads = 0;
  // Bytes of checkpoint data kept in memory at once (small files, headers and the tensors units
  // wait for), whatever the size of the trees: core/io/tree_stream.h.
  uint64_t memory_window = kDefaultMemoryWindow;
  bool file_digests = true;  // every file's SHA-256 (and the OMS manifest) from the same read
  // Every tensor's SHA-256 too: what a part of a split audit reports for the files it hashes,
  // so that the merge can check the ranges other parts read there (docs/audit-parts.md).
  bool tensor_digests = false;
};

// One tree's listing and headers: the first half of its one read.
struct TreeHeaders {
  std::shared_ptr<const TreeImage> image;
  TreeWalkOptions walk;  // the ignore_paths its fingerprint records
  LayoutInfo layout;
  std::shared_ptr<io::LinkResolver> resolver;  // what the listing's links resolved through
  // The checkpoint on those headers, or why the strict reader refused it (not an engine error:
  // the bytes were read consistently but break the format; the audit refuses such a tree,
  // AuditRun::Open, and the other commands report it their way).
  std::unique_ptr<Checkpoint> checkpoint;
  absl::Status checkpoint_status;
};

// The units a set of checks asks the stream to run, and the tensors they only need to see pass
// (sinks: hashed, never held). `key` orders ties in the stream's admission
// (docs/audit-engine.md, "Admission"): units of different checks on the same module share a
// key, so they run side by side; `last` units sort after every keyed one.
class WorkPlan {
 public:
  void Add(std::string key, StreamWork work) {
    keyed_.push_back({std::move(key), std::move(work)});
  }
  // `work.after` counts from the first `last` unit (last_count() before the first AddLast).
  void AddLast(StreamWork work) { last_.push_back(std::move(work)); }
  size_t last_count() const { return last_.size(); }
  void AddSink(StreamSink sink) { sinks_.push_back(std::move(sink)); }
  // A part of a split audit (core/audit/parts.h) keeps only the keyed units of its own keys and
  // no sink (what sinks compare, whole tensors' digests, the merge takes from the parts that
  // hash the files). Units added with AddLast cannot be split: FAILED_PRECONDITION.
  absl::Status KeepOnly(const std::function<bool(const std::string& key)>& keep);
  struct Keyed {
    std::string key;
    StreamWork work;
  };
  const std::vector<Keyed>& keyed() const { return keyed_; }
  // Adds to `work` the tensors of `ckpt` named in `names` (names it does not hold are skipped).
  static void Need(const Checkpoint& ckpt, const std::vector<std::string>& names,
                   StreamWork* work);

  struct Planned {
    std::vector<StreamWork> work;
    std::vector<StreamSink> sinks;
  };
  Planned Take() &&;

 private:
  std::vector<Keyed> keyed_;
  std::vector<StreamWork> last_;
  std::vector<StreamSink> sinks_;
};

// What a check plans from: both trees' checkpoints (null when absent or unreadable).
struct Checkpoints {
  const Checkpoint* root = nullptr;
  const Checkpoint* source = nullptr;
};

class Check {
 public:
  virtual ~Check() = default;
  // Adds this check's units to `plan`. The units' `run` may be called on any stream thread
  // until Engine::Run returns; they write only their own slots of the check's state.
  virtual absl::Status Plan(const Checkpoints& trees, WorkPlan& plan) = 0;
};

class Engine {
 public:
  // Errors: those of opening and listing the roots (NOT_FOUND, PERMISSION_DENIED,
  // INVALID_ARGUMENT), RESOURCE_EXHAUSTED when the small files and headers do not fit the
  // window, DATA_LOSS, CANCELLED.
  static absl::StatusOr<std::unique_ptr<Engine>> Open(const EngineOptions& options,
                                                      Progress& progress);

  bool has_source() const { return source_.has_value(); }
  const TreeHeaders& root() const { return root_; }
  const TreeHeaders& source() const { return *source_; }
  Checkpoints checkpoints() const {
    return {root_.checkpoint.get(), source_ ? source_->checkpoint.get() : nullptr};
  }

  // Plans every check, then reads the tensor data of both trees once (StreamTrees); the
  // returned images carry every file's digests. Afterwards each check's result is complete.
  // Errors: those of StreamTrees (RESOURCE_EXHAUSTED, DATA_LOSS, CANCELLED) and of a check's
  // planning or units. Run once.
  absl::StatusOr<StreamResult> Run(const std::vector<Check*>& checks, Progress& progress) const;
  // Run in two halves, for a split audit (core/audit/parts.h): each part plans every check, keeps
  // its own units and streams them, skimming the files other parts hash; the merge only plans.
  absl::StatusOr<WorkPlan> Plan(const std::vector<Check*>& checks) const;
  absl::StatusOr<StreamResult> Stream(WorkPlan plan, Progress& progress,
                                      const SkimFiles& skim = {}) const;
  // The trees' images as read by Open (headers and small files), root first.
  std::vector<std::shared_ptr<const TreeImage>> images() const;

  // DATA_LOSS naming the first file of either tree whose name no longer leads to what was read.
  absl::Status CheckUnchanged(const StreamResult& streamed) const;

 private:
  Engine() = default;
  ReadOptions read_;
  TreeHeaders root_;
  std::optional<TreeHeaders> source_;
};

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_ENGINE_H_
