// A file-system seam for tests (core/io/file_system.h): wraps real directories and runs a hook
// after every read of a chosen file, so a test can rewrite, truncate or rename files between
// any two reads of an audit, deterministically, without sleeps.
#ifndef CKPT_TESTS_AUDIT_FAULT_FS_H_
#define CKPT_TESTS_AUDIT_FAULT_FS_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/io/file_system.h"

namespace ckpt::testing {

// The hooks run on the reading thread, unlocked: a file's cursor and a read ahead or behind it
// may read it on two threads at once, so a hook that records guards its own container.
//
// Called after each successful Read of a file named `name` (last path component; empty: every
// file), with how many reads of it have completed so far.
struct ReadHook {
  std::string name;
  std::function<void(int reads_done)> after_read;
  // When set, also called after each successful Read with its offset and length.
  std::function<void(uint64_t offset, size_t length)> after_read_at = nullptr;
  // When set, called when the reader lets the kernel drop a range from its page cache.
  std::function<void(uint64_t offset, uint64_t length)> consumed = nullptr;
  // When set, the identity reported for the file (by StatAt and by its open file's Identity),
  // given the real one: a test can make a file whose bytes changed look unchanged.
  std::function<io::FileIdentity(const io::FileIdentity& real)> identity = nullptr;
  // When set, called before each Read with its offset and length: an error it returns is the
  // Read's (an I/O error of the device), and the read does not happen.
  std::function<absl::Status(uint64_t offset, size_t length)> fail_read = nullptr;
};

class FaultFile final : public io::RandomAccessFile {
 public:
  FaultFile(std::unique_ptr<io::RandomAccessFile> inner, const ReadHook* hook)
      : inner_(std::move(inner)), hook_(hook) {}
  absl::StatusOr<size_t> Read(uint64_t offset, std::span<uint8_t> out) const override {
    if (hook_ != nullptr && hook_->fail_read) {
      if (absl::Status st = hook_->fail_read(offset, out.size()); !st.ok()) return st;
    }
    absl::StatusOr<size_t> n = inner_->Read(offset, out);
    if (n.ok() && hook_ != nullptr) {
      hook_->after_read(++reads_);
      if (hook_->after_read_at) hook_->after_read_at(offset, *n);
    }
    return n;
  }
  absl::StatusOr<io::FileIdentity> Identity() const override {
    absl::StatusOr<io::FileIdentity> id = inner_->Identity();
    if (id.ok() && hook_ != nullptr && hook_->identity) return hook_->identity(*id);
    return id;
  }
  void Consumed(uint64_t offset, uint64_t length) const override {
    if (hook_ != nullptr && hook_->consumed) hook_->consumed(offset, length);
    inner_->Consumed(offset, length);
  }

 private:

  std::unique_ptr<io::RandomAccessFile> inner_;
  const ReadHook* hook_;
  mutable std::atomic<int> reads_ = 0;
};

class FaultDirectory final : public io::Directory {
 public:
  FaultDirectory(std::unique_ptr<io::Directory> inner, std::shared_ptr<const ReadHook> hook)
      : inner_(std::move(inner)), hook_(std::move(hook)) {}

  // Opens `path` on the real file system, wrapped.
  static std::shared_ptr<const io::Directory> Open(const std::string& path, ReadHook hook) {
    auto dir = io::RealFileSystem().OpenRoot(path);
    if (!dir.ok()) return nullptr;
    return std::make_shared<FaultDirectory>(*std::move(dir),
                                            std::make_shared<const ReadHook>(std::move(hook)));
  }

  absl::StatusOr<std::unique_ptr<io::RandomAccessFile>> OpenFile(
      const std::string& name) const override {
    auto f = inner_->OpenFile(name);
    if (!f.ok()) return f.status();
    const bool hooked = hook_->name.empty() || name == hook_->name;
    return std::make_unique<FaultFile>(*std::move(f), hooked ? hook_.get() : nullptr);
  }
  absl::StatusOr<std::unique_ptr<io::Directory>> OpenDirectory(
      const std::string& name) const override {
    auto d = inner_->OpenDirectory(name);
    if (!d.ok()) return d.status();
    return std::make_unique<FaultDirectory>(*std::move(d), hook_);
  }
  absl::StatusOr<std::vector<io::DirEntry>> List() const override { return inner_->List(); }
  absl::StatusOr<io::FileIdentity> StatAt(const std::string& name) const override {
    absl::StatusOr<io::FileIdentity> id = inner_->StatAt(name);
    if (id.ok() && name == hook_->name && hook_->identity) return hook_->identity(*id);
    return id;
  }
  absl::StatusOr<io::FileIdentity> Identity() const override { return inner_->Identity(); }
  absl::StatusOr<std::string> ReadLink(const std::string& name) const override {
    return inner_->ReadLink(name);
  }
  absl::StatusOr<std::unique_ptr<io::Directory>> OpenParent() const override {
    auto d = inner_->OpenParent();
    if (!d.ok()) return d.status();
    return std::make_unique<FaultDirectory>(*std::move(d), hook_);
  }
  const std::string& label() const override { return inner_->label(); }

 private:
  std::unique_ptr<io::Directory> inner_;
  std::shared_ptr<const ReadHook> hook_;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_AUDIT_FAULT_FS_H_
