// `ckpt-audit sign ROOT --key EC_KEY.pem|pkcs11:URI [--signature OUT] [--ignore-paths P...]`: an
// OpenSSF model signing (OMS v1.0) signature of a model directory, the Sigstore bundle that
// `model_signing sign key` writes and `model_signing verify key` accepts (docs/interop.md); a
// token key signs through --pkcs11-module and --pin-file/--pin-env (docs/evidence.md).
// Exit 0 written, 2 invalid input or error.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/evidence/ecdsa.h"
#include "core/evidence/key_source.h"
#include "core/interop/model_signature.h"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/read_file.h"

namespace ckpt::cli {
namespace {

struct SignArgs {
  std::string root;
  evidence::KeySource key;
  std::string signature = "model.sig";
  std::vector<std::string> ignore_paths;
  unsigned threads = 0;
};

int Run(const SignArgs& a) {
  auto key = evidence::LoadEcdsaSigningKey(a.key);
  if (!key.ok()) return ReportError(key.status());
  interop::ModelSigningOptions options;
  options.threads = a.threads;
  std::vector<std::string> ignore = a.ignore_paths;
  ignore.push_back(a.signature);  // a signature inside the model never signs itself
  options.ignore_paths = interop::RelativeIgnorePaths(a.root, ignore);
  TerminalProgress progress;
  auto bundle = interop::SignModel(a.root, *key, options, progress);
  if (!bundle.ok()) return ReportError(bundle.status());
  if (auto s = WriteFileAtomically(a.signature, *bundle); !s.ok()) return ReportError(s);
  std::printf("signed %s with ECDSA %s key %s: %s\n", a.root.c_str(),
              evidence::EcCurveName(key->public_key().curve()).c_str(),
              key->public_key().Hint().c_str(), a.signature.c_str());
  return kExitOk;
}

}  // namespace

void AddSignCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "sign", "Write an OpenSSF model signing (model_signing v1.0) signature of a directory");
  auto a = std::make_shared<SignArgs>();
  AcceptHubRepoIds(cmd->add_option("ROOT", a->root, "model directory"))->required();
  cmd->add_option("--key", a->key.key,
                  "ECDSA P-256/P-384/P-521 private key PEM, or pkcs11:URI of a P-256 token key")
      ->required();
  AddPkcs11Flags(cmd, &a->key);
  cmd->add_option("--signature", a->signature, "signature file to write (default model.sig)");
  cmd->add_option("--ignore-paths", a->ignore_paths, "files or directories not to sign");
  AddThreadsOption(cmd, &a->threads);
  cmd->callback([=] { *exit_code = Run(*a); });
}

}  // namespace ckpt::cli
