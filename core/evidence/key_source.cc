#include "core/evidence/key_source.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/io/small_file.h"

namespace ckpt::evidence {
namespace {

absl::Status CheckPemSource(const KeySource& source) {
  if (!source.pkcs11_module.empty() || !source.pin_file.empty() || !source.pin_env.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--pkcs11-module, --pin-file and --pin-env belong to a pkcs11: key, not the key file ",
        source.key));
  }
  return absl::OkStatus();
}

template <typename Key, typename OpenFn>
absl::StatusOr<Key> OpenToken(const KeySource& source, OpenFn open) {
  auto uri = ParsePkcs11Uri(source.key);
  if (!uri.ok()) return uri.status();
  auto access = Pkcs11AccessOf(source);
  if (!access.ok()) return access.status();
  return open(*uri, *access);
}

}  // namespace

absl::StatusOr<Pkcs11Access> Pkcs11AccessOf(const KeySource& source) {
  if (source.pkcs11_module.empty()) {
    return absl::InvalidArgumentError("a pkcs11: key needs --pkcs11-module PATH");
  }
  if (source.pin_file.empty() == source.pin_env.empty()) {
    return absl::InvalidArgumentError(
        "a pkcs11: key needs its PIN from exactly one of --pin-file PATH and --pin-env NAME");
  }
  Pkcs11Access access{source.pkcs11_module, ""};
  if (!source.pin_file.empty()) {
    io::SmallFileRules rules;
    rules.what = "PIN file";
    rules.max_bytes = 1024;
    rules.forbidden_mode = 077;
    rules.follow_link = true;  // Kubernetes secret volumes mount each file as a link
    auto pin = io::ReadSmallFile(source.pin_file, rules);
    if (!pin.ok()) return pin.status();
    if (!pin->empty() && pin->back() == '\n') pin->pop_back();
    if (!pin->empty() && pin->back() == '\r') pin->pop_back();
    access.pin = *std::move(pin);
  } else {
    const char* pin = std::getenv(source.pin_env.c_str());
    if (pin == nullptr || pin[0] == '\0') {
      return absl::InvalidArgumentError(
          absl::StrCat("--pin-env ", source.pin_env, ": the variable is not set or empty"));
    }
    access.pin = pin;
  }
  if (access.pin.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(source.pin_file, ": the PIN is empty"));
  }
  return access;
}

absl::StatusOr<SigningKey> LoadSigningKey(const KeySource& source) {
  if (IsPkcs11Uri(source.key)) return OpenToken<SigningKey>(source, OpenPkcs11Ed25519Key);
  if (auto s = CheckPemSource(source); !s.ok()) return s;
  return SigningKey::Load(source.key);
}

absl::StatusOr<EcdsaSigningKey> LoadEcdsaSigningKey(const KeySource& source) {
  if (IsPkcs11Uri(source.key)) return OpenToken<EcdsaSigningKey>(source, OpenPkcs11EcdsaKey);
  if (auto s = CheckPemSource(source); !s.ok()) return s;
  return EcdsaSigningKey::Load(source.key);
}

}  // namespace ckpt::evidence
