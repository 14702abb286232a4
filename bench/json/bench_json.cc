// bench_json: what the bounded JSON reading costs over a plain parse of the same text.
//
// Generates safetensors headers of --tensors entries each (Kimi-K3-like names, F8/BF16/U8
// dtypes, 2-D shapes, tiling offsets, a __metadata__ map) and a config.json-shaped document of
// --config-objects objects, then times in the same run (median of --repeat, run alternately):
//   header  ParseSafetensorsHeader (bounded parse + every header rule) vs nlohmann::json::parse
//           of the same text (DOM parser, no limits, no checks)
//   config  ParseBoundedJson with ReadJsonFile's limits             vs nlohmann::json::parse
// and, as a reference for the parser this replaced, nlohmann's callback parser with a callback
// that accepts everything, for headers of at most --callback-max tensors (it is quadratic).
// Results: docs/PERFORMANCE.md, "JSON reading".
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "core/safetensors.h"
#include "core/text/json_parse.h"
#include "nlohmann/json.hpp"

namespace ckpt {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// A safetensors file's first bytes: length prefix and header; the data region is not needed
// because ParseSafetensorsHeader takes the file size separately.
struct Header {
  std::vector<uint8_t> prefix;
  uint64_t file_size = 0;
  std::string text;
};

Header MakeHeader(size_t tensors) {
  Header h;
  h.text = R"({"__metadata__":{"format":"pt","producer":"bench_json"})";
  uint64_t offset = 0;
  for (size_t i = 0; i < tensors; ++i) {
    const size_t layer = i / 384, expert = (i / 3) % 128;
    const char* part[] = {"w1", "w2", "w3"};
    const uint64_t rows = 64 + i % 7, cols = 32;
    const uint64_t bytes = rows * cols;
    absl::StrAppend(&h.text, ",\"language_model.model.layers.", layer,
                    ".block_sparse_moe.experts.", expert, ".", part[i % 3],
                    ".weight\":{\"dtype\":\"U8\",\"shape\":[", rows, ",", cols,
                    "],\"data_offsets\":[", offset, ",", offset + bytes, "]}");
    offset += bytes;
  }
  h.text += "}";
  const uint64_t n = h.text.size();
  h.prefix.resize(8);
  for (int i = 0; i < 8; ++i) h.prefix[i] = static_cast<uint8_t>(n >> (8 * i));
  h.prefix.insert(h.prefix.end(), h.text.begin(), h.text.end());
  h.file_size = 8 + n + offset;
  return h;
}

// config.json-shaped: a few scalars and maps, then `objects` small objects in an array.
std::string MakeConfig(size_t objects) {
  std::string text =
      R"({"architectures":["KimiForCausalLM"],"model_type":"kimi","hidden_size":7168,)"
      R"("quantization_config":{"quant_method":"compressed-tensors","format":"mxfp4"},)"
      R"("layer_notes":[)";
  for (size_t i = 0; i < objects; ++i) absl::StrAppend(&text, i ? "," : "", "{\"id\":", i, "}");
  text += "]}";
  return text;
}

double MedianSeconds(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Runs each function `repeat` times, interleaved, and returns the median seconds of each.
std::vector<double> Time(const std::vector<std::function<void()>>& fns, int repeat) {
  std::vector<std::vector<double>> secs(fns.size());
  for (int r = 0; r < repeat; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) {
      auto start = Clock::now();
      fns[i]();
      secs[i].push_back(std::chrono::duration<double>(Clock::now() - start).count());
    }
  }
  std::vector<double> out;
  for (auto& s : secs) out.push_back(MedianSeconds(s));
  return out;
}

void Require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "bench_json: %s\n", what);
    std::exit(1);
  }
}

}  // namespace
}  // namespace ckpt

int main(int argc, char** argv) {
  using namespace ckpt;
  CLI::App app("bounded JSON reading vs a plain nlohmann parse of the same text");
  std::string tensors_arg = "10000,40000,100000";
  size_t config_objects = 40000;
  size_t callback_max = 10000;
  int repeat = 5;
  app.add_option("--tensors", tensors_arg, "header sizes (tensors), comma-separated");
  app.add_option("--config-objects", config_objects, "objects in the config document");
  app.add_option("--callback-max", callback_max,
                 "largest header also timed with the callback parser (0: none)");
  app.add_option("--repeat", repeat, "timed runs per variant (median)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  std::printf("%-28s %10s %12s %12s %8s %14s\n", "input", "KB", "bounded s", "nlohmann s",
              "ratio", "callback s");
  for (const std::string& t : std::vector<std::string>(absl::StrSplit(tensors_arg, ','))) {
    const size_t n = std::stoul(t);
    const Header h = MakeHeader(n);
    size_t parsed = 0;
    auto times = Time({[&] {
                         auto r = ParseSafetensorsHeader(h.prefix, h.file_size, "bench");
                         Require(r.ok(), "generated header rejected");
                         parsed = r->tensors.size();
                       },
                       [&] { Require(json::parse(h.text).size() == n + 1, "plain parse"); }},
                      repeat);
    Require(parsed == n, "tensor count");
    std::string callback = "-";
    if (n <= callback_max) {
      auto accept_all = [](int, json::parse_event_t, json&) { return true; };
      auto cb = Time({[&] { Require(json::parse(h.text, accept_all).size() == n + 1, "cb"); }}, 1);
      callback = absl::StrFormat("%.4f", cb[0]);
    }
    std::printf("%-28s %10zu %12.4f %12.4f %8.2f %14s\n",
                absl::StrCat("header, ", n, " tensors").c_str(), h.text.size() / 1024, times[0],
                times[1], times[0] / times[1], callback.c_str());
  }
  const std::string config = MakeConfig(config_objects);
  JsonLimits limits;  // ReadJsonFile's: depth 64
  auto times = Time({[&] { Require(ParseBoundedJson(config, "config.json", limits).ok(), "cfg"); },
                     [&] { Require(json::parse(config).is_object(), "plain config"); }},
                    repeat);
  auto accept_all = [](int, json::parse_event_t, json&) { return true; };
  auto cb = Time({[&] { Require(json::parse(config, accept_all).is_object(), "cb config"); }}, 1);
  std::printf("%-28s %10zu %12.4f %12.4f %8.2f %14.4f\n",
              absl::StrCat("config, ", config_objects, " objects").c_str(), config.size() / 1024,
              times[0], times[1], times[0] / times[1], cb[0]);
  return 0;
}
