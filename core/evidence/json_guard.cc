#include "core/evidence/json_guard.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "core/text/json_dump.h"

namespace ckpt::evidence {
namespace {

// JSON pointer escaping (RFC 6901): '~' -> "~0", '/' -> "~1".
std::string Escape(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') out += "~0";
    else if (c == '/') out += "~1";
    else out += c;
  }
  return out;
}

template <typename Json>
absl::Status Walk(const Json& j, const std::string& pointer) {
  if (j.is_number_float()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "signed JSON must not contain floats: ", pointer.empty() ? "/" : pointer, " = ",
        DumpJson(j), " (write it as a decimal string)"));
  }
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (auto s = Walk(it.value(), pointer + "/" + Escape(it.key())); !s.ok()) return s;
    }
  } else if (j.is_array()) {
    for (size_t i = 0; i < j.size(); ++i) {
      if (auto s = Walk(j[i], absl::StrCat(pointer, "/", i)); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RejectFloats(const nlohmann::json& j) { return Walk(j, ""); }
absl::Status RejectFloats(const nlohmann::ordered_json& j) { return Walk(j, ""); }

}  // namespace ckpt::evidence
