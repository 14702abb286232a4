#include "core/evidence/trust_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/evidence/base64.h"

namespace ckpt::evidence {

absl::StatusOr<TrustStore> TrustStore::Load(const std::string& path) {
  constexpr off_t kMaxTrustFile = 1 << 20;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": trust file not found"));
  struct stat st;
  absl::Status refused;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    refused = absl::InvalidArgumentError(absl::StrCat(path, ": trust file is not a regular file"));
  } else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    // Whoever can write the trust file decides which signatures verify.
    refused = absl::PermissionDeniedError(absl::StrFormat(
        "%s: trust file is writable by group or others (mode %04o); chmod go-w it", path,
        st.st_mode & 07777));
  } else if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
    refused = absl::PermissionDeniedError(absl::StrCat(
        path, ": trust file is owned by uid ", st.st_uid, ", neither root nor this user"));
  } else if (st.st_size > kMaxTrustFile) {
    refused = absl::InvalidArgumentError(absl::StrCat(path, ": trust file is over 1 MiB"));
  }
  std::string text;
  if (refused.ok()) {
    text.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < text.size()) {
      ssize_t n = ::read(fd, text.data() + got, text.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    text.resize(got);
  }
  ::close(fd);
  if (!refused.ok()) return refused;
  return Parse(text, path);
}

absl::StatusOr<TrustStore> TrustStore::Parse(const std::string& text, const std::string& label) {
  TrustStore store;
  std::istringstream lines(text);
  std::string line;
  for (int n = 1; std::getline(lines, line); ++n) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream fields(line);
    std::string algo, b64, name;
    fields >> algo >> b64;
    std::getline(fields >> std::ws, name);
    if (algo != "ed25519") {
      return absl::InvalidArgumentError(
          absl::StrCat(label, ":", n, ": expected 'ed25519 <base64 public key> [name]'"));
    }
    auto raw = Base64Decode(b64);
    if (!raw.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ":", n, ": ", raw.status().message()));
    }
    auto key = PublicKey::FromRaw(*raw);
    if (!key.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ":", n, ": ", key.status().message()));
    }
    store.Add(*key);  // the name is for people reading the file
  }
  return store;
}

void TrustStore::Add(const PublicKey& key) {
  keys_.emplace(key.KeyId(), key);
}

const PublicKey* TrustStore::Find(const std::string& keyid) const {
  auto it = keys_.find(keyid);
  return it == keys_.end() ? nullptr : &it->second;
}

std::string TrustStore::Line(const PublicKey& key, const std::string& name) {
  std::string line = absl::StrCat("ed25519 ", Base64Encode(key.raw()));
  if (!name.empty()) absl::StrAppend(&line, " ", name);
  return line + "\n";
}

absl::Status TrustStore::AppendToFile(const std::string& path, const PublicKey& key,
                                      const std::string& name) {
  auto existing = Load(path);
  if (existing.ok() && existing->Find(key.KeyId()) != nullptr) return absl::OkStatus();
  if (!existing.ok() && !absl::IsNotFound(existing.status())) return existing.status();
  // Created 0644 whatever the umask: Load refuses a trust file that others can write.
  int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  std::string line = Line(key, name);
  bool written = fd >= 0 && ::write(fd, line.data(), line.size()) ==
                                static_cast<ssize_t>(line.size());
  if (fd >= 0) ::close(fd);
  if (!written) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write trust file"));
  return absl::OkStatus();
}

}  // namespace ckpt::evidence
