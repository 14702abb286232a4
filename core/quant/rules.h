// The rule catalog: every finding code the checks emit (docs/rules.md is generated from it by
// `ckpt-audit rules --markdown`). One entry per code: why it exists, the upstream report it
// comes from, the fixture that triggers it and the test that asserts it. Adding a rule is one
// line in the table in rules.cc (docs/rules.md says how); tests/quant/rules_test.cc fails when a
// code emitted in core/ is missing here, or an entry here is emitted nowhere.
#ifndef CKPT_CORE_QUANT_RULES_H_
#define CKPT_CORE_QUANT_RULES_H_

#include <span>
#include <string_view>

namespace ckpt::quant {

// Which check emits the rule's findings.
enum class RuleKind {
  kContract,     // format detection and the config/tensor contract (format.h, x4t_sidecar.h)
  kScaleWindow,  // the MXFP4 -> NVFP4 scale-window policy: the verdict's reasons
  kHazard,       // a serving backend would lose precision; never changes a verdict
  kPair,         // a (source, derived) pair mismatch (pair_verify.h)
  kAudit,        // the audit's own checks: readability, weight files, block forward
  kLayout,       // a Hugging Face cache or download layout (core/io/hf_layout.h)
};

struct Rule {
  std::string_view id;        // the finding code, stable kebab-case
  RuleKind kind;
  std::string_view reason;    // one line: what it means and why it matters
  std::string_view upstream;  // "owner/repo#N" (issue or PR), or "own: <why>" when none
  std::string_view fixture;   // what triggers it: a fixture and its mutation
  std::string_view test;      // "tests/<dir>/<file>.cc Suite.Name" that asserts the code
  // Reported and recorded, never deciding a verdict (FormatReport::warnings).
  bool warning = false;
};

// Every rule in table order (grouped by kind); ids are unique.
std::span<const Rule> Rules();
// The rule with this id, or nullptr.
const Rule* FindRule(std::string_view id);
std::string_view RuleKindName(RuleKind kind);  // "contract", "scale-window", ...

}  // namespace ckpt::quant

#endif  // CKPT_CORE_QUANT_RULES_H_
