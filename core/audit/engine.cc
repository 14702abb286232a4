#include "core/audit/engine.h"

#include <algorithm>
#include <utility>

namespace ckpt::audit {
namespace {

// The first half of a tree's one read: listing (by its layout, docs/hf-layouts.md), small
// files and safetensors headers; the tensor data is left for StreamTrees.
absl::StatusOr<TreeHeaders> ReadHeaders(const std::string& path,
                                        std::shared_ptr<const io::Directory> dir,
                                        const LinkOptions& links, const ReadOptions& read,
                                        Progress& progress) {
  // A path names a directory or, audited as a one-file checkpoint, a .safetensors file.
  absl::StatusOr<LayoutListing> listing =
      dir == nullptr ? ListLayout(path, links) : ListLayout(std::move(dir), links);
  if (!listing.ok()) return listing.status();
  auto image = ReadTree(std::move(listing->listing), read, progress);
  if (!image.ok()) return image.status();
  TreeHeaders h{*image, std::move(listing->walk), std::move(listing->layout),
                std::move(listing->resolver), nullptr, absl::OkStatus()};
  auto ckpt = Checkpoint::Open(*std::move(image));
  if (ckpt.ok()) {
    h.checkpoint = *std::move(ckpt);
  } else {
    h.checkpoint_status = ckpt.status();
  }
  return h;
}

}  // namespace

void WorkPlan::Need(const Checkpoint& ckpt, const std::vector<std::string>& names,
                    StreamWork* work) {
  for (const std::string& n : names) {
    if (std::optional<TensorRef> t = ckpt.Find(n)) work->tensors.push_back({t->file, t->info});
  }
}

absl::Status WorkPlan::KeepOnly(const std::function<bool(const std::string& key)>& keep) {
  if (!last_.empty()) {
    return absl::FailedPreconditionError(
        "the block forward's units depend on each other and cannot be split into parts");
  }
  std::erase_if(keyed_, [&](const Keyed& k) { return !keep(k.key); });
  sinks_.clear();
  return absl::OkStatus();
}

WorkPlan::Planned WorkPlan::Take() && {
  std::stable_sort(keyed_.begin(), keyed_.end(),
                   [](const Keyed& a, const Keyed& b) { return a.key < b.key; });
  Planned out;
  out.work.reserve(keyed_.size() + last_.size());
  for (Keyed& k : keyed_) out.work.push_back(std::move(k.work));
  for (StreamWork& w : last_) {  // their `after` now counts from the start of the whole list
    for (size_t& a : w.after) a += keyed_.size();
    out.work.push_back(std::move(w));
  }
  out.sinks = std::move(sinks_);
  return out;
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Open(const EngineOptions& options,
                                                     Progress& progress) {
  std::unique_ptr<Engine> e(new Engine());
  e->read_.keep = ReadOptions::Keep::kStreamTensorData;
  e->read_.threads = options.threads;
  e->read_.memory_window = options.memory_window;
  e->read_.file_digests = options.file_digests;
  // Records name files and the manifest ROOT, not tensors; a split audit's parts name tensors.
  e->read_.tensor_digests = options.tensor_digests;
  auto root = ReadHeaders(options.root, options.root_dir, options.links, e->read_, progress);
  if (!root.ok()) return root.status();
  e->root_ = *std::move(root);
  if (!options.source.empty() || options.source_dir != nullptr) {
    // Both trees share one window: the source's small files and headers count after the root's.
    ReadOptions read = e->read_;
    read.window_in_use = e->root_.image->kept_bytes;
    auto source = ReadHeaders(options.source, options.source_dir, options.links, read, progress);
    if (!source.ok()) return source.status();
    e->source_ = *std::move(source);
  }
  return e;
}

absl::StatusOr<StreamResult> Engine::Run(const std::vector<Check*>& checks,
                                         Progress& progress) const {
  absl::StatusOr<WorkPlan> plan = Plan(checks);
  if (!plan.ok()) return plan.status();
  return Stream(*std::move(plan), progress);
}

absl::StatusOr<WorkPlan> Engine::Plan(const std::vector<Check*>& checks) const {
  WorkPlan plan;
  for (Check* c : checks) {
    if (absl::Status s = c->Plan(checkpoints(), plan); !s.ok()) return s;
  }
  return plan;
}

absl::StatusOr<StreamResult> Engine::Stream(WorkPlan plan, Progress& progress,
                                            const SkimFiles& skim) const {
  WorkPlan::Planned planned = std::move(plan).Take();
  return StreamTrees(images(), std::move(planned.work), read_, progress,
                     std::move(planned.sinks), skim);
}

std::vector<std::shared_ptr<const TreeImage>> Engine::images() const {
  std::vector<std::shared_ptr<const TreeImage>> images = {root_.image};
  if (source_) images.push_back(source_->image);
  return images;
}

absl::Status Engine::CheckUnchanged(const StreamResult& streamed) const {
  for (const auto& image : streamed.images) {
    if (absl::Status s = image->CheckUnchanged(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace ckpt::audit
