#include "core/interop/intoto_bundle.h"


#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/record.h"
#include "core/evidence/strict_json.h"
#include "core/evidence/test_result.h"
#include "core/interop/publish.h"
#include "core/sha256.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt::interop {
namespace {

// The entry a test result or verification summary names, as (uri, envelope sha256).
std::optional<std::pair<std::string, std::string>> NamedRecord(const std::string& payload) {
  if (auto link = evidence::TestResultRecordLink(payload); link.ok()) {
    return std::make_pair(link->uri, link->envelope_sha256);
  }
  absl::StatusOr<nlohmann::json> parsed = evidence::ParseStrictJson(payload, "statement");
  if (!parsed.ok()) return std::nullopt;
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || j.value("predicateType", "") != evidence::kVerificationSummaryType ||
      !j.contains("predicate") || !j["predicate"].is_object()) {
    return std::nullopt;
  }
  const auto& inputs = j["predicate"].value("inputAttestations", nlohmann::json::array());
  if (!inputs.is_array() || inputs.empty() || !inputs[0].is_object() ||
      !inputs[0].contains("digest") || !inputs[0]["digest"].is_object()) {
    return std::nullopt;
  }
  return std::make_pair(inputs[0].value("uri", ""), inputs[0]["digest"].value("sha256", ""));
}

absl::StatusOr<std::string> PayloadOf(const storage::LogEntry& e) {
  auto env = evidence::ParseEnvelope(e.envelope);
  if (!env.ok()) return env.status();
  return env->payload;
}

}  // namespace

absl::StatusOr<ExportedBundle> ExportInTotoBundle(const storage::EvidenceLog& log, uint64_t id) {
  auto entry = log.Get(id);
  if (!entry.ok()) return entry.status();
  auto payload = PayloadOf(*entry);
  if (!payload.ok()) return payload.status();
  std::set<uint64_t> ids = {id};
  storage::LogEntry record = *entry;
  if (entry->predicate_type == evidence::kTestResultPredicateType) {
    auto link = evidence::TestResultRecordLink(*payload);
    if (!link.ok()) return link.status();
    std::string prefix = log.origin() + "#";
    uint64_t named = 0;
    if (link->uri.rfind(prefix, 0) != 0 ||
        !absl::SimpleAtoi(link->uri.substr(prefix.size()), &named)) {
      return absl::FailedPreconditionError(
          absl::StrCat("test result ", id, " names '", link->uri, "', not an entry of this log"));
    }
    auto named_entry = log.Get(named);
    if (!named_entry.ok()) return named_entry.status();
    if (ToHex(Sha256Of(evidence::AsBytes(named_entry->envelope))) != link->envelope_sha256) {
      return absl::FailedPreconditionError(absl::StrCat(
          "test result ", id, " names entry ", named, " with a different envelope digest"));
    }
    record = *named_entry;
    ids.insert(named);
  }
  if (record.predicate_type == evidence::kEvidencePredicateType) {
    auto record_payload = PayloadOf(record);
    if (!record_payload.ok()) return record_payload.status();
    auto idx = evidence::IndexPayload(*record_payload);
    if (!idx.ok()) return idx.status();
    const std::string uri = EntryUri(log, record.seq);
    const std::string digest = ToHex(Sha256Of(evidence::AsBytes(record.envelope)));
    storage::QueryFilter filter;
    for (const evidence::Subject& s : idx->subjects) {
      if (s.name == evidence::kManifestRootSubject) filter.digest = s.sha256;
    }
    filter.limit = 500;
    while (!filter.digest.empty()) {
      auto page = log.Query(filter);
      if (!page.ok()) return page.status();
      for (const storage::LogEntry& e : page->entries) {
        if (e.seq == record.seq) continue;
        auto p = PayloadOf(e);
        if (!p.ok()) continue;
        auto named = NamedRecord(*p);
        if (named && named->first == uri && named->second == digest) ids.insert(e.seq);
      }
      if (page->next_page_token.empty()) break;
      filter.page_token = page->next_page_token;
    }
  }
  ExportedBundle out;
  for (uint64_t i : ids) {
    auto e = log.Get(i);
    if (!e.ok()) return e.status();
    out.ids.push_back(i);
    // One line per envelope: DSSE signs the payload, not the envelope's JSON whitespace.
    std::string line = e->envelope;
    if (line.find_first_of("\r\n") != std::string::npos) {
      auto j = evidence::ParseStrictJson(line, absl::StrCat("entry ", i));
      if (!j.ok()) return absl::DataLossError(j.status().message());
      line = DumpJson(*j);
    }
    absl::StrAppend(&out.jsonl, line, "\n");
  }
  return out;
}

}  // namespace ckpt::interop
