// A named finding of a quantization audit (a contract violation, an over-span group, a pair
// mismatch, a backend hazard) and a capped list of them that still counts everything.
// JSON holds integers and strings only: evidence records sign these bytes exactly.
#ifndef CKPT_CORE_QUANT_FINDING_H_
#define CKPT_CORE_QUANT_FINDING_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace ckpt::quant {

struct Finding {
  std::string code;     // stable kebab-case name, e.g. "over-span", "packed-bytes-differ"
  std::string tensor;   // tensor or module name, empty for checkpoint-level findings; raw
                        // here, written in the name encoding (core/text/name_encoding.h)
  int64_t row = -1;     // -1 when not about one row
  int64_t group = -1;   // scale group (32 for MXFP4, 16-block for NVFP4); -1 when n/a
  std::string message;  // one line for people
  std::map<std::string, int64_t> numbers;  // e.g. {"k": -25, "k_max": -3}

  nlohmann::json ToJson() const;
  std::string ToText() const;  // "code: tensor row R group G k=v: message"
};

// Keeps the first `cap` findings (in the order added) and counts all of them by code.
class FindingList {
 public:
  explicit FindingList(size_t cap = 64) : cap_(cap) {}
  void Add(Finding f);
  // Appends other's kept findings and adds its counts, prefixing their codes with `prefix`.
  void Merge(const FindingList& other, const std::string& prefix = "");
  uint64_t total() const { return total_; }
  size_t cap() const { return cap_; }
  uint64_t count(const std::string& code) const;
  const std::vector<Finding>& kept() const { return kept_; }
  const std::map<std::string, uint64_t>& by_code() const { return by_code_; }
  nlohmann::json ToJson() const;  // {"total", "by_code", "listed": [...], "cap"}
  // The list a split audit's part computed (core/audit/parts.h): its cap, kept findings and
  // counts. INVALID_ARGUMENT when they cannot be one list's (more kept than the cap, or more of
  // a code kept than counted).
  static absl::StatusOr<FindingList> Restore(size_t cap, std::vector<Finding> kept,
                                             std::map<std::string, uint64_t> by_code);

 private:
  size_t cap_;
  uint64_t total_ = 0;
  std::vector<Finding> kept_;
  std::map<std::string, uint64_t> by_code_;
};

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_FINDING_H_
