// `ckpt-audit keys generate|show`: Ed25519 signing keys for evidence records and the trust-file
// line that lets verifiers accept them (format: core/evidence/trust_store.h).
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/trust_store.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"

namespace ckpt::cli {
namespace {

struct KeyArgs {
  std::string key;
  std::string trust;
  std::string name;
  bool json = false;
};

void PrintKey(const evidence::PublicKey& pub, const std::string& path, const std::string& name,
              bool json) {
  if (json) {
    nlohmann::json j = {{"key", path},
                        {"keyid", pub.KeyId()},
                        {"public_key_pem", pub.ToPem()},
                        {"trust_line", evidence::TrustStore::Line(pub, name)}};
    std::printf("%s\n", DumpJson(j, 2).c_str());
    return;
  }
  std::printf("key    %s\nkeyid  %s\ntrust  %s%s", path.c_str(), pub.KeyId().c_str(),
              evidence::TrustStore::Line(pub, name).c_str(), pub.ToPem().c_str());
}

int Generate(const KeyArgs& a) {
  auto key = evidence::SigningKey::Generate();
  if (!key.ok()) return ReportError(key.status());
  if (auto s = key->Save(a.key); !s.ok()) return ReportError(s);
  std::string pub_path = a.key + ".pub";
  if (FILE* f = std::fopen(pub_path.c_str(), "wx"); f != nullptr) {
    std::fputs(key->public_key().ToPem().c_str(), f);
    std::fclose(f);
  }
  if (!a.trust.empty()) {
    if (auto s = evidence::TrustStore::AppendToFile(a.trust, key->public_key(), a.name);
        !s.ok()) {
      return ReportError(s);
    }
  }
  PrintKey(key->public_key(), a.key, a.name, a.json);
  return kExitOk;
}

int Show(const KeyArgs& a) {
  std::string path = a.key;
  if (path.empty()) {
    auto def = DefaultKeyPath();
    if (!def.ok()) return ReportError(def.status());
    path = *def;
  }
  auto key = evidence::SigningKey::Load(path);
  if (key.ok()) {
    PrintKey(key->public_key(), path, a.name, a.json);
    return kExitOk;
  }
  // A public key PEM works too: showing the trust line does not need the private key.
  FILE* f = std::fopen(path.c_str(), "r");
  if (f == nullptr) return ReportError(key.status());
  std::string pem;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, f)) > 0;) pem.append(buf, n);
  std::fclose(f);
  auto pub = evidence::PublicKey::FromPem(pem);
  if (!pub.ok()) return ReportError(key.status());
  PrintKey(*pub, path, a.name, a.json);
  return kExitOk;
}

}  // namespace

void AddKeysCommand(CLI::App& app, int* exit_code) {
  auto* keys = app.add_subcommand("keys", "Manage Ed25519 evidence signing keys");
  keys->require_subcommand(1);
  auto args = std::make_shared<KeyArgs>();
  auto* gen = keys->add_subcommand("generate", "Create a new key file (mode 0600) and KEY.pub");
  gen->add_option("--out,KEY", args->key, "private key file to create")->required();
  gen->add_option("--trust", args->trust, "also append the public key to this trust file");
  gen->add_option("--name", args->name, "name written after the key in the trust line");
  gen->add_flag("--json", args->json, "machine-readable output");
  gen->callback([=] { *exit_code = Generate(*args); });
  auto* show = keys->add_subcommand("show", "Print a key's id, trust-file line and public PEM");
  show->add_option("--key,KEY", args->key, "private or public key file (default: per-user key)");
  show->add_option("--name", args->name, "name written after the key in the trust line");
  show->add_flag("--json", args->json, "machine-readable output");
  show->callback([=] { *exit_code = Show(*args); });
}

}  // namespace ckpt::cli
