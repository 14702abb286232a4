// `ckpt-audit keys generate|show`: Ed25519 signing keys for evidence records and the trust-file
// line that lets verifiers accept them (format: core/evidence/trust_store.h); with --db, the
// log's C2SP note verifier key (storage/note_key.h); ECDSA keys for OpenSSF model signing
// (`--type ecdsa-p256|p384|p521`, core/evidence/ecdsa.h). `generate --pkcs11 --key pkcs11:URI`
// creates the key on a token instead, where it stays (core/evidence/pkcs11_key.h).
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/evidence/ecdsa.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/key_source.h"
#include "core/evidence/pkcs11_key.h"
#include "core/evidence/trust_store.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/read_file.h"
#include "storage/evidence_log.h"
#include "storage/note_key.h"
#include "storage/tlog_checkpoint.h"

namespace ckpt::cli {
namespace {

struct KeyArgs {
  std::string key;
  bool pkcs11 = false;
  evidence::KeySource token;  // its module and PIN flags; key is copied in from `key`
  std::string type = "ed25519";
  std::string trust;
  std::string name;
  std::string db;
  bool json = false;
};

// `vkey` is the log's note verifier key for this key (empty without --db).
void PrintKey(const evidence::PublicKey& pub, const std::string& path, const std::string& name,
              const std::string& vkey, bool json) {
  if (json) {
    nlohmann::json j = {{"key", path},
                        {"type", "ed25519"},
                        {"keyid", pub.KeyId()},
                        {"public_key_pem", pub.ToPem()},
                        {"trust_line", evidence::TrustStore::Line(pub, name)}};
    if (!vkey.empty()) j["note_verifier_key"] = vkey;
    std::printf("%s\n", DumpJson(j, 2).c_str());
    return;
  }
  std::printf("key    %s\nkeyid  %s\ntrust  %s", path.c_str(), pub.KeyId().c_str(),
              evidence::TrustStore::Line(pub, name).c_str());
  if (!vkey.empty()) std::printf("vkey   %s\n", vkey.c_str());
  std::printf("%s", pub.ToPem().c_str());
}

void PrintEcdsaKey(const evidence::EcdsaPublicKey& pub, const std::string& path, bool json) {
  std::string type = evidence::EcKeyType(pub.curve());
  if (json) {
    nlohmann::json j = {{"key", path},
                        {"type", type},
                        {"hint", pub.Hint()},
                        {"public_key_pem", pub.PublicPem()}};
    std::printf("%s\n", DumpJson(j, 2).c_str());
    return;
  }
  std::printf("key    %s\ntype   %s\nhint   %s\n%s", path.c_str(), type.c_str(),
              pub.Hint().c_str(), pub.PublicPem().c_str());
}

// The note verifier key of `pub` under the name of the log at `db`; empty without a db.
// The log's note verifier key for `pub`. `chosen`: the caller named the key (--key); else it
// is the per-user default, shown only when it is the key that signs the log's checkpoints.
absl::StatusOr<std::string> LogVerifierKey(const std::string& db, const evidence::PublicKey& pub,
                                           bool chosen) {
  if (db.empty()) return std::string();
  auto log = storage::EvidenceLog::OpenReadOnly(db);
  if (!log.ok()) return log.status();
  if (!chosen) {
    auto latest = (*log)->LatestCheckpoint();
    evidence::TrustStore only;
    only.Add(pub);
    if (!latest.ok() ||
        !storage::VerifyCheckpoint(latest->second, (*log)->origin(), only).ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          db, ": ", latest.ok() ? "its checkpoints are not signed by" : "has no checkpoint "
          "to tell its signer; not showing", " the per-user key ", pub.KeyId(),
          ": name the log's signing key with --key"));
    }
  }
  return storage::FormatNoteVerifierKey((*log)->origin(), pub);
}

void WritePublicPem(const std::string& path, const std::string& pem) {
  if (FILE* f = std::fopen(path.c_str(), "wx"); f != nullptr) {
    std::fputs(pem.c_str(), f);
    std::fclose(f);
  }
}

int GenerateEcdsa(const KeyArgs& a) {
  auto curve = evidence::EcCurveFromKeyType(a.type);
  if (!curve.ok()) return ReportError(curve.status());
  auto key = evidence::EcdsaSigningKey::Generate(*curve);
  if (!key.ok()) return ReportError(key.status());
  if (auto s = key->Save(a.key); !s.ok()) return ReportError(s);
  WritePublicPem(a.key + ".pub", key->public_key().PublicPem());
  PrintEcdsaKey(key->public_key(), a.key, a.json);
  return kExitOk;
}

// A key pair created on the token the URI names, opened through the one path every signing
// command uses (so its attributes are checked as they will be), and printed like a file key.
int GenerateOnToken(const KeyArgs& a) {
  if (!evidence::IsPkcs11Uri(a.key)) {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat("--pkcs11 creates a key on a token: --key must be a pkcs11: URI, not ",
                     a.key)));
  }
  const bool ed = a.type == "ed25519";
  if (!ed && a.type != "ecdsa-p256") {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat("--pkcs11 --type ", a.type, ": token keys are ed25519 or ecdsa-p256")));
  }
  if (!ed && !a.trust.empty()) {
    return ReportError(absl::InvalidArgumentError(
        "--trust lists Ed25519 evidence keys; an ECDSA key signs model signatures only"));
  }
  auto uri = evidence::ParsePkcs11Uri(a.key);
  if (!uri.ok()) return ReportError(uri.status());
  evidence::KeySource source = a.token;
  source.key = a.key;
  auto access = evidence::Pkcs11AccessOf(source);
  if (!access.ok()) return ReportError(access.status());
  auto type = ed ? evidence::Pkcs11KeyType::kEd25519 : evidence::Pkcs11KeyType::kEcdsaP256;
  if (auto s = evidence::GeneratePkcs11Key(*uri, type, *access); !s.ok()) return ReportError(s);
  if (!ed) {
    auto key = evidence::OpenPkcs11EcdsaKey(*uri, *access);
    if (!key.ok()) return ReportError(key.status());
    PrintEcdsaKey(key->public_key(), a.key, a.json);
    return kExitOk;
  }
  auto key = evidence::OpenPkcs11Ed25519Key(*uri, *access);
  if (!key.ok()) return ReportError(key.status());
  if (!a.trust.empty()) {
    if (auto s = evidence::TrustStore::AppendToFile(a.trust, key->public_key(), a.name);
        !s.ok()) {
      return ReportError(s);
    }
  }
  PrintKey(key->public_key(), a.key, a.name, "", a.json);
  return kExitOk;
}

int Generate(const KeyArgs& a) {
  if (a.pkcs11) return GenerateOnToken(a);
  if (evidence::IsPkcs11Uri(a.key)) {
    return ReportError(absl::InvalidArgumentError(
        "a pkcs11: URI names a token key: pass --pkcs11 (with --pkcs11-module and --pin-file or "
        "--pin-env) to create it there"));
  }
  if (!a.token.pkcs11_module.empty() || !a.token.pin_file.empty() || !a.token.pin_env.empty()) {
    return ReportError(absl::InvalidArgumentError(
        "--pkcs11-module, --pin-file and --pin-env belong to --pkcs11"));
  }
  if (a.type != "ed25519") {
    if (!a.trust.empty()) {
      return ReportError(absl::InvalidArgumentError(
          "--trust lists Ed25519 evidence keys; an ECDSA key signs model signatures only"));
    }
    return GenerateEcdsa(a);
  }
  auto key = evidence::SigningKey::Generate();
  if (!key.ok()) return ReportError(key.status());
  if (auto s = key->Save(a.key); !s.ok()) return ReportError(s);
  WritePublicPem(a.key + ".pub", key->public_key().ToPem());
  if (!a.trust.empty()) {
    if (auto s = evidence::TrustStore::AppendToFile(a.trust, key->public_key(), a.name);
        !s.ok()) {
      return ReportError(s);
    }
  }
  PrintKey(key->public_key(), a.key, a.name, "", a.json);
  return kExitOk;
}

int ShowEd25519(const evidence::PublicKey& pub, const std::string& path, const KeyArgs& a) {
  auto vkey = LogVerifierKey(a.db, pub, /*chosen=*/!a.key.empty());
  if (!vkey.ok()) return ReportError(vkey.status());
  PrintKey(pub, path, a.name, *vkey, a.json);
  return kExitOk;
}

// A token key's public half, through the path signing uses: --type picks Ed25519 (default) or
// ecdsa-p256, so a wrong PIN is offered once, never once per key type.
int ShowTokenKey(const KeyArgs& a) {
  evidence::KeySource source = a.token;
  source.key = a.key;
  if (a.type == "ecdsa-p256") {
    auto key = evidence::LoadEcdsaSigningKey(source);
    if (!key.ok()) return ReportError(key.status());
    PrintEcdsaKey(key->public_key(), a.key, a.json);
    return kExitOk;
  }
  if (a.type != "ed25519") {
    return ReportError(absl::InvalidArgumentError(
        absl::StrCat("--type ", a.type, ": token keys are ed25519 or ecdsa-p256")));
  }
  auto key = evidence::LoadSigningKey(source);
  if (!key.ok()) return ReportError(key.status());
  return ShowEd25519(key->public_key(), a.key, a);
}

int Show(const KeyArgs& a) {
  if (evidence::IsPkcs11Uri(a.key)) return ShowTokenKey(a);
  if (!a.token.pkcs11_module.empty() || !a.token.pin_file.empty() || !a.token.pin_env.empty()) {
    return ReportError(absl::InvalidArgumentError(
        "--pkcs11-module, --pin-file and --pin-env belong to a pkcs11: key"));
  }
  std::string path = a.key;
  if (path.empty()) {
    auto def = DefaultKeyPath();
    if (!def.ok()) return ReportError(def.status());
    path = *def;
  }
  auto key = evidence::SigningKey::Load(path);
  if (key.ok()) return ShowEd25519(key->public_key(), path, a);
  if (auto ec = evidence::EcdsaSigningKey::Load(path); ec.ok()) {
    PrintEcdsaKey(ec->public_key(), path, a.json);
    return kExitOk;
  }
  // A public key PEM works too: showing the trust line does not need the private key.
  auto pem = ReadSmallFile(path, 1 << 20);
  if (!pem.ok()) return ReportError(key.status());
  if (auto pub = evidence::PublicKey::FromPem(*pem); pub.ok()) return ShowEd25519(*pub, path, a);
  if (auto pub = evidence::EcdsaPublicKey::FromPem(*pem); pub.ok()) {
    PrintEcdsaKey(*pub, path, a.json);
    return kExitOk;
  }
  return ReportError(key.status());
}

}  // namespace

void AddKeysCommand(CLI::App& app, int* exit_code) {
  auto* keys = app.add_subcommand("keys", "Manage evidence (Ed25519) and model signing (ECDSA) keys");
  keys->require_subcommand(1);
  auto args = std::make_shared<KeyArgs>();
  auto* gen = keys->add_subcommand("generate", "Create a new key file (mode 0600) and KEY.pub");
  gen->add_option("--out,--key,KEY", args->key,
                  "private key file to create, or with --pkcs11 the pkcs11: URI of the token key")
      ->required();
  gen->add_flag("--pkcs11", args->pkcs11,
                "create the key on a PKCS#11 token (sensitive, never extractable)");
  AddPkcs11Flags(gen, &args->token);
  gen->add_option("--type", args->type,
                  "ed25519 (evidence, default), ecdsa-p256, ecdsa-p384, ecdsa-p521 (model signing)");
  gen->add_option("--trust", args->trust, "also append the public key to this trust file");
  gen->add_option("--name", args->name, "name written after the key in the trust line");
  gen->add_flag("--json", args->json, "machine-readable output");
  gen->callback([=] { *exit_code = Generate(*args); });
  auto* show = keys->add_subcommand("show", "Print a key's id, trust-file line and public PEM");
  show->add_option("--key,KEY", args->key,
                   "private or public key file, or pkcs11: URI (default: per-user key)");
  show->add_option("--name", args->name, "name written after the key in the trust line");
  show->add_option("--db", args->db,
                   "also print this log's note verifier key (C2SP vkey); without --key, only "
                   "when the per-user key signs the log's checkpoints");
  show->add_option("--type", args->type,
                   "for a pkcs11: key: ed25519 (default) or ecdsa-p256 (files say their type)");
  AddPkcs11Flags(show, &args->token);
  show->add_flag("--json", args->json, "machine-readable output");
  show->callback([=] { *exit_code = Show(*args); });
}

}  // namespace ckpt::cli
