#include "core/evidence/pkcs11_uri.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "core/evidence/hex_digest.h"

namespace ckpt::evidence {
namespace {

absl::Status Bad(absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("PKCS#11 URI: ", why));
}

// A literal character RFC 7512 lets a path attribute value carry unescaped: the URI unreserved
// set and its path-reserved set (":[]@!$'()*+,=&"). Anything else must be percent-encoded.
bool LiteralOk(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  static constexpr absl::string_view kAllowed = "-._~:[]@!$&'()*+,=";
  return kAllowed.find(c) != absl::string_view::npos;
}

absl::StatusOr<std::string> PercentDecode(absl::string_view name, absl::string_view value) {
  std::string out;
  for (size_t i = 0; i < value.size(); ++i) {
    char c = value[i];
    if (c == '%') {
      int hi = i + 2 < value.size() ? HexDigitValue(value[i + 1]) : -1;
      int lo = hi >= 0 ? HexDigitValue(value[i + 2]) : -1;
      if (hi < 0 || lo < 0) {
        return Bad(absl::StrCat(name, ": '%' at offset ", i, " is not followed by two hex digits"));
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (LiteralOk(c)) {
      out.push_back(c);
    } else {
      return Bad(absl::StrCat(name, ": character 0x", absl::Hex(static_cast<unsigned char>(c)),
                              " at offset ", i, " must be percent-encoded"));
    }
  }
  return out;
}

absl::Status Set(std::optional<std::string>* field, absl::string_view name, std::string value) {
  if (field->has_value()) return Bad(absl::StrCat("attribute '", name, "' appears twice"));
  if (value.empty()) return Bad(absl::StrCat("attribute '", name, "' is empty"));
  *field = std::move(value);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Pkcs11Uri> ParsePkcs11Uri(absl::string_view uri) {
  if (!IsPkcs11Uri(uri)) return Bad("does not start with 'pkcs11:'");
  absl::string_view rest = uri.substr(sizeof(kPkcs11UriScheme) - 1);
  if (size_t q = rest.find('?'); q != absl::string_view::npos) {
    // Only query attributes live after '?', and this tool takes none of them: name the first.
    absl::string_view query = rest.substr(q + 1);
    absl::string_view first = query.substr(0, query.find_first_of("=&"));
    if (first == "pin-value") {
      return Bad("'pin-value' is refused: a URI lands in argv and logs; pass the PIN with "
                 "--pin-file or --pin-env");
    }
    return Bad(absl::StrCat("query attribute '", first,
                            "' is refused: the module and PIN are named by --pkcs11-module, "
                            "--pin-file and --pin-env"));
  }
  if (rest.find('#') != absl::string_view::npos) return Bad("a fragment ('#') is not allowed");
  Pkcs11Uri out;
  if (rest.empty()) return Bad("names no object: add object=LABEL or id=%XX...");
  for (absl::string_view attr : absl::StrSplit(rest, ';')) {
    size_t eq = attr.find('=');
    if (eq == absl::string_view::npos) {
      return Bad(absl::StrCat("'", attr, "' is not NAME=VALUE"));
    }
    absl::string_view name = attr.substr(0, eq);
    absl::StatusOr<std::string> value = PercentDecode(name, attr.substr(eq + 1));
    if (!value.ok()) return value.status();
    absl::Status s;
    if (name == "token") {
      s = Set(&out.token, name, *value);
    } else if (name == "manufacturer") {
      s = Set(&out.manufacturer, name, *value);
    } else if (name == "model") {
      s = Set(&out.model, name, *value);
    } else if (name == "serial") {
      s = Set(&out.serial, name, *value);
    } else if (name == "object") {
      s = Set(&out.object, name, *value);
    } else if (name == "type") {
      s = Set(&out.type, name, *value);
      if (s.ok() && *out.type != "private") {
        return Bad(absl::StrCat("type=", *out.type, ": a signing key is the private key object "
                                "(type=private or no type)"));
      }
    } else if (name == "id") {
      if (out.id.has_value()) return Bad("attribute 'id' appears twice");
      if (value->empty()) return Bad("attribute 'id' is empty");
      out.id.emplace(value->begin(), value->end());
    } else if (name == "pin-value") {
      return Bad("'pin-value' is refused: a URI lands in argv and logs; pass the PIN with "
                 "--pin-file or --pin-env");
    } else {
      return Bad(absl::StrCat("attribute '", name, "' is not one this tool matches (token, "
                              "manufacturer, model, serial, object, id, type): refused rather "
                              "than ignored, so a key is never chosen without it"));
    }
    if (!s.ok()) return s;
  }
  if (!out.object.has_value() && !out.id.has_value()) {
    return Bad("names no object: add object=LABEL or id=%XX...");
  }
  return out;
}

}  // namespace ckpt::evidence
