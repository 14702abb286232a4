// A check's findings in the record's form (core/evidence/record.h).
#ifndef CKPT_CORE_AUDIT_FINDINGS_H_
#define CKPT_CORE_AUDIT_FINDINGS_H_

#include "core/evidence/record.h"
#include "core/quant/finding.h"

namespace ckpt::audit {

inline evidence::Finding FindingOf(const quant::Finding& f) {
  evidence::Finding e;
  e.code = f.code;
  e.message = f.message;
  e.tensor = f.tensor;
  if (f.row >= 0) e.row = f.row;
  if (f.group >= 0) e.group = f.group;
  e.numbers = f.numbers;
  return e;
}

inline void AddFindings(const quant::FindingList& list, evidence::CheckResult* c) {
  for (const quant::Finding& f : list.kept()) c->findings.push_back(FindingOf(f));
}

// Findings that are recorded without failing the check: written with "fails": false.
inline void AddWarnings(const quant::FindingList& list, evidence::CheckResult* c) {
  for (const quant::Finding& f : list.kept()) {
    c->findings.push_back(FindingOf(f));
    c->findings.back().fails = false;
  }
}

}  // namespace ckpt::audit

#endif  // CKPT_CORE_AUDIT_FINDINGS_H_
