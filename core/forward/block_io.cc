#include "core/forward/block_io.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "core/forward/result_diff.h"
#include "core/quant/codecs.h"
#include "core/safetensors.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt::forward {

absl::StatusOr<BlockInput> ReadBlockInput(const std::string& path, int hidden) {
  auto f = SafetensorsFile::Open(path);
  if (!f.ok()) return f.status();
  const TensorInfo* t = (*f)->Find("input");
  if (t == nullptr || t->dtype != DType::kBF16 || t->shape.size() != 2 ||
      t->shape[1] != static_cast<uint64_t>(hidden) || t->shape[0] == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": expected tensor 'input' BF16 [T, ", hidden, "] with T > 0"));
  }
  BlockInput in;
  in.tokens = static_cast<int64_t>(t->shape[0]);
  std::span<const uint8_t> b = (*f)->Bytes(*t);
  in.values.resize(t->num_elements());
  for (size_t i = 0; i < in.values.size(); ++i) {
    uint16_t v;
    std::memcpy(&v, b.data() + 2 * i, 2);
    in.values[i] = quant::DecodeBF16(v);
  }
  return in;
}

BlockInput SeededInput(int64_t tokens, int hidden, uint64_t seed) {
  BlockInput in;
  in.tokens = tokens;
  in.values.resize(tokens * hidden);
  for (size_t i = 0; i < in.values.size(); ++i) {
    uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;  // splitmix64
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;  // [0, 1)
    in.values[i] = quant::DecodeBF16(quant::EncodeBF16(static_cast<float>(4.0 * u - 2.0)));
  }
  return in;
}

std::vector<uint8_t> InputBytes(const BlockInput& in) {
  std::vector<uint8_t> out(in.values.size() * 2);
  for (size_t i = 0; i < in.values.size(); ++i) {
    const uint16_t v = quant::EncodeBF16(in.values[i]);
    std::memcpy(out.data() + 2 * i, &v, 2);
  }
  return out;
}

absl::Status WriteBlockResult(const std::string& path, const BlockConfig& config,
                              const BlockInput& input, const BlockResult& result, Precision p,
                              const std::map<std::string, std::string>& metadata) {
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  const int64_t T = result.tokens, K = config.top_k, L = config.latent;
  const std::string fdtype = p == Precision::kF64 ? "F64" : "F32";
  std::vector<Entry> entries = {{"input", "BF16", {T, config.hidden}, InputBytes(input)}};
  const std::map<std::string, std::vector<int64_t>> shapes = {
      {"router_logits", {T, config.experts}}, {"topk_ids", {T, K}},
      {"topk_weights", {T, K}},               {"latent_in", {T, L}},
      {"latent_out_normed", {T, L}},          {"routed_out", {T, config.hidden}},
      {"shared_out", {T, config.hidden}},     {"output", {T, config.hidden}}};
  for (const std::string& name : BlockTensorNames()) {
    if (L == 0 && name.rfind("latent", 0) == 0) continue;
    entries.push_back({name, name == "topk_ids" ? "I32" : fdtype, shapes.at(name),
                       TensorBytes(result, name, p)});
  }
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Entry& e : entries) {
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape},
                      {"data_offsets", {offset, offset + e.bytes.size()}}};
    offset += e.bytes.size();
  }
  std::string h = DumpJson(header);
  h.append((8 - h.size() % 8) % 8, ' ');  // keep the data buffer 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t n = h.size();
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(h.data(), static_cast<std::streamsize>(h.size()));
  for (const Entry& e : entries) {
    out.write(reinterpret_cast<const char*>(e.bytes.data()),
              static_cast<std::streamsize>(e.bytes.size()));
  }
  out.close();
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace ckpt::forward
