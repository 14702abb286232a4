#include "core/evidence/dsse.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/evidence/base64.h"
#include "core/evidence/strict_json.h"
#include "core/text/json_dump.h"
#include "nlohmann/json.hpp"

namespace ckpt::evidence {

std::string Pae(const std::string& payload_type, const std::string& payload) {
  return absl::StrCat("DSSEv1 ", payload_type.size(), " ", payload_type, " ", payload.size(), " ",
                      payload);
}

absl::StatusOr<std::string> SignEnvelope(const std::string& payload,
                                         const std::string& payload_type, const SigningKey& key) {
  absl::StatusOr<Signature> sig = key.Sign(AsBytes(Pae(payload_type, payload)));
  if (!sig.ok()) return sig.status();
  nlohmann::ordered_json env;
  env["payload"] = Base64Encode(payload);
  env["payloadType"] = payload_type;
  env["signatures"] = nlohmann::ordered_json::array(
      {{{"keyid", key.public_key().KeyId()}, {"sig", Base64Encode(*sig)}}});
  return DumpJson(env);
}

absl::StatusOr<Envelope> ParseEnvelope(const std::string& json_text) {
  absl::StatusOr<nlohmann::json> parsed = ParseStrictJson(json_text, "DSSE envelope");
  if (!parsed.ok()) return parsed.status();
  const nlohmann::json& j = *parsed;
  if (!j.is_object() || !j.contains("payload") || !j["payload"].is_string() ||
      !j.contains("payloadType") || !j["payloadType"].is_string() ||
      !j.contains("signatures") || !j["signatures"].is_array()) {
    return absl::InvalidArgumentError(
        "not a DSSE envelope (needs string payload, string payloadType, signatures array)");
  }
  Envelope env;
  auto payload = Base64Decode(j["payload"].get<std::string>());
  if (!payload.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("DSSE payload: ", payload.status().message()));
  }
  env.payload.assign(payload->begin(), payload->end());
  env.payload_type = j["payloadType"].get<std::string>();
  for (const auto& s : j["signatures"]) {
    if (!s.is_object() || !s.contains("sig") || !s["sig"].is_string()) {
      return absl::InvalidArgumentError("DSSE signature entry without a string 'sig'");
    }
    auto sig = Base64Decode(s["sig"].get<std::string>());
    if (!sig.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("DSSE sig: ", sig.status().message()));
    }
    std::string keyid = s.contains("keyid") && s["keyid"].is_string() ? s["keyid"] : "";
    env.signatures.push_back({keyid, std::move(*sig)});
  }
  return env;
}

absl::StatusOr<std::string> VerifyEnvelope(const Envelope& envelope, const TrustStore& trust) {
  if (envelope.signatures.empty()) {
    return absl::FailedPreconditionError("DSSE envelope has no signatures");
  }
  std::string pae = Pae(envelope.payload_type, envelope.payload);
  std::vector<std::string> unknown;
  for (const DsseSignature& s : envelope.signatures) {
    // Try the named key first; an empty or wrong keyid hint still verifies against any key.
    if (const PublicKey* k = trust.Find(s.keyid); k != nullptr) {
      if (k->Verify(AsBytes(pae), s.sig)) return s.keyid;
      return absl::FailedPreconditionError(
          absl::StrCat("DSSE signature by trusted key ", s.keyid, " does not verify"));
    }
    for (const auto& [id, key] : trust.keys()) {
      if (key.Verify(AsBytes(pae), s.sig)) return id;
    }
    unknown.push_back(s.keyid.empty() ? "(no keyid)" : s.keyid);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("DSSE envelope signed only by untrusted keys: ", absl::StrJoin(unknown, ", ")));
}

}  // namespace ckpt::evidence
