#include "core/evidence/trust_store.h"

#include <fcntl.h>
#include <unistd.h>

#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/base64.h"
#include "core/io/small_file.h"

namespace ckpt::evidence {

absl::StatusOr<TrustStore> TrustStore::Load(const std::string& path) {
  io::SmallFileRules rules;
  rules.what = "trust file";
  rules.forbidden_mode = 022;  // whoever can write the trust file decides what verifies
  rules.owner_root_or_self = true;
  absl::StatusOr<std::string> text = io::ReadSmallFile(path, rules);
  if (!text.ok()) return text.status();
  return Parse(*text, path);
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
