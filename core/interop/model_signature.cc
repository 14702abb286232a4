#include "core/interop/model_signature.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "absl/strings/str_cat.h"
#include "core/fingerprint/fingerprint.h"

namespace ckpt::interop {
namespace {

namespace fs = std::filesystem;
using evidence::OmsError;
using evidence::OmsReason;

constexpr size_t kMaxListedDifferences = 20;

std::vector<std::string> WithGitDefaults(std::vector<std::string> paths) {
  for (const std::string& p : TreeWalkOptions{}.ignore_paths) {
    if (std::find(paths.begin(), paths.end(), p) == paths.end()) paths.push_back(p);
  }
  return paths;
}

absl::StatusOr<Fingerprint> HashFiles(const std::string& root,
                                      const std::vector<std::string>& ignore, unsigned threads,
                                      Progress& progress) {
  FingerprintOptions fo;
  fo.threads = threads;
  fo.manifest_mode = OmsMode::kFiles;
  fo.tensor_digests = false;  // any directory can be signed, not only valid checkpoints
  fo.walk.ignore_paths = ignore;
  return FingerprintTree(root, fo, progress);
}

// Compares the signed resources with the files on disk; one line per difference.
std::vector<std::string> Differences(const evidence::OmsStatement& st, const Fingerprint& fp) {
  std::map<std::string, std::pair<std::string, std::string>> signed_set, disk;
  for (const auto& r : st.resources) signed_set[r.name] = {r.algorithm, r.digest};
  for (const OmsResource& r : fp.manifest.resources) {
    disk[fp.manifest.ResourceName(r)] = {fp.manifest.Algorithm(), ToHex(r.digest)};
  }
  std::vector<std::string> out;
  for (const auto& [name, want] : signed_set) {
    auto it = disk.find(name);
    if (it == disk.end()) {
      out.push_back(absl::StrCat("removed: ", name, " is signed but not on disk"));
    } else if (it->second != want) {
      out.push_back(absl::StrCat("changed: ", name, " (signed ", want.first, ":", want.second,
                                 ", on disk ", it->second.first, ":", it->second.second, ")"));
    }
  }
  for (const auto& [name, _] : disk) {
    if (!signed_set.count(name)) out.push_back(absl::StrCat("added: ", name, " is not signed"));
  }
  return out;
}

// Verifies the bundle's signature (key or chain) and returns the signed statement in `check`.
void OpenSignature(const evidence::OmsBundle& bundle, const ModelTrust& trust,
                   ModelSignatureCheck* check) {
  std::optional<evidence::EcdsaPublicKey> key;
  if (bundle.material == evidence::OmsBundle::Material::kPublicKey) {
    if (!trust.public_key) {
      check->failure = OmsError{OmsReason::kUnsupportedBundle,
                                "the bundle is signed with a bare key: verify it with a public key"};
      return;
    }
    key = trust.public_key;
    check->signer = absl::StrCat("key ", key->Hint());
    if (bundle.key_hint.empty()) {
      check->notes.push_back(
          bundle.legacy_public_key
              ? "older bundle layout (publicKey.rawBytes/keyDetails, no hint): the embedded key "
                "is ignored; the given key is used, as model_signing does"
              : "the bundle carries no public-key hint");
    }
  } else {
    if (!trust.certificates) {
      check->failure = OmsError{
          OmsReason::kUnsupportedBundle,
          "the bundle is signed with a certificate chain: verify it with --certificate-chain"};
      return;
    }
    auto cert = trust.certificates->VerifySigningCertificate(bundle.certificates);
    if (!cert.ok()) {
      check->failure = OmsError{cert.status().code() == absl::StatusCode::kInvalidArgument
                                    ? OmsReason::kMalformedBundle
                                    : OmsReason::kCertificateInvalid,
                                std::string(cert.status().message())};
      return;
    }
    key = cert->key;
    check->signer = absl::StrCat("certificate ", cert->subject, " (issuer ", cert->issuer, ")");
  }
  check->failure = evidence::OpenOmsBundle(bundle, *key, &check->statement);
}

}  // namespace

std::vector<std::string> RelativeIgnorePaths(const std::string& root,
                                             const std::vector<std::string>& paths) {
  std::error_code ec;
  fs::path base = fs::weakly_canonical(fs::absolute(root, ec), ec);
  std::vector<std::string> out;
  for (const std::string& p : paths) {
    fs::path candidate = fs::weakly_canonical(fs::absolute(p, ec), ec);
    if (ec) continue;
    fs::path rel = candidate.lexically_relative(base);
    std::string s = rel.generic_string();
    if (rel.empty() || s == "." || s.rfind("..", 0) == 0) continue;
    out.push_back(s);
  }
  return out;
}

absl::StatusOr<evidence::OmsStatement> ModelStatement(const std::string& root,
                                                      const ModelSigningOptions& options,
                                                      Progress& progress) {
  std::vector<std::string> ignore = WithGitDefaults(options.ignore_paths);
  auto fp = HashFiles(root, ignore, options.threads, progress);
  if (!fp.ok()) return fp.status();
  evidence::OmsStatement st;
  st.model_name = fp->manifest.model_name;
  st.root_sha256 = fp->manifest.RootHex();
  st.ignore_paths = ignore;
  for (const OmsResource& r : fp->manifest.resources) {
    st.resources.push_back({fp->manifest.ResourceName(r), fp->manifest.Algorithm(),
                            ToHex(r.digest)});
  }
  return st;
}

absl::StatusOr<std::string> SignModel(const std::string& root, const evidence::EcdsaSigningKey& key,
                                      const ModelSigningOptions& options, Progress& progress) {
  auto st = ModelStatement(root, options, progress);
  if (!st.ok()) return st.status();
  return evidence::SignOmsKeyBundle(evidence::OmsStatementPayload(*st), key);
}

absl::StatusOr<ModelSignatureCheck> VerifyModelSignature(const std::string& root,
                                                         const std::string& bundle_text,
                                                         const ModelTrust& trust,
                                                         const ModelSigningOptions& options,
                                                         Progress& progress) {
  if (!trust.public_key && !trust.certificates) {
    return absl::InvalidArgumentError("give a public key or trusted certificates");
  }
  ModelSignatureCheck check;
  evidence::OmsBundle bundle;
  if ((check.failure = evidence::ParseOmsBundle(bundle_text, &bundle))) return check;
  OpenSignature(bundle, trust, &check);
  if (check.failure) return check;
  const evidence::OmsStatement& st = check.statement;
  if (st.method != "files" || st.hash_type != "sha256") {
    check.failure = OmsError{OmsReason::kUnsupportedBundle,
                             absl::StrCat("serialization method '", st.method, "' with hash '",
                                          st.hash_type, "': only files / sha256 is re-hashed "
                                          "here, as model_signing verify does")};
    return check;
  }
  std::vector<std::string> ignore = options.ignore_paths;
  for (const std::string& p : st.ignore_paths.value_or(std::vector<std::string>{})) {
    ignore.push_back(p);
  }
  auto fp = HashFiles(root, WithGitDefaults(ignore), options.threads, progress);
  if (!fp.ok()) return fp.status();
  if (fp->manifest.model_name != st.model_name) {
    check.notes.push_back(absl::StrCat("signed model name '", st.model_name, "', directory '",
                                       fp->manifest.model_name, "' (informative only)"));
  }
  std::vector<std::string> diffs = Differences(st, *fp);
  if (!diffs.empty()) {
    check.failure = OmsError{OmsReason::kFilesDiffer,
                             absl::StrCat(diffs.size(), " difference(s) between the signed "
                                          "manifest and ", fp->root)};
    if (diffs.size() > kMaxListedDifferences) diffs.resize(kMaxListedDifferences);
    check.differences = std::move(diffs);
  }
  return check;
}

}  // namespace ckpt::interop
