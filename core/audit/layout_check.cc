#include "core/audit/layout_check.h"

namespace ckpt::audit {

evidence::CheckResult LayoutCheck(const std::string& name, const LayoutInfo& layout,
                                  const TreeImage& image) {
  evidence::CheckResult c;
  c.name = name;
  c.verdict = evidence::Verdict::kPass;
  int64_t failing = 0;
  for (const LayoutFinding& f : CheckLayout(layout, image)) {
    if (f.fails) {
      c.verdict = evidence::Verdict::kFail;
      ++failing;
    }
    evidence::Finding e;
    e.code = f.code;
    e.path = f.path;
    e.message = f.message;
    e.fails = f.fails;
    c.findings.push_back(std::move(e));
  }
  c.findings_total = c.findings.size();
  c.counts["files"] = static_cast<int64_t>(image.files.size());
  c.counts["links_followed"] = static_cast<int64_t>(layout.links_followed);
  c.counts["failing_findings"] = failing;
  c.details.Set("layout", std::string(TreeLayoutName(layout.kind)));
  if (!layout.repo_id.empty()) c.details.Set("repo_id", layout.repo_id);
  if (!layout.commit.empty()) c.details.Set("commit", layout.commit);
  if (layout.kind == TreeLayout::kHubSnapshot) {
    c.details.Set("refs_main", layout.refs_main);
    c.details.Set("snapshot_is_main",
                  !layout.refs_main.empty() && layout.refs_main == layout.commit);
  }
  if (layout.kind == TreeLayout::kLocalDir) {
    c.counts["metadata_files"] = static_cast<int64_t>(layout.metadata.size());
  }
  c.details.Set("model_ref", layout.ModelRef());
  return c;
}

}  // namespace ckpt::audit
