// Renders one evidence record for people: plain text, JSON, Markdown, or a self-contained HTML
// page with inline SVG plots (per-check `series`, e.g. per-layer scale span against the policy
// window, pair mismatches by kind). Input is the signed Statement as parsed JSON.
#ifndef CKPT_SERVICES_CLI_REPORT_RENDER_H_
#define CKPT_SERVICES_CLI_REPORT_RENDER_H_

#include <string>

#include "nlohmann/json.hpp"

namespace ckpt::cli {

struct ReportContext {
  uint64_t record_id = 0;
  std::string db;
  std::string log_origin;
  bool signature_ok = false;
  std::string signature;  // "valid, key …" or the reason it is not
};

std::string RenderText(const nlohmann::ordered_json& statement, const ReportContext& ctx);
std::string RenderJson(const nlohmann::ordered_json& statement, const ReportContext& ctx);
std::string RenderMarkdown(const nlohmann::ordered_json& statement, const ReportContext& ctx);
std::string RenderHtml(const nlohmann::ordered_json& statement, const ReportContext& ctx);

// One series ({"title","unit","limit"?,"warn"?,"points":[{"label","value"}]}) as an SVG bar chart.
std::string SvgBarChart(const nlohmann::ordered_json& series);

}  // namespace ckpt::cli

#endif  // CKPT_SERVICES_CLI_REPORT_RENDER_H_
