// Decodes an 8-bit RGB/RGBA PNG (as Chromium writes screenshots) far enough to count colours,
// so a test can tell a rendered page from a blank one.
#ifndef CKPT_TESTS_EVIDENCE_PNG_PROBE_H_
#define CKPT_TESTS_EVIDENCE_PNG_PROBE_H_

#include <zlib.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

namespace ckpt::testing {

struct PngPixels {
  uint32_t width = 0, height = 0;
  std::map<uint32_t, uint64_t> colours;  // 0xRRGGBB -> pixel count
  std::string error;
};

inline uint32_t Be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | p[3];
}

inline PngPixels DecodePng(const std::vector<uint8_t>& file) {
  PngPixels out;
  static const uint8_t kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (file.size() < 8 || !std::equal(kSig, kSig + 8, file.begin())) {
    out.error = "not a PNG";
    return out;
  }
  std::vector<uint8_t> idat;
  int bit_depth = 0, colour_type = 0;
  for (size_t pos = 8; pos + 12 <= file.size();) {
    uint32_t len = Be32(&file[pos]);
    std::string type(reinterpret_cast<const char*>(&file[pos + 4]), 4);
    const uint8_t* data = &file[pos + 8];
    if (pos + 12 + len > file.size()) break;
    if (type == "IHDR") {
      out.width = Be32(data);
      out.height = Be32(data + 4);
      bit_depth = data[8];
      colour_type = data[9];
    } else if (type == "IDAT") {
      idat.insert(idat.end(), data, data + len);
    }
    pos += 12 + len;
  }
  int channels = colour_type == 2 ? 3 : colour_type == 6 ? 4 : 0;
  if (bit_depth != 8 || channels == 0) {
    out.error = "unsupported PNG layout";
    return out;
  }
  size_t stride = size_t{out.width} * channels;
  std::vector<uint8_t> raw((stride + 1) * out.height);
  uLongf raw_len = raw.size();
  if (uncompress(raw.data(), &raw_len, idat.data(), idat.size()) != Z_OK ||
      raw_len != raw.size()) {
    out.error = "bad IDAT stream";
    return out;
  }
  std::vector<uint8_t> prev(stride, 0), cur(stride);
  for (uint32_t y = 0; y < out.height; ++y) {
    const uint8_t* line = &raw[y * (stride + 1)];
    uint8_t filter = line[0];
    for (size_t i = 0; i < stride; ++i) {
      int a = i >= static_cast<size_t>(channels) ? cur[i - channels] : 0;
      int b = prev[i];
      int c = i >= static_cast<size_t>(channels) ? prev[i - channels] : 0;
      int x = line[1 + i], pred = 0;
      if (filter == 1) pred = a;
      else if (filter == 2) pred = b;
      else if (filter == 3) pred = (a + b) / 2;
      else if (filter == 4) {
        int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
        pred = pa <= pb && pa <= pc ? a : pb <= pc ? b : c;
      }
      cur[i] = static_cast<uint8_t>(x + pred);
    }
    for (uint32_t px = 0; px < out.width; ++px) {
      const uint8_t* p = &cur[px * channels];
      out.colours[(uint32_t{p[0]} << 16) | (uint32_t{p[1]} << 8) | p[2]]++;
    }
    prev.swap(cur);
  }
  return out;
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_EVIDENCE_PNG_PROBE_H_
