#include "core/text/json_parse.h"

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

using nlohmann::json;

// nlohmann SAX handler that builds the document. Every value goes straight into its parent:
// arrays append, objects fill the slot their key reserved; nothing is ever rescanned.
class BoundedBuilder {
 public:
  explicit BoundedBuilder(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return Put(json(nullptr)); }
  bool boolean(bool v) { return Put(json(v)); }
  bool number_integer(json::number_integer_t v) { return Put(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Put(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return Put(json(v)); }
  bool string(json::string_t& v) { return Put(json(std::move(v))); }
  bool binary(json::binary_t& v) { return Put(json(std::move(v))); }  // not produced by JSON text
  bool start_object(size_t) { return Open(json::value_t::object); }
  bool start_array(size_t) { return Open(json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(json::string_t& k) {
    json::object_t& object = open_.back()->get_ref<json::object_t&>();
    if (open_.size() == 1 && object.size() >= limits_.max_top_level_entries) {
      return Reject(absl::StrCat("more than ", limits_.max_top_level_entries,
                                 " top-level entries"));
    }
    auto [slot, inserted] = object.try_emplace(std::move(k));  // k is kept when not inserted
    if (!inserted) {
      return Reject(absl::StrCat("duplicate JSON key '", k, "' in the object at ",
                                 PointerToTop()));
    }
    slot_ = &slot->second;
    return true;
  }

  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    return Reject(absl::StrCat("invalid JSON: ", e.what()));
  }

  json& result() { return root_; }
  const std::string& error() const { return error_; }

 private:
  // Where the next value goes: the root, the end of the open array, or the slot of the last key.
  json* Put(json&& v) {
    if (open_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json& parent = *open_.back();
    if (parent.is_array()) {
      json::array_t& array = parent.get_ref<json::array_t&>();
      array.push_back(std::move(v));
      return &array.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  bool Open(json::value_t type) {
    if (open_.size() >= static_cast<size_t>(limits_.max_depth)) {
      return Reject(absl::StrCat("JSON nested deeper than ", limits_.max_depth, " levels"));
    }
    // A child's address is stable while it is open: its parent array grows only after it closes.
    open_.push_back(Put(json(type)));
    return true;
  }

  bool Close() {
    open_.pop_back();
    return true;
  }

  bool Reject(std::string why) {
    error_ = std::move(why);
    return false;
  }

  // JSON pointer (RFC 6901) of the innermost open container; only built for an error message.
  std::string PointerToTop() const {
    std::string pointer;
    for (size_t i = 1; i < open_.size(); ++i) {
      const json& parent = *open_[i - 1];
      if (parent.is_array()) {
        absl::StrAppend(&pointer, "/", open_[i] - parent.get_ref<const json::array_t&>().data());
        continue;
      }
      for (const auto& [k, v] : parent.get_ref<const json::object_t&>()) {
        if (&v != open_[i]) continue;
        pointer += '/';
        for (char c : k) pointer += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
      }
    }
    return pointer.empty() ? "/" : pointer;
  }

  const JsonLimits& limits_;
  json root_;
  std::vector<json*> open_;  // the containers being filled, outermost first
  json* slot_ = nullptr;     // the value slot of the last key read
  std::string error_;
};

}  // namespace

absl::StatusOr<json> ParseBoundedJson(std::string_view text, const std::string& label,
                                      const JsonLimits& limits) {
  // nlohmann skips a UTF-8 byte-order mark; the reference readers (serde_json, Python's json)
  // refuse one.
  if (text.size() >= 3 && std::memcmp(text.data(), "\xEF\xBB\xBF", 3) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": JSON starts with a UTF-8 byte-order mark"));
  }
  BoundedBuilder builder(limits);
  const bool ok = json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  if (!ok) return absl::InvalidArgumentError(absl::StrCat(label, ": ", builder.error()));
  return std::move(builder.result());
}

}  // namespace ckpt
