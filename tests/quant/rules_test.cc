// The rule catalog (core/quant/rules.h) cannot drift from the code: every kebab-case string
// literal in core/ is a catalogued finding code or listed below as something else, every
// catalogued id is emitted somewhere in core/, every named test exists, and docs/rules.md is
// exactly what `ckpt-audit rules --markdown` prints.
#include "core/quant/rules.h"

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace ckpt::quant {
namespace {

namespace fs = std::filesystem;

const fs::path kCheckout = ::ckpt::testing::kSourceDir;

std::string ReadText(const fs::path& p) {
  const std::vector<uint8_t> b = ::ckpt::testing::ReadAll(p);
  return std::string(b.begin(), b.end());
}

// Kebab-case string literals in core/ that are not finding codes, and what they are. A new
// literal must be catalogued (core/quant/rules.cc) or added here.
const std::set<std::string> kNotFindingCodes = {
    "16-255", "2-3", "4-15",                    // histogram bucket labels
    "bit-identical", "marlin-safe",             // verdict and series labels
    "build-contract",                           // prefix of build-contract-{schema,codec,family}
    "ckpt-audit", "ckpt-audit-evidence-record", // tool and record names
    "compressed-tensors", "mxfp4-pack-quantized", "nvfp4-pack-quantized", "gpt-oss-mxfp4",
    "x4t-container", "x4t-container-b",         // quant_method / format names
    "group-major-32-channel-v1", "x4t-adjacent-pair-fixed-stream-v1",  // layout / codec names
    "ecdsa-p256", "ecdsa-p384", "ecdsa-p521",   // key algorithms
    "hf-cache-snapshot", "hf-local-dir", "single-file",  // layout names
    "lossless-transcodable", "rejected-nan-scale", "not-mxfp4", "no-quantized-tensors",  // verdicts
    "malformed-bundle", "unsupported-bundle", "key-mismatch", "certificate-invalid",
    "signature-invalid", "statement-invalid", "files-differ",  // verify-signature reasons
    "oms-manifest-root", "source-ref",          // record subject names
    "scale-window", "verify-pair",              // policy name, progress stage
    "vllm-w13-collapse",                        // forward emulation name
    "pin-value",                                // an RFC 7512 URI attribute (refused)
    "missing-referrer", "malformed-referrer", "subject-mismatch",  // verify-oci reasons
    "dsse-envelope",                            // a Sigstore bundle content annotation
    "content-range", "content-type", "docker-content-digest", "oci-subject", "retry-after",
    "www-authenticate",                         // HTTP header names (core/oci/registry.cc)
    "oci-manifest",                             // record subject name (OCI audits)
};

// The string literals of one C++ source, comments skipped (raw strings included).
std::vector<std::string> StringLiterals(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, 2, "//") == 0) {
      i = s.find('\n', i);
      if (i == std::string::npos) break;
    } else if (s.compare(i, 2, "/*") == 0) {
      i = s.find("*/", i + 2);
      if (i == std::string::npos) break;
      i += 2;
    } else if (s.compare(i, 2, "R\"") == 0) {
      const size_t open = s.find('(', i + 2);
      if (open == std::string::npos) break;
      const std::string close = ")" + s.substr(i + 2, open - i - 2) + "\"";
      const size_t end = s.find(close, open);
      if (end == std::string::npos) break;
      out.push_back(s.substr(open + 1, end - open - 1));
      i = end + close.size();
    } else if (s[i] == '\'' || s[i] == '"') {
      const char quote = s[i];
      std::string lit;
      for (++i; i < s.size() && s[i] != quote; ++i) {
        if (s[i] == '\\' && i + 1 < s.size()) ++i;
        lit += s[i];
      }
      ++i;
      if (quote == '"') out.push_back(lit);
    } else {
      ++i;
    }
  }
  return out;
}

// Every string literal in core/ except the catalog itself, with the files holding it.
std::map<std::string, std::set<std::string>> CoreLiterals() {
  std::map<std::string, std::set<std::string>> out;
  for (const auto& e : fs::recursive_directory_iterator(kCheckout / "core")) {
    const fs::path& p = e.path();
    if (!e.is_regular_file() || (p.extension() != ".cc" && p.extension() != ".h" &&
                                 p.extension() != ".cu")) {
      continue;
    }
    if (p.filename() == "rules.cc") continue;
    for (const std::string& lit : StringLiterals(ReadText(p))) {
      out[lit].insert(fs::relative(p, kCheckout).string());
    }
  }
  return out;
}

bool IsKebab(const std::string& s) {
  static const std::regex kKebab("[a-z0-9]+(-[a-z0-9]+)+");
  return std::regex_match(s, kKebab);
}

TEST(Rules, IdsAreUniqueKebabCaseAndEveryRuleSaysWhy) {
  static const std::regex kId("[a-z][a-z0-9]*(-[a-z0-9]+)*");
  static const std::regex kUpstream("[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+#[0-9]+.*|own: .+");
  std::set<std::string_view> ids;
  for (const Rule& r : Rules()) {
    EXPECT_TRUE(ids.insert(r.id).second) << "duplicate id " << r.id;
    EXPECT_TRUE(std::regex_match(std::string(r.id), kId)) << r.id;
    EXPECT_FALSE(r.reason.empty()) << r.id;
    EXPECT_TRUE(std::regex_match(std::string(r.upstream), kUpstream)) << r.id << ": " << r.upstream;
    EXPECT_EQ(r.fixture.empty(), r.test.empty()) << r.id << ": a fixture goes with its test";
    EXPECT_EQ(FindRule(r.id), &r);
  }
  EXPECT_EQ(FindRule("no-such-rule"), nullptr);
}

TEST(Rules, EveryKebabCaseLiteralInCoreIsCataloguedOrKnownNotToBeACode) {
  std::vector<std::string> uncatalogued;
  for (const auto& [lit, files] : CoreLiterals()) {
    if (!IsKebab(lit) || FindRule(lit) != nullptr || kNotFindingCodes.contains(lit)) continue;
    uncatalogued.push_back(lit + " (" + *files.begin() + ")");
  }
  EXPECT_TRUE(uncatalogued.empty())
      << "string literals in core/ that look like finding codes but are not in the catalog: "
         "add a line to core/quant/rules.cc (docs/rules.md says how), or to kNotFindingCodes "
         "here if they are not finding codes:\n  "
      << ::testing::PrintToString(uncatalogued);
  for (const std::string& s : kNotFindingCodes) {
    EXPECT_EQ(FindRule(s), nullptr) << s << " is catalogued: remove it from kNotFindingCodes";
  }
}

// An id is emitted when it is a literal in core/, or when it is built as "<a>-<b>" from two
// literals (format.cc's manifest-* and build-contract-* codes).
TEST(Rules, EveryCataloguedIdIsEmittedInCore) {
  const auto literals = CoreLiterals();
  for (const Rule& r : Rules()) {
    const std::string id(r.id);
    bool found = literals.contains(id);
    for (size_t dash = id.find('-'); !found && dash != std::string::npos;
         dash = id.find('-', dash + 1)) {
      found = literals.contains(id.substr(0, dash)) && literals.contains(id.substr(dash + 1));
    }
    EXPECT_TRUE(found) << r.id << " is catalogued but no source in core/ emits it";
  }
}

TEST(Rules, EveryNamedTestExistsAndTheTestsMentionTheCode) {
  std::string all_tests;  // every test source and golden record, to find each id in
  for (const auto& e : fs::recursive_directory_iterator(kCheckout / "tests")) {
    const std::string ext = e.path().extension().string();
    const bool golden = e.path().parent_path().filename() == "golden";
    if (e.is_regular_file() && (ext == ".cc" || ext == ".h" || golden)) {
      all_tests += ReadText(e.path());
    }
  }
  static const std::regex kTest("(tests/[a-z0-9_/]+\\.cc) ([A-Za-z0-9_]+)\\.([A-Za-z0-9_]+)");
  for (const Rule& r : Rules()) {
    if (r.test.empty()) continue;
    std::smatch m;
    const std::string test(r.test);
    ASSERT_TRUE(std::regex_match(test, m, kTest)) << r.id << ": '" << r.test << "'";
    const fs::path file = kCheckout / m[1].str();
    ASSERT_TRUE(fs::exists(file)) << r.id << ": " << file;
    EXPECT_NE(ReadText(file).find("(" + m[2].str() + ", " + m[3].str() + ")"),
              std::string::npos)
        << r.id << ": no test " << m[2] << "." << m[3] << " in " << m[1];
    EXPECT_NE(all_tests.find("\"" + std::string(r.id) + "\""), std::string::npos)
        << r.id << ": no test source or golden record mentions it";
  }
}

// Code comments and docs cite docs/formats.md (the formats the code relies on) by section: no
// citation leaves the repository, and every cited section exists.
TEST(FormatsCitations, StayInTheRepositoryAndNameExistingSections) {
  std::set<int> sections;
  static const std::regex kHeading("\n## ([0-9]+)\\. ");
  const std::string formats = ReadText(kCheckout / "docs/formats.md");
  for (std::sregex_iterator it(formats.begin(), formats.end(), kHeading), end; it != end; ++it) {
    sections.insert(std::stoi((*it)[1].str()));
  }
  ASSERT_TRUE(sections.contains(1) && sections.contains(9) && sections.contains(10));
  // Written split so that this file does not match itself.
  const std::vector<std::string> outside = {"shared/" "docs", "/work/" "shared", "../" "shared/"};
  static const std::regex kCite("formats\\.md((?:(?: |, |\u2013|-)?\u00a7[0-9]+)+)");
  static const std::regex kSection("\u00a7([0-9]+)");
  size_t citations = 0;
  for (const char* dir : {"core", "services", "storage", "gpu", "tests", "docs", "deploy", "bench"}) {
    if (!fs::exists(kCheckout / dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(kCheckout / dir)) {
      const std::string rel = fs::relative(e.path(), kCheckout).string();
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || rel.starts_with("tests/data/") || rel.find("node_modules") !=
          std::string::npos || (ext != ".cc" && ext != ".h" && ext != ".cu" && ext != ".md" &&
                                ext != ".txt" && ext != ".sh" && ext != ".py" && ext != ".js")) {
        continue;
      }
      const std::string text = ReadText(e.path());
      for (const std::string& o : outside) {
        EXPECT_EQ(text.find(o), std::string::npos) << rel << " cites '" << o << "': cite docs/";
      }
      for (std::sregex_iterator it(text.begin(), text.end(), kCite), end; it != end; ++it) {
        const std::string list = (*it)[1].str();
        for (std::sregex_iterator s(list.begin(), list.end(), kSection); s != end; ++s) {
          ++citations;
          EXPECT_TRUE(sections.contains(std::stoi((*s)[1].str())))
              << rel << " cites docs/formats.md \u00a7" << (*s)[1] << ", which does not exist";
        }
      }
    }
  }
  EXPECT_GT(citations, 20u);  // the scan sees the existing citations
  const std::string readme = ReadText(kCheckout / "README.md");
  for (const std::string& o : outside) EXPECT_EQ(readme.find(o), std::string::npos) << o;
}

class RulesCli : public ::testing::Test {
 protected:
  ::ckpt::testing::CliResult Cli(const std::string& args) {
    return ::ckpt::testing::RunCli(args, dir_.path());
  }
  ::ckpt::testing::TempDir dir_;
};

TEST_F(RulesCli, ListsEveryRuleAsTextAndJson) {
  auto text = Cli("rules");
  ASSERT_EQ(text.rc, 0) << text.err;
  auto json = Cli("rules --json");
  ASSERT_EQ(json.rc, 0) << json.err;
  const nlohmann::json j = nlohmann::json::parse(json.out);
  ASSERT_EQ(j["rules"].size(), Rules().size());
  size_t i = 0;
  for (const Rule& r : Rules()) {
    EXPECT_NE(text.out.find(std::string(r.id) + " "), std::string::npos) << r.id;
    const nlohmann::json& e = j["rules"][i++];
    EXPECT_EQ(e["id"], std::string(r.id));
    EXPECT_EQ(e["kind"], std::string(RuleKindName(r.kind)));
    EXPECT_EQ(e["upstream"], std::string(r.upstream));
    EXPECT_EQ(e["test"], std::string(r.test));
  }
  EXPECT_NE(Cli("rules --json --markdown").rc, 0);
}

TEST_F(RulesCli, CommittedDocsRulesMdIsTheGeneratedText) {
  auto md = Cli("rules --markdown");
  ASSERT_EQ(md.rc, 0) << md.err;
  const std::string committed = ReadText(kCheckout / "docs/rules.md");
  if (committed != md.out) {
    size_t at = 0;  // the first differing line, for the message
    while (at < committed.size() && at < md.out.size() && committed[at] == md.out[at]) ++at;
    const size_t nl = at == 0 ? std::string::npos : committed.rfind('\n', at - 1);
    const size_t line = nl == std::string::npos ? 0 : nl + 1;
    ADD_FAILURE() << "docs/rules.md is stale from '" << committed.substr(line, 80)
                  << "': run `build/services/cli/ckpt-audit rules --markdown > docs/rules.md`";
  }
  for (const Rule& r : Rules()) {
    EXPECT_NE(md.out.find("| `" + std::string(r.id) + "` |"), std::string::npos) << r.id;
  }
}

}  // namespace
}  // namespace ckpt::quant
