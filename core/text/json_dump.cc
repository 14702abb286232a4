#include "core/text/json_dump.h"

#include "core/text/name_encoding.h"

namespace ckpt {
namespace {

template <typename Json>
bool AllStringsValid(const Json& j) {
  if (j.is_string()) return IsValidUtf8(j.template get_ref<const typename Json::string_t&>());
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (!IsValidUtf8(it.key()) || !AllStringsValid(it.value())) return false;
    }
  } else if (j.is_array()) {
    for (const Json& v : j) {
      if (!AllStringsValid(v)) return false;
    }
  }
  return true;
}

// A copy of `j` with every string and key in the name encoding (a no-op for valid UTF-8).
template <typename Json>
Json Encoded(const Json& j) {
  if (j.is_string()) return EncodeName(j.template get_ref<const typename Json::string_t&>());
  if (j.is_object()) {
    Json out = Json::object();
    for (auto it = j.begin(); it != j.end(); ++it) out[EncodeName(it.key())] = Encoded(it.value());
    return out;
  }
  if (j.is_array()) {
    Json out = Json::array();
    for (const Json& v : j) out.push_back(Encoded(v));
    return out;
  }
  return j;
}

template <typename Json>
std::string Dump(const Json& j, int indent, bool ensure_ascii) {
  // After encoding every string is valid, so `replace` never fires; it only guarantees that
  // dump() cannot throw even if nlohmann's UTF-8 check disagreed with IsValidUtf8.
  constexpr auto kNoThrow = Json::error_handler_t::replace;
  if (AllStringsValid(j)) return j.dump(indent, ' ', ensure_ascii, kNoThrow);
  return Encoded(j).dump(indent, ' ', ensure_ascii, kNoThrow);
}

}  // namespace

std::string DumpJson(const nlohmann::json& j, int indent, bool ensure_ascii) {
  return Dump(j, indent, ensure_ascii);
}
std::string DumpJson(const nlohmann::ordered_json& j, int indent, bool ensure_ascii) {
  return Dump(j, indent, ensure_ascii);
}

}  // namespace ckpt
