#include "services/cli/report_render.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/text/json_dump.h"

namespace ckpt::cli {
namespace {

using ojson = nlohmann::ordered_json;

std::string Str(const ojson& j, const char* key, const std::string& dflt = "") {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  return it->is_string() ? it->get<std::string>() : it->dump();
}

// The bound source of a pair audit: its root and OMS manifest ROOT.
std::string SourceLine(const ojson& p) {
  if (!p.contains("source") || !p["source"].is_object()) return "";
  return absl::StrCat(Str(p["source"], "root"), " (manifest ROOT ", Str(p["source"], "manifest_root"), ")");
}

// Where the audited trees came from: the Hugging Face layouts found and the model and source
// refs (docs/hf-layouts.md), as (label, value) rows; empty values are left out.
std::vector<std::pair<std::string, std::string>> OriginRows(const ojson& p) {
  std::vector<std::pair<std::string, std::string>> rows;
  auto checks = p.find("checks");
  if (checks != p.end() && checks->is_array()) {
    for (const ojson& c : *checks) {
      const std::string name = Str(c, "name");
      if ((name == "hf_layout" || name == "source_hf_layout") && c.contains("details") &&
          c["details"].is_object()) {
        rows.push_back({name == "hf_layout" ? "layout" : "source layout",
                        Str(c["details"], "layout")});
      }
    }
  }
  auto refs = p.find("refs");
  if (refs != p.end() && refs->is_object()) {
    if (!Str(*refs, "model_ref").empty()) rows.push_back({"model ref", Str(*refs, "model_ref")});
    if (!Str(*refs, "source_ref").empty()) rows.push_back({"source ref", Str(*refs, "source_ref")});
  }
  return rows;
}

std::string Esc(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

// A finding as one line: "code: tensor row R group G: message" from whatever fields it has.
std::string FindingLine(const ojson& f) {
  if (!f.is_object()) return DumpJson(f);
  std::string line = Str(f, "code", "finding");
  if (f.contains("tensor") && !Str(f, "tensor").empty()) absl::StrAppend(&line, ": ", Str(f, "tensor"));
  if (f.contains("row") && f["row"].is_number_integer() && f["row"].get<int64_t>() >= 0) {
    absl::StrAppend(&line, " row ", f["row"].get<int64_t>());
  }
  if (f.contains("group") && f["group"].is_number_integer() && f["group"].get<int64_t>() >= 0) {
    absl::StrAppend(&line, " group ", f["group"].get<int64_t>());
  }
  if (f.contains("message")) absl::StrAppend(&line, ": ", Str(f, "message"));
  if (f.contains("fails") && f["fails"].is_boolean() && !f["fails"].get<bool>()) {
    line += " (warning: does not fail the check)";
  }
  return line;
}

const ojson& Predicate(const ojson& st) {
  static const ojson kEmpty = ojson::object();
  auto it = st.find("predicate");
  return it != st.end() && it->is_object() ? *it : kEmpty;
}

const ojson& Checks(const ojson& p) {
  static const ojson kEmpty = ojson::array();
  auto it = p.find("checks");
  return it != p.end() && it->is_array() ? *it : kEmpty;
}

}  // namespace

std::string RenderText(const ojson& st, const ReportContext& ctx) {
  const ojson& p = Predicate(st);
  std::string out = absl::StrFormat("Audit record %d: %s\n", ctx.record_id, Str(p, "verdict"));
  absl::StrAppend(&out, "  root       ", Str(p, "root"), "\n");
  if (!SourceLine(p).empty()) absl::StrAppend(&out, "  source     ", SourceLine(p), "\n");
  for (const auto& [label, value] : OriginRows(p)) {
    absl::StrAppend(&out, "  ", absl::StrFormat("%-11s", label), value, "\n");
  }
  absl::StrAppend(&out, "  policy     ", Str(p["policy"], "name"), " v", Str(p["policy"], "version"), "\n");
  absl::StrAppend(&out, "  time       ", Str(p, "started_at"), " .. ", Str(p, "finished_at"), "\n");
  absl::StrAppend(&out, "  signature  ", ctx.signature_ok ? "" : "NOT VERIFIED: ", ctx.signature, "\n");
  const ojson& env = p.contains("environment") ? p["environment"] : ojson::object();
  absl::StrAppend(&out, "  tool       ", Str(env, "tool"), " ", Str(env, "tool_version"), " (",
                  Str(env, "git_commit"), ") on ", Str(env, "host"), ", ", Str(env, "cpu_model"),
                  "\n");
  absl::StrAppend(&out, "  subjects   ", st.contains("subject") ? st["subject"].size() : 0, "\n");
  for (const ojson& c : Checks(p)) {
    absl::StrAppend(&out, "\n[", Str(c, "verdict"), "] ", Str(c, "name"), "\n");
    if (c.contains("counts")) {
      for (auto it = c["counts"].begin(); it != c["counts"].end(); ++it) {
        absl::StrAppend(&out, "    ", it.key(), " = ", DumpJson(it.value()), "\n");
      }
    }
    const ojson& fs = c.contains("findings") ? c["findings"] : ojson::array();
    if (!fs.empty()) {
      absl::StrAppend(&out, "    findings (", Str(c, "findings_total"), " total, first ", fs.size(), "):\n");
      for (const ojson& f : fs) absl::StrAppend(&out, "      - ", FindingLine(f), "\n");
    }
  }
  return out;
}

std::string RenderJson(const ojson& st, const ReportContext& ctx) {
  ojson j = {{"record_id", ctx.record_id},
             {"db", ctx.db},
             {"log_origin", ctx.log_origin},
             {"signature_ok", ctx.signature_ok},
             {"signature", ctx.signature},
             {"statement", st}};
  return DumpJson(j, 2) + "\n";
}

std::string RenderMarkdown(const ojson& st, const ReportContext& ctx) {
  const ojson& p = Predicate(st);
  std::string out = absl::StrFormat("# Audit record %d: **%s**\n\n", ctx.record_id, Str(p, "verdict"));
  absl::StrAppend(&out, "| | |\n| --- | --- |\n");
  absl::StrAppend(&out, "| root | `", Str(p, "root"), "` |\n");
  if (!SourceLine(p).empty()) absl::StrAppend(&out, "| source | `", SourceLine(p), "` |\n");
  for (const auto& [label, value] : OriginRows(p)) {
    absl::StrAppend(&out, "| ", label, " | `", value, "` |\n");
  }
  absl::StrAppend(&out, "| policy | ", Str(p["policy"], "name"), " v", Str(p["policy"], "version"), " |\n");
  absl::StrAppend(&out, "| started | ", Str(p, "started_at"), " |\n| finished | ", Str(p, "finished_at"), " |\n");
  absl::StrAppend(&out, "| signature | ", ctx.signature_ok ? "valid" : "**NOT VERIFIED**", ": ", ctx.signature, " |\n");
  absl::StrAppend(&out, "| log | ", ctx.log_origin, " (", ctx.db, ") |\n\n");
  absl::StrAppend(&out, "## Checks\n\n| check | verdict | findings |\n| --- | --- | --- |\n");
  for (const ojson& c : Checks(p)) {
    absl::StrAppend(&out, "| ", Str(c, "name"), " | ", Str(c, "verdict"), " | ", Str(c, "findings_total", "0"), " |\n");
  }
  for (const ojson& c : Checks(p)) {
    absl::StrAppend(&out, "\n### ", Str(c, "name"), " (", Str(c, "verdict"), ")\n\n");
    if (c.contains("counts") && !c["counts"].empty()) {
      absl::StrAppend(&out, "| count | value |\n| --- | --- |\n");
      for (auto it = c["counts"].begin(); it != c["counts"].end(); ++it) {
        absl::StrAppend(&out, "| ", it.key(), " | ", DumpJson(it.value()), " |\n");
      }
    }
    if (c.contains("findings")) {
      for (const ojson& f : c["findings"]) absl::StrAppend(&out, "\n- ", FindingLine(f));
      if (!c["findings"].empty()) out += "\n";
    }
  }
  absl::StrAppend(&out, "\n## Subjects\n\n| name | sha256 |\n| --- | --- |\n");
  if (st.contains("subject")) {
    for (const ojson& s : st["subject"]) {
      absl::StrAppend(&out, "| ", Str(s, "name"), " | `", Str(s["digest"], "sha256"), "` |\n");
    }
  }
  return out;
}

std::string SvgBarChart(const ojson& series) {
  const ojson& pts = series.contains("points") ? series["points"] : ojson::array();
  const int W = 820, L = 56, R = 130, T = 36;  // R: room for the limit lines' labels
  const int pw = W - L - R, ph = 188;
  bool has_limit = series.contains("limit") && series["limit"].is_number_integer();
  bool has_warn = series.contains("warn") && series["warn"].is_number_integer();
  int64_t limit = has_limit ? series["limit"].get<int64_t>() : 0;
  int64_t warn = has_warn ? series["warn"].get<int64_t>() : 0;
  int64_t vmax = 1, vmin = 0;
  for (const ojson& p : pts) {
    int64_t v = p.value("value", int64_t{0});
    vmax = std::max(vmax, v);
    vmin = std::min(vmin, v);
  }
  if (has_limit) vmax = std::max(vmax, limit);
  if (has_warn) vmax = std::max(vmax, warn);
  vmax = vmax + std::max<int64_t>(1, vmax / 8);  // headroom for value labels
  size_t n = std::max<size_t>(pts.size(), 1);
  double slot = static_cast<double>(pw) / n;
  size_t longest = 0;
  for (const ojson& p : pts) longest = std::max(longest, Str(p, "label").size());
  bool rotate = longest * 6.5 > slot * 0.95;  // ~6.5 px per character at 11 px
  // Rotated labels hang below the axis at 45 degrees: leave room for the longest (capped).
  const int B = rotate ? 24 + static_cast<int>(std::min<size_t>(longest, 40) * 6.5 * 0.72) : 40;
  const int H = T + ph + B;
  auto y = [&](int64_t v) { return T + ph - static_cast<double>(v - vmin) * ph / (vmax - vmin); };
  std::string svg = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" width=\"%d\" height=\"%d\" "
      "role=\"img\" font-family=\"DejaVu Sans, sans-serif\">\n"
      "<text x=\"%d\" y=\"20\" font-size=\"15\" font-weight=\"bold\" fill=\"#222\">%s</text>\n",
      W, H, W, H, L, Esc(Str(series, "title")));
  // Horizontal grid with five integer ticks.
  for (int i = 0; i <= 4; ++i) {
    int64_t v = vmin + (vmax - vmin) * i / 4;
    double yy = y(v);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e6ea\"/>"
                          "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\" "
                          "fill=\"#555\">%d</text>\n",
                          L, L + pw, yy, yy, L - 6, yy + 4, v);
  }
  double bw = std::clamp(slot * 0.7, 2.0, 70.0);

  size_t label_every = pts.size() > 40 ? (pts.size() + 39) / 40 : 1;
  for (size_t i = 0; i < pts.size(); ++i) {
    int64_t v = pts[i].value("value", int64_t{0});
    std::string label = Str(pts[i], "label");
    const char* color = has_limit && v > limit ? "#d64545" : has_warn && v >= warn ? "#e0a030" : "#3a7bd5";
    double x = L + slot * i + (slot - bw) / 2;
    double top = y(std::max<int64_t>(v, 0)), bottom = y(std::min<int64_t>(v, 0));
    absl::StrAppendFormat(&svg,
                          "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" "
                          "rx=\"2\"><title>%s: %d</title></rect>\n",
                          x, top, bw, std::max(1.0, bottom - top), color, Esc(label), v);
    if (pts.size() <= 30) {
      absl::StrAppendFormat(&svg,
                            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" "
                            "fill=\"#333\">%d</text>\n",
                            x + bw / 2, top - 4, v);
    }
    if (i % label_every == 0) {
      double lx = x + bw / 2, ly = T + ph + 14;
      if (rotate) {
        absl::StrAppendFormat(&svg,
                              "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\" "
                              "fill=\"#444\" transform=\"rotate(-45 %.1f %.1f)\">%s</text>\n",
                              lx, ly, lx, ly, Esc(label));
      } else {
        absl::StrAppendFormat(&svg,
                              "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" "
                              "fill=\"#444\">%s</text>\n",
                              lx, ly, Esc(label));
      }
    }
  }
  auto hline = [&](int64_t v, const char* color, const std::string& text) {
    double yy = y(v);
    absl::StrAppendFormat(&svg,
                          "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
                          "stroke-width=\"2\" stroke-dasharray=\"6 4\"/>"
                          "<text x=\"%d\" y=\"%.1f\" font-size=\"11\" fill=\"%s\">%s</text>\n",
                          L, L + pw, yy, yy, color, L + pw + 6, yy + 4, color, Esc(text));
  };
  if (has_limit) hline(limit, "#d64545", absl::StrCat("policy window ", limit));
  if (has_warn) hline(warn, "#e0a030", absl::StrCat("backend hazard ", warn));
  absl::StrAppendFormat(&svg,
                        "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#888\"/>\n"
                        "<text x=\"14\" y=\"%d\" font-size=\"11\" fill=\"#555\" "
                        "transform=\"rotate(-90 14 %d)\" text-anchor=\"middle\">%s</text>\n</svg>\n",
                        L, L + pw, y(0), y(0), T + ph / 2, T + ph / 2, Esc(Str(series, "unit")));
  return svg;
}

std::string RenderHtml(const ojson& st, const ReportContext& ctx) {
  const ojson& p = Predicate(st);
  std::string verdict = Str(p, "verdict");
  bool pass = verdict == "pass";
  std::string out = absl::StrCat(
      "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>ckpt-audit record ",
      ctx.record_id, ": ", Esc(verdict), "</title>\n<style>\n"
      "body{font-family:'DejaVu Sans',system-ui,sans-serif;margin:0;background:#f5f6f8;color:#222}\n"
      "header{padding:22px 32px;color:#fff;background:", pass ? "#2e8b57" : "#c0392b", "}\n"
      "header h1{margin:0;font-size:26px} header p{margin:6px 0 0;opacity:.9}\n"
      "main{padding:18px 32px;max-width:1100px}\n"
      ".card{background:#fff;border-radius:8px;box-shadow:0 1px 3px rgba(0,0,0,.12);padding:16px 20px;margin:0 0 18px}\n"
      ".card h2{margin:0 0 10px;font-size:18px}\n"
      "table{border-collapse:collapse;font-size:13px} td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:left;vertical-align:top}\n"
      "code{font-size:12px;word-break:break-all}\n"
      ".badge{display:inline-block;padding:2px 10px;border-radius:12px;font-size:12px;font-weight:bold;color:#fff}\n"
      ".pass{background:#2e8b57}.fail{background:#c0392b}.skipped{background:#8a8f98}\n"
      ".tiles{display:flex;gap:12px;flex-wrap:wrap}.tile{flex:1;min-width:160px;border-radius:8px;padding:12px;color:#fff}\n"
      ".tile b{display:block;font-size:15px;overflow-wrap:anywhere}.tile span{font-size:12px;opacity:.9}\n"
      "ul.findings{font-family:monospace;font-size:12px;margin:8px 0 0;padding-left:18px}\n"
      "</style></head><body>\n<header><h1>", pass ? "PASS" : "FAIL", " &mdash; ", Esc(Str(p, "root")),
      "</h1><p>record ", ctx.record_id, " &middot; policy ", Esc(Str(p["policy"], "name")), " v",
      Esc(Str(p["policy"], "version")), " &middot; finished ", Esc(Str(p, "finished_at")),
      "</p></header>\n<main>\n");
  // Overview: one tile per check.
  absl::StrAppend(&out, "<div class=\"card\"><h2>Checks</h2><div class=\"tiles\">\n");
  for (const ojson& c : Checks(p)) {
    std::string v = Str(c, "verdict");
    absl::StrAppend(&out, "<div class=\"tile ", Esc(v), "\"><b>", Esc(Str(c, "name")), "</b><span>",
                    Esc(v), " &middot; ", Esc(Str(c, "findings_total", "0")), " findings</span></div>\n");
  }
  absl::StrAppend(&out, "</div></div>\n");
  // Plots and details per check.
  for (const ojson& c : Checks(p)) {
    std::string v = Str(c, "verdict");
    absl::StrAppend(&out, "<div class=\"card\"><h2>", Esc(Str(c, "name")), " <span class=\"badge ",
                    Esc(v), "\">", Esc(v), "</span></h2>\n");
    if (c.contains("series")) {
      for (const ojson& s : c["series"]) out += SvgBarChart(s);
    }
    if (c.contains("counts") && !c["counts"].empty()) {
      absl::StrAppend(&out, "<table>");
      for (auto it = c["counts"].begin(); it != c["counts"].end(); ++it) {
        absl::StrAppend(&out, "<tr><td>", Esc(it.key()), "</td><td>", Esc(DumpJson(it.value())),
                        "</td></tr>");
      }
      absl::StrAppend(&out, "</table>\n");
    }
    if (c.contains("findings") && !c["findings"].empty()) {
      absl::StrAppend(&out, "<ul class=\"findings\">");
      for (const ojson& f : c["findings"]) absl::StrAppend(&out, "<li>", Esc(FindingLine(f)), "</li>");
      absl::StrAppend(&out, "</ul>\n");
    }
    absl::StrAppend(&out, "</div>\n");
  }
  // Provenance.
  const ojson& env = p.contains("environment") ? p["environment"] : ojson::object();
  absl::StrAppend(&out, "<div class=\"card\"><h2>Provenance</h2><table>\n",
                  "<tr><td>signature</td><td>", ctx.signature_ok ? "" : "<b>NOT VERIFIED</b>: ",
                  Esc(ctx.signature), "</td></tr>\n",
                  "<tr><td>log</td><td>", Esc(ctx.log_origin), " (", Esc(ctx.db), ")</td></tr>\n",
                  "<tr><td>started / finished</td><td>", Esc(Str(p, "started_at")), " / ",
                  Esc(Str(p, "finished_at")), "</td></tr>\n");
  if (!SourceLine(p).empty()) {
    absl::StrAppend(&out, "<tr><td>source</td><td>", Esc(SourceLine(p)), "</td></tr>\n");
  }
  for (const auto& [label, value] : OriginRows(p)) {
    absl::StrAppend(&out, "<tr><td>", Esc(label), "</td><td>", Esc(value), "</td></tr>\n");
  }
  for (auto it = env.begin(); it != env.end(); ++it) {
    absl::StrAppend(&out, "<tr><td>", Esc(it.key()), "</td><td>",
                    Esc(it.value().is_string() ? it.value().get<std::string>()
                                               : DumpJson(it.value())),
                    "</td></tr>\n");
  }
  absl::StrAppend(&out, "</table></div>\n<div class=\"card\"><h2>Subjects</h2><table>\n");
  if (st.contains("subject")) {
    for (const ojson& s : st["subject"]) {
      absl::StrAppend(&out, "<tr><td>", Esc(Str(s, "name")), "</td><td><code>",
                      Esc(Str(s["digest"], "sha256")), "</code></td></tr>\n");
    }
  }
  absl::StrAppend(&out, "</table></div>\n</main></body></html>\n");
  return out;
}

}  // namespace ckpt::cli
