// What one check contributes to an evidence record, as typed values: its verdict, counts,
// findings, plot series and details, and a pair audit's full result. Checks (core/audit) fill
// these; the record's JSON is written from them in one place, check_result.cc and record.cc
// (docs/evidence.md "Where JSON is produced"). Every value is an integer, a string or a list of
// them, so a record cannot carry a float.
#ifndef CKPT_CORE_EVIDENCE_CHECK_RESULT_H_
#define CKPT_CORE_EVIDENCE_CHECK_RESULT_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "nlohmann/json.hpp"

namespace ckpt::evidence {

// Findings kept per check; the total is always reported.
inline constexpr size_t kMaxFindings = 20;

enum class Verdict { kPass, kFail, kSkipped };
std::string VerdictName(Verdict v);  // "pass", "fail", "skipped"

// One finding. Unset fields are not written. JSON keys: "code", "status", "path", then the
// rest (with `numbers`) by name, then "fails".
struct Finding {
  std::string code;     // stable kebab-case name, e.g. "over-span", "unreadable-checkpoint"
  std::string message;  // one line for people
  std::string status;   // the reader's status code name, for an unreadable checkpoint
  std::string path;     // a file of the tree, as the layout check names it
  std::string tensor;   // tensor or module name, raw; written in the name encoding
  std::string hazard;   // the scale-window hazard a forward finding measures
  std::optional<int64_t> row, group, layer;
  std::map<std::string, int64_t> numbers;  // e.g. {"k": -25, "k_max": -3}
  std::optional<bool> fails;               // layout findings: whether it fails the check
};

// Capped findings that still count everything (a pair audit's mismatches).
struct FindingSummary {
  uint64_t total = 0;
  std::map<std::string, uint64_t> by_code;
  uint64_t cap = 0;
  std::vector<Finding> listed;
};

// One plot of the report: integer points against an optional limit and warning line.
struct Series {
  struct Point {
    std::string label;
    int64_t value = 0;
  };
  std::string title;
  std::string unit;
  std::optional<int64_t> limit, warn;
  std::vector<Point> points;
};

// The scale-window policy's thresholds (quant::ScaleWindowConfig, mirrored here so that the
// evidence module does not depend on the quantization code).
struct ScaleWindowThresholds {
  std::string name;
  int64_t version = 0;
  int64_t max_span = 0;
  int64_t marlin_span = 0;
  int64_t marlin_min_scale_log2 = 0;
  int64_t max_listed = 0;
};
nlohmann::ordered_json ToJson(const ScaleWindowThresholds& t);

// Anything else a check keeps, in the order it was set.
using DetailValue =
    std::variant<std::string, int64_t, bool, std::vector<std::string>, ScaleWindowThresholds>;
class Details {
 public:
  // Replaces the value of an existing key in place, else appends.
  void Set(std::string key, DetailValue value);
  const DetailValue* Find(std::string_view key) const;
  // The string under `key`, or "" when absent or not a string.
  std::string String(std::string_view key) const;
  bool empty() const { return entries_.empty(); }
  const std::vector<std::pair<std::string, DetailValue>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, DetailValue>> entries_;
};

struct CheckResult {
  std::string name;
  Verdict verdict = Verdict::kPass;
  std::map<std::string, int64_t> counts;
  std::vector<Finding> findings;            // ToJson keeps the first kMaxFindings
  std::optional<uint64_t> findings_total;  // when the check itself kept only some
  std::vector<Series> series;              // the report's plots
  Details details;

  nlohmann::ordered_json ToJson() const;
};

// A pair audit's result (quant::PairVerifyResult), as the record's "pair_audit" and
// `verify-pair --json` write it.
struct PairAudit {
  std::string verdict;  // "lossless" | "mismatch"
  std::string source_format, derived_format, derived_kind;
  uint64_t quantized_tensors = 0, packed_bytes_compared = 0, value_blocks_compared = 0;
  uint64_t ignored_tensors_compared = 0, ignored_bytes_compared = 0;
  uint64_t fused_groups_checked = 0, zero_groups_canonicalized = 0;
  FindingSummary mismatches;
  FindingSummary warnings;  // never decide the verdict; written only when there are some

  nlohmann::ordered_json ToJson() const;
};

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_CHECK_RESULT_H_
