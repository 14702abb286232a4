// `ckpt-audit query --db PATH [filters]`: audits in the evidence log, newest first, one page at
// a time (`--page-token` from the previous page's output).
#include <cstdio>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"
#include "nlohmann/json.hpp"
#include "services/cli/cli_util.h"
#include "services/cli/evidence_paths.h"
#include "services/cli/commands.h"
#include "services/cli/log_heads.h"
#include "storage/evidence_log.h"

namespace ckpt::cli {
namespace {

struct QueryArgs {
  std::string db;
  storage::QueryFilter filter;
  std::string since, until;
  bool json = false;
};

// RFC 3339 with any offset, or a date (YYYY-MM-DD, midnight UTC).
absl::StatusOr<std::optional<absl::Time>> ParseTimeFlag(const std::string& flag,
                                                        const std::string& value) {
  if (value.empty()) return std::optional<absl::Time>();
  absl::Time t;
  std::string err;
  if (absl::ParseTime(absl::RFC3339_full, value, &t, &err) ||
      absl::ParseTime("%Y-%m-%d", value, absl::UTCTimeZone(), &t, &err)) {
    return std::optional<absl::Time>(t);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(flag, ": '", value, "' is neither an RFC 3339 time nor a YYYY-MM-DD date"));
}

int Run(QueryArgs a) {
  auto since = ParseTimeFlag("--since", a.since);
  if (!since.ok()) return ReportError(since.status());
  a.filter.since = *since;
  auto until = ParseTimeFlag("--until", a.until);
  if (!until.ok()) return ReportError(until.status());
  a.filter.until = *until;
  auto log = OpenLogReader(a.db);
  if (!log.ok()) return ReportError(log.status());
  storage::QueryFilter filter = a.filter;
  filter.root = EncodeName(filter.root);  // records name roots in the name encoding
  auto page = (*log)->Query(filter);
  if (!page.ok()) return ReportError(page.status());
  if (a.json) {
    nlohmann::ordered_json j = {{"records", nlohmann::ordered_json::array()}};
    for (const auto& e : page->entries) {
      j["records"].push_back({{"id", e.seq},
                              {"time", e.time},
                              {"verdict", e.verdict},
                              {"policy", e.policy},
                              {"root", e.root},
                              {"keyid", e.keyid},
                              {"predicate_type", e.predicate_type}});
    }
    j["next_page_token"] = page->next_page_token;
    std::printf("%s\n", DumpJson(j, 2).c_str());
    return kExitOk;
  }
  std::printf("%-8s %-24s %-7s %-14s %s\n", "ID", "TIME", "VERDICT", "POLICY", "ROOT");
  for (const auto& e : page->entries) {
    std::printf("%-8llu %-24s %-7s %-14s %s\n", static_cast<unsigned long long>(e.seq),
                e.time.c_str(), e.verdict.c_str(), e.policy.c_str(), EncodeName(e.root).c_str());
  }
  if (!page->next_page_token.empty()) {
    std::printf("more: --page-token %s\n", page->next_page_token.c_str());
  }
  return kExitOk;
}

}  // namespace

void AddQueryCommand(CLI::App& app, int* exit_code) {
  auto a = std::make_shared<QueryArgs>();
  auto* cmd = app.add_subcommand("query", "List audits in an evidence log, newest first");
  cmd->add_option(
      "--db", a->db,
      "evidence database (default: $CKPT_AUDIT_DB, then the config file, then per-user)");
  cmd->add_option("--digest", a->filter.digest, "a subject's sha256 (a file or manifest root)");
  cmd->add_option("--root", a->filter.root, "audited checkpoint root (realpath)");
  cmd->add_option("--verdict", a->filter.verdict, "pass or fail");
  cmd->add_option("--policy", a->filter.policy, "policy name");
  cmd->add_option("--since", a->since, "RFC 3339 time (any offset) or YYYY-MM-DD, inclusive");
  cmd->add_option("--until", a->until, "RFC 3339 time (any offset) or YYYY-MM-DD, exclusive");
  cmd->add_option("--limit", a->filter.limit, "records per page (1..10000, default 50)");
  cmd->add_option("--page-token", a->filter.page_token, "continue after a previous page");
  cmd->add_flag("--json", a->json, "machine-readable output");
  cmd->callback(WithDefaultDb(&a->db, exit_code, [=] { return Run(*a); }));
}

}  // namespace ckpt::cli
