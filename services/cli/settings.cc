#include "services/cli/settings.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/io/small_file.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/commands.h"
#include "services/cli/evidence_paths.h"

namespace ckpt::cli {
namespace {

struct SettingInfo {
  Setting setting;
  const char* name;  // in the config file and in `config`'s output
  const char* env;   // nullptr: none
  const char* flag;
  const char* outranked_by;  // an environment variable that makes the file's value unused
  bool path;  // a value in the config file must be an absolute path (or, for the key, pkcs11:)
};

constexpr SettingInfo kSettings[] = {
    {Setting::kDb, "db", "CKPT_AUDIT_DB", "--db", nullptr, true},
    {Setting::kKey, "key", "CKPT_AUDIT_KEY", "--key", nullptr, true},
    {Setting::kServer, "server", "CKPT_AUDIT_SERVER", "--server", nullptr, false},
    {Setting::kTokenFile, "token-file", nullptr, "--token-file", "CKPT_AUDIT_TOKEN", true},
};

const SettingInfo& InfoOf(Setting s) {
  for (const SettingInfo& i : kSettings) {
    if (i.setting == s) return i;
  }
  return kSettings[0];
}

std::optional<std::string> ConfigPath() {
  if (const char* xdg = std::getenv("XDG_CONFIG_HOME"); xdg != nullptr && xdg[0] == '/') {
    return absl::StrCat(xdg, "/ckpt-audit/config");
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    return absl::StrCat(home, "/.config/ckpt-audit/config");
  }
  return std::nullopt;
}

struct ConfigFile {
  std::string path;  // empty: no place for one (neither XDG_CONFIG_HOME nor HOME)
  bool present = false;
  std::map<Setting, SettingValue> values;
};

absl::StatusOr<ConfigFile> ParseConfig(const std::string& path, const std::string& text) {
  ConfigFile c;
  c.path = path;
  c.present = true;
  int line_no = 0;
  absl::string_view body = text;
  absl::ConsumePrefix(&body, "\xEF\xBB\xBF");  // a UTF-8 byte order mark
  for (absl::string_view line : absl::StrSplit(body, '\n')) {
    ++line_no;
    const std::string where = absl::StrCat(EncodeName(path), ":", line_no);
    // A comment starts at '#' at the start of a line or after white space.
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
        line = line.substr(0, i);
        break;
      }
    }
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    for (char c : line) {
      if (static_cast<unsigned char>(c) < 0x20 && c != '\t') {
        return absl::InvalidArgumentError(absl::StrCat(where, ": a control character"));
      }
    }
    const size_t eq = line.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": expected NAME = VALUE"));
    }
    const std::string name(absl::StripAsciiWhitespace(line.substr(0, eq)));
    const std::string value(absl::StripAsciiWhitespace(line.substr(eq + 1)));
    const SettingInfo* info = nullptr;
    for (const SettingInfo& i : kSettings) {
      if (name == i.name) info = &i;
    }
    if (info == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown setting '", EncodeName(name),
                                                     "' (known: db, key, server, token-file)"));
    }
    if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(where, ": empty value"));
    if (info->path && value.front() != '/' &&
        !(info->setting == Setting::kKey && absl::StartsWith(value, "pkcs11:"))) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": ", name, " must be an absolute path",
                       info->setting == Setting::kKey ? " or a pkcs11: URI" : ""));
    }
    if (!c.values.emplace(info->setting, SettingValue{value, where}).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", name, " is set twice"));
    }
  }
  return c;
}

// Read once per process: the file decides which log and key every command of this run uses.
const absl::StatusOr<ConfigFile>& Config() {
  static const auto* config = new absl::StatusOr<ConfigFile>([]() -> absl::StatusOr<ConfigFile> {
    std::optional<std::string> path = ConfigPath();
    if (!path) return ConfigFile{};
    io::SmallFileRules rules;
    rules.what = "config file";
    rules.max_bytes = 64 << 10;
    rules.forbidden_mode = 022;  // whoever can write it picks the log and the key
    rules.owner_root_or_self = true;
    rules.follow_link = true;  // a managed dotfile; the rules hold for the file opened
    absl::StatusOr<std::string> text = io::ReadSmallFile(*path, rules);
    if (absl::IsNotFound(text.status())) return ConfigFile{*path, false, {}};
    if (!text.ok()) return text.status();
    return ParseConfig(*path, *text);
  }());
  return *config;
}

// What `config` shows for a setting given nowhere.
absl::StatusOr<std::string> DefaultOf(Setting s) {
  switch (s) {
    case Setting::kDb: {
      auto home = EvidenceHome();
      if (!home.ok()) return home.status();
      return absl::StrCat(*home, "/evidence.db");
    }
    case Setting::kKey:
      return DefaultKeyPath();
    case Setting::kServer:
      return std::string(kDefaultServer);
    case Setting::kTokenFile:
      return std::string();
  }
  return std::string();
}

int ShowConfig(bool json) {
  const absl::StatusOr<ConfigFile>& config = Config();
  if (!config.ok()) return ReportError(config.status());
  nlohmann::json out = nlohmann::json::object();
  out["config_file"] = EncodeName(config->path);
  out["config_file_present"] = config->present;
  nlohmann::json settings = nlohmann::json::array();
  for (const SettingInfo& i : kSettings) {
    absl::StatusOr<SettingValue> v = ResolveSetting(i.setting, "");
    if (!v.ok()) return ReportError(v.status());
    std::string value = v->value, source = v->source;
    if (source.empty()) {
      absl::StatusOr<std::string> d = DefaultOf(i.setting);
      if (!d.ok()) return ReportError(d.status());
      value = *d;
      source = "default";
    }
    settings.push_back({{"name", i.name},
                        {"value", EncodeName(value)},
                        {"source", EncodeName(source)},
                        {"flag", i.flag},
                        {"env", i.env != nullptr ? i.env : ""}});
  }
  // The bearer token itself comes only from the environment: never from a file read here.
  const char* token = std::getenv("CKPT_AUDIT_TOKEN");
  const bool token_env = token != nullptr && token[0] != '\0';
  settings.push_back({{"name", "token"},
                      {"value", token_env ? "(set, not shown)" : ""},
                      {"source", token_env ? "CKPT_AUDIT_TOKEN" : "default"},
                      {"flag", ""},
                      {"env", "CKPT_AUDIT_TOKEN"}});
  out["settings"] = settings;
  if (json) {
    std::printf("%s\n", DumpJson(out, 2).c_str());
    return kExitOk;
  }
  std::printf("config file  %s%s\n", out["config_file"].get<std::string>().c_str(),
              config->present ? "" : " (none)");
  for (const nlohmann::json& s : settings) {
    const std::string value = s["value"].get<std::string>();
    std::printf("%-12s %s  (%s)\n", s["name"].get<std::string>().c_str(),
                value.empty() ? "-" : value.c_str(), s["source"].get<std::string>().c_str());
  }
  std::printf("precedence: flag, then environment, then config file, then default\n");
  return kExitOk;
}

}  // namespace

absl::StatusOr<SettingValue> ResolveSetting(Setting setting, const std::string& flag) {
  const SettingInfo& info = InfoOf(setting);
  if (!flag.empty()) return SettingValue{flag, "flag"};
  if (info.env != nullptr) {
    if (const char* env = std::getenv(info.env); env != nullptr && env[0] != '\0') {
      return SettingValue{env, info.env};
    }
  }
  if (info.outranked_by != nullptr) {
    if (const char* env = std::getenv(info.outranked_by); env != nullptr && env[0] != '\0') {
      return SettingValue{};
    }
  }
  const absl::StatusOr<ConfigFile>& config = Config();
  if (!config.ok()) return config.status();
  auto it = config->values.find(setting);
  if (it == config->values.end()) return SettingValue{};
  return it->second;
}

absl::Status ApplySetting(Setting setting, std::string* value) {
  absl::StatusOr<SettingValue> v = ResolveSetting(setting, *value);
  if (!v.ok()) return v.status();
  *value = std::move(v->value);
  return absl::OkStatus();
}

void AddConfigCommand(CLI::App& app, int* exit_code) {
  auto* cmd = app.add_subcommand(
      "config", "Show the log, key, server and token each command uses, and where they come from");
  auto json = std::make_shared<bool>(false);
  cmd->add_flag("--json", *json, "machine-readable output");
  cmd->callback([=] { *exit_code = ShowConfig(*json); });
}

}  // namespace ckpt::cli
