#include "core/evidence/trust_store.h"

#include <fstream>
#include <iterator>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/base64.h"

namespace ckpt::evidence {

absl::StatusOr<TrustStore> TrustStore::Load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": trust file not found"));
  std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
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
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << Line(key, name);
  out.flush();
  if (!out) return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write trust file"));
  return absl::OkStatus();
}

}  // namespace ckpt::evidence
