#include "core/text/json_parse.h"

#include <cstring>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt {
namespace {

using nlohmann::json;

// nlohmann SAX handler that builds values. Every value goes straight into its parent: arrays
// append, objects fill the slot their key reserved; nothing is ever rescanned. With a visitor,
// members of the outermost object are handed over one at a time instead of being kept.
class BoundedBuilder {
 public:
  BoundedBuilder(const std::string& label, const JsonLimits& limits,
                 const JsonEntryVisitor* on_entry)
      : label_(label), limits_(limits), on_entry_(on_entry) {}

  bool null() { return Value(json(nullptr)); }
  bool boolean(bool v) { return Value(json(v)); }
  bool number_integer(json::number_integer_t v) { return Value(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return Value(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return Value(json(v)); }
  bool string(json::string_t& v) { return Value(json(std::move(v))); }
  bool binary(json::binary_t& v) { return Value(json(std::move(v))); }  // not from JSON text
  bool start_object(size_t) { return Open(json::value_t::object); }
  bool start_array(size_t) { return Open(json::value_t::array); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }

  bool key(json::string_t& k) {
    if (streaming() && open_.size() == 1) return TopLevelKey(k);
    json::object_t& object = open_.back()->get_ref<json::object_t&>();
    if (open_.size() == 1 && object.size() >= limits_.max_top_level_entries) {
      return Reject(TooManyEntries());
    }
    auto [slot, inserted] = object.try_emplace(std::move(k));  // k is kept when not inserted
    if (!inserted) return Reject(Duplicate(k));
    slot_ = &slot->second;
    return true;
  }

  bool parse_error(size_t, const std::string&, const nlohmann::detail::exception& e) {
    return Reject(absl::StrCat("invalid JSON: ", e.what()));
  }

  json& result() { return root_; }
  const absl::Status& status() const { return status_; }

 private:
  bool streaming() const { return on_entry_ != nullptr; }

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

  bool Value(json&& v) {
    if (streaming() && open_.empty()) return Reject("JSON is not an object");
    Put(std::move(v));
    return streaming() && open_.size() == 1 ? Visit() : true;
  }

  bool Open(json::value_t type) {
    if (streaming() && open_.empty() && type != json::value_t::object) {
      return Reject("JSON is not an object");
    }
    if (open_.size() >= static_cast<size_t>(limits_.max_depth)) {
      return Reject(absl::StrCat("JSON nested deeper than ", limits_.max_depth, " levels"));
    }
    // A child's address is stable while it is open: its parent array grows only after it closes.
    open_.push_back(Put(json(type)));
    return true;
  }

  bool Close() {
    open_.pop_back();
    return streaming() && open_.size() == 1 ? Visit() : true;
  }

  // Streaming: the outermost object stays empty; its keys are checked against a hash set.
  bool TopLevelKey(json::string_t& k) {
    if (top_keys_.size() >= limits_.max_top_level_entries) return Reject(TooManyEntries());
    if (!top_keys_.insert(k).second) return Reject(Duplicate(k));
    entry_key_ = std::move(k);
    slot_ = &entry_value_;
    return true;
  }

  bool Visit() {
    absl::Status s = (*on_entry_)(std::move(entry_key_), std::move(entry_value_));
    entry_value_ = json();
    if (s.ok()) return true;
    status_ = std::move(s);
    return false;
  }

  bool Reject(const std::string& why) {
    status_ = absl::InvalidArgumentError(absl::StrCat(label_, ": ", why));
    return false;
  }

  std::string TooManyEntries() const {
    return absl::StrCat("more than ", limits_.max_top_level_entries, " top-level entries");
  }

  std::string Duplicate(const std::string& k) const {
    return absl::StrCat("duplicate JSON key '", k, "' in the object at ", PointerToTop());
  }

  // JSON pointer (RFC 6901) of the innermost open container; only built for an error message.
  std::string PointerToTop() const {
    std::string pointer;
    auto append_key = [&](const std::string& k) {
      pointer += '/';
      for (char c : k) pointer += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
    };
    for (size_t i = 1; i < open_.size(); ++i) {
      const json& parent = *open_[i - 1];
      if (streaming() && i == 1) {
        append_key(entry_key_);
      } else if (parent.is_array()) {
        absl::StrAppend(&pointer, "/", open_[i] - parent.get_ref<const json::array_t&>().data());
      } else {
        for (const auto& [k, v] : parent.get_ref<const json::object_t&>()) {
          if (&v == open_[i]) append_key(k);
        }
      }
    }
    return pointer.empty() ? "/" : pointer;
  }

  const std::string& label_;
  const JsonLimits& limits_;
  const JsonEntryVisitor* const on_entry_;  // null: build the whole document in root_
  json root_;
  std::vector<json*> open_;  // the containers being filled, outermost first
  json* slot_ = nullptr;     // the value slot of the last key read
  // Streaming only: the outermost object's keys so far, and the member being built.
  std::unordered_set<std::string> top_keys_;
  std::string entry_key_;
  json entry_value_;
  absl::Status status_;
};

absl::Status Parse(std::string_view text, BoundedBuilder& builder, const std::string& label) {
  // nlohmann skips a UTF-8 byte-order mark; the reference readers (serde_json, Python's json)
  // refuse one.
  if (text.size() >= 3 && std::memcmp(text.data(), "\xEF\xBB\xBF", 3) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": JSON starts with a UTF-8 byte-order mark"));
  }
  const bool ok = json::sax_parse(text.begin(), text.end(), &builder, json::input_format_t::json,
                                  /*strict=*/true, /*ignore_comments=*/false);
  return ok ? absl::OkStatus() : builder.status();
}

}  // namespace

absl::StatusOr<json> ParseBoundedJson(std::string_view text, const std::string& label,
                                      const JsonLimits& limits) {
  BoundedBuilder builder(label, limits, nullptr);
  if (absl::Status s = Parse(text, builder, label); !s.ok()) return s;
  return std::move(builder.result());
}

absl::Status ParseBoundedJsonObject(std::string_view text, const std::string& label,
                                   const JsonLimits& limits, const JsonEntryVisitor& on_entry) {
  BoundedBuilder builder(label, limits, &on_entry);
  return Parse(text, builder, label);
}

}  // namespace ckpt
