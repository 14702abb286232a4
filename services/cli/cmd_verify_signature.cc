// `ckpt-audit verify-signature ROOT --signature SIG (--public-key PEM | --certificate-chain
// PEM...) [--ignore-paths P...]`: checks an OpenSSF model signing (OMS v1.0) signature, made by
// `model_signing sign key|certificate` or `ckpt-audit sign`, against the files under ROOT
// (docs/interop.md). Exit 0 verified, 1 not verified (with a named reason), 2 invalid input: an
// unreadable or malformed signature, key or certificate file, or a bundle of a kind this tool
// does not check (keyless Sigstore).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/text/json_dump.h"
#include "absl/strings/str_cat.h"
#include "core/interop/model_signature.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/read_file.h"

namespace ckpt::cli {
namespace {

struct VerifySignatureArgs {
  std::string root;
  std::string signature;
  std::string public_key;
  std::vector<std::string> certificate_chain;
  std::vector<std::string> ignore_paths;
  unsigned threads = 0;
  bool json = false;
};

absl::StatusOr<interop::ModelTrust> LoadModelTrust(const VerifySignatureArgs& a) {
  if (a.public_key.empty() == a.certificate_chain.empty()) {
    return absl::InvalidArgumentError("give exactly one of --public-key or --certificate-chain");
  }
  interop::ModelTrust trust;
  if (!a.public_key.empty()) {
    auto pem = ReadSmallFile(a.public_key, 1 << 20);
    if (!pem.ok()) return pem.status();
    auto key = evidence::EcdsaPublicKey::FromPem(*pem);
    if (!key.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(a.public_key, ": ", key.status().message()));
    }
    trust.public_key = *key;
    return trust;
  }
  std::vector<std::string> pems;
  for (const std::string& path : a.certificate_chain) {
    auto pem = ReadSmallFile(path, 16 << 20);
    if (!pem.ok()) return pem.status();
    pems.push_back(*std::move(pem));
  }
  auto certs = evidence::CertificateTrust::FromPem(pems);
  if (!certs.ok()) return certs.status();
  trust.certificates = *std::move(certs);
  return trust;
}

int Run(const VerifySignatureArgs& a) {
  auto trust = LoadModelTrust(a);
  if (!trust.ok()) return ReportError(trust.status());
  auto bundle = ReadSmallFile(a.signature, 256u << 20);
  if (!bundle.ok()) return ReportError(bundle.status());
  interop::ModelSigningOptions options;
  options.threads = a.threads;
  std::vector<std::string> ignore = a.ignore_paths;
  ignore.push_back(a.signature);
  options.ignore_paths = interop::RelativeIgnorePaths(a.root, ignore);
  TerminalProgress progress;
  auto check = interop::VerifyModelSignature(a.root, *bundle, *trust, options, progress);
  if (!check.ok()) return ReportError(check.status());
  const bool bad_input =
      check->failure && (check->failure->reason == evidence::OmsReason::kMalformedBundle ||
                         check->failure->reason == evidence::OmsReason::kUnsupportedBundle);
  std::string reason = check->failure ? evidence::OmsReasonName(check->failure->reason) : "";
  if (a.json) {
    nlohmann::ordered_json j = {{"verified", check->ok()}, {"root", a.root},
                                {"signature", a.signature}};
    if (check->failure) {
      j["reason"] = reason;
      j["detail"] = check->failure->detail;
      j["differences"] = check->differences;
    }
    if (!check->signer.empty()) j["signer"] = check->signer;
    if (check->ok()) {
      j["model_name"] = check->statement.model_name;
      j["manifest_root"] = check->statement.root_sha256;
      j["resources"] = check->statement.resources.size();
    }
    j["notes"] = check->notes;
    std::printf("%s\n", DumpJson(j, 2).c_str());
  } else {
    for (const std::string& n : check->notes) std::printf("note: %s\n", n.c_str());
    if (check->ok()) {
      std::printf("VERIFIED: %s matches %s (%zu files, OMS ROOT %s), signed by %s\n",
                  a.root.c_str(), a.signature.c_str(), check->statement.resources.size(),
                  check->statement.root_sha256.c_str(), check->signer.c_str());
    } else {
      std::printf("NOT VERIFIED (%s): %s\n", reason.c_str(), check->failure->detail.c_str());
      for (const std::string& d : check->differences) std::printf("  %s\n", d.c_str());
    }
  }
  if (check->ok()) return kExitOk;
  return bad_input ? kExitError : kExitCheckFailed;
}

}  // namespace

void AddVerifySignatureCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "verify-signature",
      "Check an OpenSSF model signing (model_signing v1.0) signature against a directory");
  auto a = std::make_shared<VerifySignatureArgs>();
  AcceptHubRepoIds(cmd->add_option("ROOT", a->root, "model directory"))->required();
  cmd->add_option("--signature", a->signature, "Sigstore bundle (model.sig)")->required();
  cmd->add_option("--public-key", a->public_key, "ECDSA public key PEM (key signatures)");
  cmd->add_option("--certificate-chain", a->certificate_chain,
                  "trusted certificate PEM files (certificate signatures)");
  cmd->add_option("--ignore-paths", a->ignore_paths, "files or directories not to check");
  AddThreadsOption(cmd, &a->threads);
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
