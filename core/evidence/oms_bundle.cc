#include "core/evidence/oms_bundle.h"

#include <algorithm>
#include <initializer_list>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "core/evidence/base64.h"
#include "core/evidence/dsse.h"
#include "core/evidence/hex_digest.h"
#include "core/evidence/strict_json.h"
#include "core/sha256.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt::evidence {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

constexpr char kStatementType[] = "https://in-toto.io/Statement/v1";
constexpr char kPre10PredicateType[] = "https://model_signing/Digests/v0.1";

OmsError Err(OmsReason reason, std::string detail) { return {reason, std::move(detail)}; }

// The first key of `obj` not in `allowed`, if any.
std::optional<std::string> UnknownKey(const json& obj, std::initializer_list<const char*> allowed) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (std::none_of(allowed.begin(), allowed.end(),
                     [&](const char* k) { return it.key() == k; })) {
      return it.key();
    }
  }
  return std::nullopt;
}

std::optional<OmsError> ExpectObject(const json& obj, const std::string& where,
                                     std::initializer_list<const char*> allowed) {
  if (!obj.is_object()) return Err(OmsReason::kMalformedBundle, where + " is not an object");
  if (auto k = UnknownKey(obj, allowed)) {
    return Err(OmsReason::kMalformedBundle, absl::StrCat("unknown field ", where, ".", *k));
  }
  return std::nullopt;
}

// A required string field decoded from base64.
std::optional<OmsError> Base64Field(const json& obj, const char* key, const std::string& where,
                                    std::vector<uint8_t>* out) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) {
    return Err(OmsReason::kMalformedBundle,
               absl::StrCat(where, ".", key, " is missing or not a string"));
  }
  auto bytes = Base64Decode(it->get<std::string>());
  if (!bytes.ok()) {
    return Err(OmsReason::kMalformedBundle,
               absl::StrCat(where, ".", key, ": ", bytes.status().message()));
  }
  *out = std::move(*bytes);
  return std::nullopt;
}

std::optional<OmsError> ParseMaterial(const json& vm, OmsBundle* out) {
  if (auto e = ExpectObject(vm, "verificationMaterial",
                            {"publicKey", "x509CertificateChain", "certificate", "tlogEntries",
                             "timestampVerificationData"})) {
    return e;
  }
  int kinds = vm.contains("publicKey") + vm.contains("x509CertificateChain") +
              vm.contains("certificate");
  if (kinds != 1) {
    return Err(OmsReason::kMalformedBundle,
               "verificationMaterial needs exactly one of publicKey, x509CertificateChain, "
               "certificate");
  }
  if (vm.contains("certificate")) {
    return Err(OmsReason::kUnsupportedBundle,
               "keyless Sigstore bundle (verificationMaterial.certificate): verifying it needs "
               "Sigstore's Fulcio and Rekor trust roots; use key or certificate-chain signatures");
  }
  if (auto it = vm.find("tlogEntries"); it != vm.end()) {
    if (!it->is_array()) {
      return Err(OmsReason::kMalformedBundle, "verificationMaterial.tlogEntries is not an array");
    }
    if (!it->empty()) {
      return Err(OmsReason::kUnsupportedBundle,
                 "verificationMaterial.tlogEntries is not empty: Rekor entries are not checked "
                 "here, and key or certificate bundles carry none");
    }
  }
  if (auto it = vm.find("timestampVerificationData"); it != vm.end()) {
    if (!it->is_object()) {
      return Err(OmsReason::kMalformedBundle,
                 "verificationMaterial.timestampVerificationData is not an object");
    }
    if (!it->empty()) {
      return Err(OmsReason::kUnsupportedBundle,
                 "verificationMaterial.timestampVerificationData: RFC 3161 timestamps are not "
                 "checked here");
    }
  }
  if (auto it = vm.find("publicKey"); it != vm.end()) {
    const std::string where = "verificationMaterial.publicKey";
    if (auto e = ExpectObject(*it, where, {"hint", "rawBytes", "keyDetails"})) return e;
    out->material = OmsBundle::Material::kPublicKey;
    for (const char* k : {"hint", "rawBytes", "keyDetails"}) {
      if (it->contains(k) && !(*it)[k].is_string()) {
        return Err(OmsReason::kMalformedBundle, absl::StrCat(where, ".", k, " is not a string"));
      }
    }
    out->key_hint = it->value("hint", "");
    out->legacy_public_key = it->contains("rawBytes") || it->contains("keyDetails");
    return std::nullopt;
  }
  const json& chain = vm["x509CertificateChain"];
  const std::string where = "verificationMaterial.x509CertificateChain";
  if (auto e = ExpectObject(chain, where, {"certificates"})) return e;
  if (!chain.contains("certificates") || !chain["certificates"].is_array() ||
      chain["certificates"].empty()) {
    return Err(OmsReason::kMalformedBundle, where + ".certificates is missing or empty");
  }
  out->material = OmsBundle::Material::kCertificateChain;
  for (size_t i = 0; i < chain["certificates"].size(); ++i) {
    const std::string cw = absl::StrCat(where, ".certificates[", i, "]");
    const json& c = chain["certificates"][i];
    if (auto e = ExpectObject(c, cw, {"rawBytes"})) return e;
    std::vector<uint8_t> der;
    if (auto e = Base64Field(c, "rawBytes", cw, &der)) return e;
    out->certificates.push_back(std::move(der));
  }
  return std::nullopt;
}

std::optional<OmsError> ParseEnvelopeField(const json& env, OmsBundle* out) {
  const std::string where = "dsseEnvelope";
  if (auto e = ExpectObject(env, where, {"payload", "payloadType", "signatures"})) return e;
  std::vector<uint8_t> payload;
  if (auto e = Base64Field(env, "payload", where, &payload)) return e;
  out->payload.assign(payload.begin(), payload.end());
  if (!env.contains("payloadType") || !env["payloadType"].is_string()) {
    return Err(OmsReason::kMalformedBundle, "dsseEnvelope.payloadType is missing or not a string");
  }
  out->payload_type = env["payloadType"].get<std::string>();
  if (!env.contains("signatures") || !env["signatures"].is_array() ||
      env["signatures"].size() != 1) {
    return Err(OmsReason::kMalformedBundle,
               "dsseEnvelope.signatures must be an array of exactly one signature");
  }
  const json& sig = env["signatures"][0];
  if (auto e = ExpectObject(sig, "dsseEnvelope.signatures[0]", {"sig", "keyid"})) return e;
  if (sig.contains("keyid") && !sig["keyid"].is_string() && !sig["keyid"].is_null()) {
    return Err(OmsReason::kMalformedBundle, "dsseEnvelope.signatures[0].keyid is not a string");
  }
  if (auto e = Base64Field(sig, "sig", "dsseEnvelope.signatures[0]", &out->signature)) return e;
  if (out->signature.empty()) {
    return Err(OmsReason::kMalformedBundle, "dsseEnvelope.signatures[0].sig is empty");
  }
  return std::nullopt;
}

bool IsHex64(const std::string& s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
         });
}

std::optional<std::string> StringField(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_string()) return std::nullopt;
  return it->get<std::string>();
}

std::optional<OmsError> ParseSerialization(const json& s, OmsStatement* out) {
  auto bad = [](const std::string& what) {
    return Err(OmsReason::kStatementInvalid, "predicate.serialization." + what);
  };
  if (!s.is_object()) return bad("is not an object");
  auto method = StringField(s, "method");
  auto hash_type = StringField(s, "hash_type");
  if (!method) return bad("method is missing or not a string");
  if (!hash_type) return bad("hash_type is missing or not a string");
  if (!s.contains("allow_symlinks") || !s["allow_symlinks"].is_boolean()) {
    return bad("allow_symlinks is missing or not a boolean");
  }
  out->method = *method;
  out->hash_type = *hash_type;
  out->allow_symlinks = s["allow_symlinks"].get<bool>();
  if (auto it = s.find("ignore_paths"); it != s.end()) {
    if (!it->is_array()) return bad("ignore_paths is not an array");
    std::vector<std::string> paths;
    for (const json& p : *it) {
      if (!p.is_string()) return bad("ignore_paths holds a non-string");
      paths.push_back(p.get<std::string>());
    }
    out->ignore_paths = std::move(paths);
  }
  if (auto it = s.find("shard_size"); it != s.end()) {
    if (!it->is_number_unsigned() || it->get<uint64_t>() == 0) {
      return bad("shard_size is not a positive integer");
    }
    out->shard_size = it->get<uint64_t>();
  }
  return std::nullopt;
}

}  // namespace

std::string OmsReasonName(OmsReason reason) {
  switch (reason) {
    case OmsReason::kMalformedBundle: return "malformed-bundle";
    case OmsReason::kUnsupportedBundle: return "unsupported-bundle";
    case OmsReason::kKeyMismatch: return "key-mismatch";
    case OmsReason::kCertificateInvalid: return "certificate-invalid";
    case OmsReason::kSignatureInvalid: return "signature-invalid";
    case OmsReason::kStatementInvalid: return "statement-invalid";
    case OmsReason::kFilesDiffer: return "files-differ";
  }
  return "?";
}

std::string OmsStatementPayload(const OmsStatement& st) {
  ojson resources = ojson::array();
  for (const OmsResourceEntry& r : st.resources) {
    resources.push_back({{"algorithm", r.algorithm}, {"name", r.name}, {"digest", r.digest}});
  }
  ojson serialization = {{"allow_symlinks", st.allow_symlinks},
                         {"method", st.method},
                         {"hash_type", st.hash_type}};
  if (st.ignore_paths) serialization["ignore_paths"] = *st.ignore_paths;
  if (st.shard_size) serialization["shard_size"] = *st.shard_size;
  ojson statement = {
      {"_type", kStatementType},
      {"subject", ojson::array({{{"name", st.model_name},
                                 {"digest", {{"sha256", st.root_sha256}}}}})},
      {"predicateType", kOmsPredicateType},
      {"predicate", {{"resources", resources}, {"serialization", serialization}}}};
  return DumpJson(statement, 2, /*ensure_ascii=*/true);
}

absl::StatusOr<std::string> OmsRootOf(const std::vector<OmsResourceEntry>& resources) {
  Sha256 h;
  for (const OmsResourceEntry& r : resources) {
    if (!IsHex64(r.digest)) {
      return absl::InvalidArgumentError(
          absl::StrCat("resource ", r.name, ": digest is not 64 hex characters"));
    }
    uint8_t raw[32];
    for (size_t i = 0; i < 32; ++i) {
      raw[i] = static_cast<uint8_t>(HexDigitValue(r.digest[2 * i]) << 4 |  // IsHex64 checked
                                    HexDigitValue(r.digest[2 * i + 1]));
    }
    h.Update(raw);
  }
  return ToHex(h.Finish());
}

std::optional<OmsError> ParseOmsBundle(const std::string& text, OmsBundle* out) {
  auto j = ParseStrictJson(text, "signature bundle");
  if (!j.ok()) return Err(OmsReason::kMalformedBundle, std::string(j.status().message()));
  if (auto e = ExpectObject(*j, "bundle",
                            {"mediaType", "verificationMaterial", "dsseEnvelope",
                             "messageSignature"})) {
    return e;
  }
  auto media = StringField(*j, "mediaType");
  if (!media) return Err(OmsReason::kMalformedBundle, "bundle.mediaType is missing");
  if (*media != kSigstoreBundleV03MediaType) {
    return Err(OmsReason::kUnsupportedBundle,
               absl::StrCat("bundle media type '", *media, "'; OMS v1.0 uses ",
                            kSigstoreBundleV03MediaType));
  }
  if (j->contains("messageSignature")) {
    return Err(OmsReason::kUnsupportedBundle,
               "bundle holds a messageSignature; OMS signatures are DSSE envelopes");
  }
  if (!j->contains("verificationMaterial")) {
    return Err(OmsReason::kMalformedBundle, "bundle.verificationMaterial is missing");
  }
  if (!j->contains("dsseEnvelope")) {
    return Err(OmsReason::kMalformedBundle, "bundle.dsseEnvelope is missing");
  }
  OmsBundle b;
  if (auto e = ParseMaterial((*j)["verificationMaterial"], &b)) return e;
  if (auto e = ParseEnvelopeField((*j)["dsseEnvelope"], &b)) return e;
  *out = std::move(b);
  return std::nullopt;
}

std::string OmsKeyBundleJson(const std::string& payload, const std::vector<uint8_t>& signature,
                             const std::string& key_hint) {
  ojson bundle = {
      {"mediaType", kSigstoreBundleV03MediaType},
      {"verificationMaterial",
       {{"publicKey", {{"hint", key_hint}}}, {"tlogEntries", ojson::array()}}},
      {"dsseEnvelope",
       {{"payload", Base64Encode(payload)},
        {"payloadType", kInTotoPayloadType},
        {"signatures", ojson::array({{{"sig", Base64Encode(signature)}, {"keyid", ""}}})}}}};
  return DumpJson(bundle);
}

absl::StatusOr<std::string> SignOmsKeyBundle(const std::string& payload,
                                             const EcdsaSigningKey& key) {
  auto sig = key.Sign(AsBytes(Pae(kInTotoPayloadType, payload)));
  if (!sig.ok()) return sig.status();
  return OmsKeyBundleJson(payload, *sig, key.public_key().Hint());
}

std::optional<OmsError> ParseOmsStatement(const std::string& payload, OmsStatement* out) {
  auto bad = [](const std::string& what) { return Err(OmsReason::kStatementInvalid, what); };
  auto j = ParseStrictJson(payload, "signed statement");
  if (!j.ok()) return bad(std::string(j.status().message()));
  if (!j->is_object()) return bad("signed statement is not a JSON object");
  if (StringField(*j, "_type") != kStatementType) {
    return bad(absl::StrCat("_type is not ", kStatementType));
  }
  auto predicate_type = StringField(*j, "predicateType");
  if (predicate_type == kPre10PredicateType) {
    return Err(OmsReason::kUnsupportedBundle,
               absl::StrCat("pre-1.0 model_signing predicate ", kPre10PredicateType));
  }
  if (predicate_type != kOmsPredicateType) {
    return bad(absl::StrCat("predicateType '", predicate_type.value_or(""), "' is not ",
                            kOmsPredicateType));
  }
  if (!j->contains("subject") || !(*j)["subject"].is_array() || (*j)["subject"].size() != 1) {
    return bad("the statement must have exactly one subject");
  }
  const json& subject = (*j)["subject"][0];
  auto name = subject.is_object() ? StringField(subject, "name") : std::nullopt;
  auto root = subject.is_object() && subject.contains("digest") && subject["digest"].is_object()
                  ? StringField(subject["digest"], "sha256")
                  : std::nullopt;
  if (!name || !root || !IsHex64(*root) || absl::AsciiStrToLower(*root) != *root) {
    return bad("subject needs a name and a lowercase hex sha256 digest");
  }
  OmsStatement st;
  st.model_name = *name;
  st.root_sha256 = *root;
  if (!j->contains("predicate") || !(*j)["predicate"].is_object()) {
    return bad("predicate is missing or not an object");
  }
  const json& predicate = (*j)["predicate"];
  if (!predicate.contains("serialization")) return bad("predicate.serialization is missing");
  if (auto e = ParseSerialization(predicate["serialization"], &st)) return e;
  if (!predicate.contains("resources") || !predicate["resources"].is_array()) {
    return bad("predicate.resources is missing or not an array");
  }
  std::set<std::string> names;
  for (size_t i = 0; i < predicate["resources"].size(); ++i) {
    const json& r = predicate["resources"][i];
    auto rname = r.is_object() ? StringField(r, "name") : std::nullopt;
    auto algorithm = r.is_object() ? StringField(r, "algorithm") : std::nullopt;
    auto digest = r.is_object() ? StringField(r, "digest") : std::nullopt;
    if (!rname || !algorithm || !digest) {
      return bad(absl::StrCat("predicate.resources[", i, "] needs string name, algorithm, digest"));
    }
    if (!IsHex64(*digest)) {
      return bad(absl::StrCat("resource ", *rname, ": digest is not 64 hex characters"));
    }
    if (!names.insert(*rname).second) {
      return bad(absl::StrCat("resource ", *rname, " is listed twice"));
    }
    st.resources.push_back({*rname, *algorithm, absl::AsciiStrToLower(*digest)});
  }
  auto recomputed = OmsRootOf(st.resources);
  if (!recomputed.ok()) return bad(std::string(recomputed.status().message()));
  if (*recomputed != st.root_sha256) {
    return bad(absl::StrCat("manifest is inconsistent: the subject digest is ", st.root_sha256,
                            " but the resources hash to ", *recomputed));
  }
  *out = std::move(st);
  return std::nullopt;
}

std::optional<OmsError> OpenOmsBundle(const OmsBundle& bundle, const EcdsaPublicKey& key,
                                      OmsStatement* statement) {
  if (bundle.material == OmsBundle::Material::kPublicKey && !bundle.key_hint.empty() &&
      bundle.key_hint != key.Hint()) {
    return Err(OmsReason::kKeyMismatch,
               absl::StrCat("the bundle's public-key hint ", bundle.key_hint,
                            " is not the given key's (", key.Hint(), ")"));
  }
  // model_signing computes PAE with the in-toto type whatever the envelope says, then insists
  // that the envelope says it.
  if (!key.Verify(AsBytes(Pae(kInTotoPayloadType, bundle.payload)), bundle.signature)) {
    return Err(OmsReason::kSignatureInvalid,
               absl::StrCat("the DSSE signature does not verify with the ",
                            EcCurveName(key.curve()), " key ", key.Hint()));
  }
  if (bundle.payload_type != kInTotoPayloadType) {
    return Err(OmsReason::kStatementInvalid,
               absl::StrCat("payloadType '", bundle.payload_type, "' is not ", kInTotoPayloadType));
  }
  return ParseOmsStatement(bundle.payload, statement);
}

}  // namespace ckpt::evidence
