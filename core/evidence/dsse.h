// DSSE envelopes (github.com/secure-systems-lab/dsse, docs/formats.md §8) signed with Ed25519.
//
// The signature covers PAE(payloadType, payload) =
//   "DSSEv1" SP len(type) SP type SP len(body) SP body   (lengths in ASCII decimal)
// over the exact payload bytes; the envelope carries them base64-encoded, so verifiers never
// re-serialize JSON. Envelope JSON: {"payload", "payloadType", "signatures": [{"keyid","sig"}]}.
#ifndef CKPT_CORE_EVIDENCE_DSSE_H_
#define CKPT_CORE_EVIDENCE_DSSE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/trust_store.h"

namespace ckpt::evidence {

inline constexpr char kInTotoPayloadType[] = "application/vnd.in-toto+json";

std::string Pae(const std::string& payload_type, const std::string& payload);

struct DsseSignature {
  std::string keyid;
  std::vector<uint8_t> sig;
};

struct Envelope {
  std::string payload;  // decoded bytes
  std::string payload_type;
  std::vector<DsseSignature> signatures;
};

// The envelope JSON text (compact, keys in a fixed order) with one signature by `key`. Errors
// only from a token key (core/evidence/pkcs11_key.h).
absl::StatusOr<std::string> SignEnvelope(const std::string& payload,
                                         const std::string& payload_type, const SigningKey& key);

// INVALID_ARGUMENT for anything that is not a well-formed envelope.
absl::StatusOr<Envelope> ParseEnvelope(const std::string& json_text);

// Returns the key id of the first signature that a trusted key verifies. Errors
// (FAILED_PRECONDITION): no signatures, signed only by keys not in `trust` (named), or a trusted
// key's signature that does not verify.
absl::StatusOr<std::string> VerifyEnvelope(const Envelope& envelope, const TrustStore& trust);

}  // namespace ckpt::evidence

#endif  // CKPT_CORE_EVIDENCE_DSSE_H_
