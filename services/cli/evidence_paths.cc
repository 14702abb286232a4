#include "services/cli/evidence_paths.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "services/cli/cli_util.h"
#include "services/cli/settings.h"

namespace ckpt::cli {
namespace {

constexpr char kDbName[] = "evidence.db";
constexpr char kKeyName[] = "audit-key.pem";
constexpr char kTrustName[] = "trusted_keys";

// $<xdg_var>/ckpt-audit, or ~/<fallback>/ckpt-audit, created 0700 (it may hold a private key).
// `hint` ends the error when neither variable is set.
absl::StatusOr<std::string> XdgHome(const char* xdg_var, const char* fallback, const char* hint) {
  std::string base;
  if (const char* xdg = std::getenv(xdg_var); xdg != nullptr && xdg[0] == '/') {
    base = xdg;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && home[0] != '\0') {
    base = absl::StrCat(home, "/", fallback);
  } else {
    return absl::FailedPreconditionError(
        absl::StrCat("neither ", xdg_var, " nor HOME is set; ", hint));
  }
  std::string dir = absl::StrCat(base, "/ckpt-audit");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
  ::chmod(dir.c_str(), 0700);
  return dir;
}

}  // namespace

absl::StatusOr<std::string> EvidenceHome() {
  return XdgHome("XDG_DATA_HOME", ".local/share", "pass --db and --key");
}

absl::StatusOr<std::string> StateHome() {
  return XdgHome("XDG_STATE_HOME", ".local/state",
                 "set one to remember evidence logs' heads and gate decisions");
}

absl::StatusOr<std::string> DefaultKeyPath() {
  auto home = EvidenceHome();
  if (!home.ok()) return home.status();
  return absl::StrCat(*home, "/", kKeyName);
}

std::function<void()> WithDefaultDb(std::string* db, int* exit_code, std::function<int()> run) {
  return [db, exit_code, run = std::move(run)] {
    if (absl::Status s = ApplySetting(Setting::kDb, db); !s.ok()) {
      *exit_code = ReportError(s);
      return;
    }
    if (db->empty()) {
      auto home = EvidenceHome();
      if (!home.ok()) {
        *exit_code = ReportError(home.status());
        return;
      }
      *db = absl::StrCat(*home, "/", kDbName);
    }
    *exit_code = run();
  };
}

absl::StatusOr<EvidenceSetup> ResolveEvidenceSetup(const std::string& db,
                                                   const evidence::KeySource& source) {
  const std::string& key = source.key;
  std::string home;
  if (db.empty() || key.empty()) {
    auto h = EvidenceHome();
    if (!h.ok()) return h.status();
    home = *h;
  }
  std::string db_path = db.empty() ? absl::StrCat(home, "/", kDbName) : db;
  std::string key_path = key.empty() ? absl::StrCat(home, "/", kKeyName) : key;
  std::string note;
  if (db.empty()) note = absl::StrCat("evidence database ", db_path);
  if (key.empty()) {
    struct stat st;
    bool generated = false;
    if (::stat(key_path.c_str(), &st) != 0) {
      auto fresh = evidence::SigningKey::Generate();
      if (!fresh.ok()) return fresh.status();
      if (auto s = fresh->Save(key_path); !s.ok()) return s;
      if (auto s = evidence::TrustStore::AppendToFile(absl::StrCat(home, "/", kTrustName),
                                                      fresh->public_key(), "default audit key");
          !s.ok()) {
        return s;
      }
      generated = true;
    }
    absl::StrAppend(&note, note.empty() ? "" : ", ", "signing key ", key_path,
                    generated ? " (generated now; public key added to the default trust file)"
                              : "");
  }
  evidence::KeySource resolved = source;
  resolved.key = key_path;
  auto loaded = evidence::LoadSigningKey(resolved);
  if (!loaded.ok()) return loaded.status();
  return EvidenceSetup{db_path, key_path, *loaded, note};
}

absl::StatusOr<evidence::TrustStore> LoadTrust(const std::string& trust_path) {
  std::string path = trust_path;
  if (path.empty()) {
    auto home = EvidenceHome();
    if (!home.ok()) return home.status();
    path = absl::StrCat(*home, "/", kTrustName);
  }
  auto trust = evidence::TrustStore::Load(path);
  if (!trust.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(trust.status().message(), " (pass --trust FILE; `ckpt-audit keys show` "
                                               "prints a key's trust line)"));
  }
  if (trust->empty()) return absl::InvalidArgumentError(absl::StrCat(path, ": no keys"));
  return trust;
}

}  // namespace ckpt::cli
