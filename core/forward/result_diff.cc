#include "core/forward/result_diff.h"

#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_format.h"

namespace ckpt::forward {
namespace {

const std::vector<double>* Doubles(const BlockResult& r, const std::string& name) {
  if (name == "router_logits") return &r.router_logits;
  if (name == "topk_weights") return &r.topk_weights;
  if (name == "latent_in") return &r.latent_in;
  if (name == "latent_out_normed") return &r.latent_out_normed;
  if (name == "routed_out") return &r.routed_out;
  if (name == "shared_out") return &r.shared_out;
  if (name == "output") return &r.output;
  return nullptr;
}

// Maps an IEEE value's bits to an integer line on which adjacent floats differ by one.
template <typename U>
int64_t OrderedBits(U bits) {
  constexpr U kSign = U(1) << (sizeof(U) * 8 - 1);
  return (bits & kSign) ? -static_cast<int64_t>(bits & ~kSign) : static_cast<int64_t>(bits);
}

uint64_t UlpDistance(double a, double b, Precision p) {
  if (p == Precision::kF64) {
    int64_t x = OrderedBits(std::bit_cast<uint64_t>(a)), y = OrderedBits(std::bit_cast<uint64_t>(b));
    return x > y ? static_cast<uint64_t>(x) - static_cast<uint64_t>(y)
                 : static_cast<uint64_t>(y) - static_cast<uint64_t>(x);
  }
  int64_t x = OrderedBits(std::bit_cast<uint32_t>(static_cast<float>(a)));
  int64_t y = OrderedBits(std::bit_cast<uint32_t>(static_cast<float>(b)));
  return static_cast<uint64_t>(x > y ? x - y : y - x);
}

constexpr const char* kBucketNames[kUlpBuckets] = {"0", "1", "2-3", "4-15", "16-255", "256+"};

}  // namespace

int UlpBucket(uint64_t ulps) {
  if (ulps == 0) return 0;
  if (ulps == 1) return 1;
  if (ulps < 4) return 2;
  if (ulps < 16) return 3;
  if (ulps < 256) return 4;
  return 5;
}

std::vector<std::string> BlockTensorNames() {
  return {"router_logits", "topk_ids",   "topk_weights", "latent_in",
          "latent_out_normed", "routed_out", "shared_out",   "output"};
}

std::vector<uint8_t> TensorBytes(const BlockResult& r, const std::string& name, Precision p) {
  std::vector<uint8_t> out;
  if (name == "topk_ids") {
    out.resize(r.topk_ids.size() * 4);
    if (!out.empty()) std::memcpy(out.data(), r.topk_ids.data(), out.size());  // no null pointers
    return out;
  }
  const std::vector<double>* v = Doubles(r, name);
  if (v == nullptr) return out;
  if (p == Precision::kF64) {
    out.resize(v->size() * 8);
    if (!out.empty()) std::memcpy(out.data(), v->data(), out.size());
  } else {
    out.resize(v->size() * 4);
    for (size_t i = 0; i < v->size(); ++i) {
      const float f = static_cast<float>((*v)[i]);
      std::memcpy(out.data() + 4 * i, &f, 4);
    }
  }
  return out;
}

bool ResultDiff::bitwise_equal() const {
  for (const TensorDiff& t : tensors) if (!t.bitwise_equal()) return false;
  return true;
}

const TensorDiff* ResultDiff::Find(const std::string& name) const {
  for (const TensorDiff& t : tensors) if (t.name == name) return &t;
  return nullptr;
}

ResultDiff CompareResults(const BlockResult& a, const BlockResult& b, Precision p) {
  ResultDiff d;
  for (const std::string& name : BlockTensorNames()) {
    TensorDiff t;
    t.name = name;
    if (name == "topk_ids") {
      t.elements = std::max(a.topk_ids.size(), b.topk_ids.size());
      for (size_t i = 0; i < t.elements; ++i) {
        const bool same = i < a.topk_ids.size() && i < b.topk_ids.size() &&
                          a.topk_ids[i] == b.topk_ids[i];
        t.differing += !same;
        t.ulp_histogram[same ? 0 : kUlpBuckets - 1]++;
      }
    } else {
      const std::vector<double>& x = *Doubles(a, name);
      const std::vector<double>& y = *Doubles(b, name);
      t.elements = std::max(x.size(), y.size());
      for (size_t i = 0; i < t.elements; ++i) {
        if (i >= x.size() || i >= y.size()) {
          t.differing++;
          t.ulp_histogram[kUlpBuckets - 1]++;
          continue;
        }
        const uint64_t ulps = UlpDistance(x[i], y[i], p);
        t.differing += ulps != 0;
        t.ulp_histogram[UlpBucket(ulps)]++;
        t.max_abs_diff = std::max(t.max_abs_diff, std::abs(x[i] - y[i]));
      }
    }
    d.tensors.push_back(t);
  }
  return d;
}

double MaxRelativeError(std::span<const double> a, std::span<const double> b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    num = std::max(num, std::abs(a[i] - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return den == 0 ? num : num / den;
}

std::string ExactDecimal(double v) { return absl::StrFormat("%.17g", v); }

nlohmann::json ToJson(const TensorDiff& d) {
  nlohmann::json hist = nlohmann::json::object();
  for (int i = 0; i < kUlpBuckets; ++i) hist[kBucketNames[i]] = d.ulp_histogram[i];
  return {{"bitwise_equal", d.bitwise_equal()},
          {"elements", d.elements},
          {"differing_elements", d.differing},
          {"max_abs_diff", ExactDecimal(d.max_abs_diff)},
          {"ulp_histogram", hist}};
}

}  // namespace ckpt::forward
