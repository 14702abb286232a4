#include "core/oci/referrers.h"

#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/oms_bundle.h"
#include "core/evidence/record.h"
#include "core/evidence/strict_json.h"
#include "core/evidence/test_result.h"
#include "core/oci/reference.h"

namespace ckpt::oci {
namespace {

// Attempts of each step of an attach that meets concurrent writers, and the pauses between them.
constexpr int kAttempts = 12;

// Pauses that double from 40 ms up to 640 ms, each of a random length between half and all of
// that, so that writers that collided once spread apart.
class Backoff {
 public:
  void Pause() {
    const int ms = std::uniform_int_distribution<int>(cap_ / 2, cap_)(random_);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    cap_ = std::min(cap_ * 2, 640);
  }

 private:
  std::mt19937 random_{std::random_device{}()};
  int cap_ = 40;
};

// What a registry answers while another client writes the same blob or tag: tried again.
bool Transient(const absl::Status& s) { return absl::IsAborted(s) || absl::IsUnavailable(s); }

// The tag index's entries; an absent tag is an empty list.
absl::StatusOr<std::vector<Descriptor>> ReadTagIndex(const Registry& reg, const std::string& tag) {
  auto got = reg.GetManifest(tag);
  if (absl::IsNotFound(got.status())) return std::vector<Descriptor>();
  if (!got.ok()) return got.status();
  return ParseIndex(got->bytes, absl::StrCat("referrers tag ", tag));
}

Descriptor BlobDescriptor(const std::string& media_type, const std::string& bytes) {
  Descriptor d;
  d.media_type = media_type;
  d.digest = DigestOf(bytes);
  d.size = bytes.size();
  return d;
}

// The string `key` of the object `j`, or empty (never throws on other types).
std::string StringAt(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

bool Lists(const std::vector<Descriptor>& index, const std::string& digest) {
  for (const Descriptor& d : index) {
    if (d.digest == digest) return true;
  }
  return false;
}

}  // namespace

std::string ReferrersTag(const std::string& digest) {
  std::string tag = digest;
  if (size_t colon = tag.find(':'); colon != std::string::npos) tag[colon] = '-';
  return tag;
}

absl::StatusOr<Attached> AttachBundle(const Registry& reg, const Descriptor& subject,
                                      const std::string& bundle_json,
                                      const std::string& predicate_type) {
  const std::string empty = "{}";
  Manifest m;
  m.media_type = kOciManifest;
  m.artifact_type = evidence::kSigstoreBundleV03MediaType;
  m.config = BlobDescriptor(kEmptyMediaType, empty);
  m.layers.push_back(BlobDescriptor(evidence::kSigstoreBundleV03MediaType, bundle_json));
  m.layers[0].annotations["org.opencontainers.image.title"] =
      absl::StrCat(ReferrersTag(m.layers[0].digest), ".sigstore.json");
  m.subject = subject;
  m.subject->artifact_type.clear();
  m.subject->annotations.clear();
  m.annotations["dev.sigstore.bundle.content"] = "dsse-envelope";
  m.annotations[kPredicateTypeAnnotation] = predicate_type;
  const std::string bytes = ManifestBytes(m);
  Attached out;
  Backoff backoff;
  // The blobs, then the manifest by digest. A registry answers ABORTED (registry.h) or 5xx while
  // another client pushes the same blob (the empty config is every referrer's): each attempt
  // checks both blobs again, pushes what is missing, and puts the manifest again.
  std::string answered_subject;
  for (int attempt = 1;; ++attempt) {
    absl::Status s = reg.PushBlob(empty);
    if (s.ok()) s = reg.PushBlob(bundle_json);
    if (s.ok()) {
      auto pushed = reg.PushManifest(DigestOf(bytes), kOciManifest, bytes, &answered_subject);
      if (pushed.ok()) {
        out.digest = *pushed;
        break;
      }
      s = pushed.status();
    }
    if (!Transient(s) || attempt == kAttempts) return s;
    backoff.Pause();
  }
  // A registry with the referrers API says so by echoing the subject; it lists the referrer
  // itself, and clients must not write the tag index then (distribution-spec 1.1).
  if (answered_subject == subject.digest) {
    out.referrers_api = true;
    return out;
  }
  const std::string tag = ReferrersTag(subject.digest);
  Descriptor entry = BlobDescriptor(kOciManifest, bytes);
  entry.artifact_type = m.artifact_type;
  entry.annotations = m.annotations;
  // The tag index is read, merged and written until two reads in a row, a pause apart, list
  // this referrer and every other one any read showed (docs/interop.md, "The race"): a
  // concurrent writer that read before this write may overwrite it, dropping this entry or
  // others; what it dropped is written again. A read or write answered 5xx (Debian's
  // docker-registry answers 500 to a read that meets a write of the tag) is tried again after
  // the pause; any other error ends the attach.
  std::vector<Descriptor> known = {entry};
  backoff = Backoff();
  int confirmed = 0;
  for (int attempt = 1;; ++attempt) {
    auto index = ReadTagIndex(reg, tag);
    absl::Status failed = index.status();
    if (!index.ok()) {
      confirmed = 0;
    } else {
      std::vector<Descriptor> merged = *index;
      for (const Descriptor& d : merged) {
        if (!Lists(known, d.digest)) known.push_back(d);
      }
      for (const Descriptor& d : known) {
        if (!Lists(merged, d.digest)) merged.push_back(d);
      }
      if (merged.size() == index->size()) {
        if (++confirmed == 2) return out;
      } else {
        confirmed = 0;
        auto written = reg.PushManifest(tag, kOciIndex, IndexBytes(merged));
        failed = written.status();
        if (written.ok()) ++out.index_writes;
      }
    }
    if (!failed.ok() && (!absl::IsUnavailable(failed) || attempt == kAttempts)) return failed;
    if (attempt == kAttempts) break;
    backoff.Pause();
  }
  return absl::AbortedError(absl::StrCat("referrers tag ", tag, " of ", reg.reference().registry,
                                         "/", reg.reference().repository,
                                         " did not list referrer ", out.digest,
                                         " and every other one seen in two reads in a row within ",
                                         kAttempts, " reads (concurrent writers); try again"));
}

absl::StatusOr<ReferrerList> ListReferrers(const Registry& reg, const std::string& digest) {
  ReferrerList out;
  std::vector<Descriptor> all;
  auto api = reg.GetReferrers(digest);
  if (api.ok()) {
    auto parsed = ParseIndex(api->bytes, absl::StrCat("referrers of ", digest));
    if (!parsed.ok()) return parsed.status();
    all = *std::move(parsed);
    out.referrers_api = true;
  } else if (absl::IsNotFound(api.status())) {
    auto tagged = ReadTagIndex(reg, ReferrersTag(digest));
    if (!tagged.ok()) return tagged.status();
    all = *std::move(tagged);
  } else {
    return api.status();
  }
  for (Descriptor& d : all) {
    // A referrer listed twice is checked and reported once.
    if (d.artifact_type == evidence::kSigstoreBundleV03MediaType && !Lists(out.bundles, d.digest)) {
      out.bundles.push_back(std::move(d));
    }
  }
  return out;
}

std::string ReferrerReasonName(ReferrerReason reason) {
  switch (reason) {
    case ReferrerReason::kOk: return "ok";
    case ReferrerReason::kMissingReferrer: return "missing-referrer";
    case ReferrerReason::kMalformed: return "malformed-referrer";
    case ReferrerReason::kSignatureInvalid: return "signature-invalid";
    case ReferrerReason::kSubjectMismatch: return "subject-mismatch";
  }
  return "unknown";
}

CheckedReferrer CheckReferrer(const Registry& reg, const Descriptor& referrer,
                              const std::string& digest, const evidence::TrustStore& trust) {
  CheckedReferrer out;
  out.digest = referrer.digest;
  auto fail = [&](ReferrerReason r, absl::string_view detail) {
    out.reason = r;
    out.detail = std::string(detail);
    return out;
  };
  auto fetched = reg.GetManifest(referrer.digest);
  if (absl::IsNotFound(fetched.status())) {
    return fail(ReferrerReason::kMissingReferrer, fetched.status().message());
  }
  if (!fetched.ok()) return fail(ReferrerReason::kMalformed, fetched.status().message());
  auto m = ParseManifest(fetched->bytes, fetched->media_type, referrer.digest);
  if (!m.ok()) return fail(ReferrerReason::kMalformed, m.status().message());
  if (!m->subject || m->subject->digest != digest) {
    return fail(ReferrerReason::kSubjectMismatch,
                absl::StrCat("the referrer manifest's subject is ",
                             m->subject ? m->subject->digest : "absent", ", not ", digest));
  }
  if (m->layers.size() != 1 ||
      m->layers[0].media_type != evidence::kSigstoreBundleV03MediaType ||
      m->layers[0].size > kMaxBundleBytes) {
    return fail(ReferrerReason::kMalformed,
                absl::StrCat("not one layer of ", evidence::kSigstoreBundleV03MediaType,
                             " of at most ", kMaxBundleBytes, " bytes"));
  }
  std::string text;
  absl::Status read = reg.ReadBlob(m->layers[0].digest, m->layers[0].size,
                                   [&](std::span<const uint8_t> b) {
                                     text.append(reinterpret_cast<const char*>(b.data()),
                                                 b.size());
                                     return absl::OkStatus();
                                   });
  if (absl::IsNotFound(read)) return fail(ReferrerReason::kMissingReferrer, read.message());
  if (!read.ok()) return fail(ReferrerReason::kMalformed, read.message());
  evidence::OmsBundle bundle;
  if (auto err = evidence::ParseOmsBundle(text, &bundle)) {
    return fail(ReferrerReason::kMalformed, absl::StrCat("bundle: ", err->detail));
  }
  if (bundle.material != evidence::OmsBundle::Material::kPublicKey) {
    return fail(ReferrerReason::kMalformed, "bundle: not a public-key bundle");
  }
  // The bundle's DSSE envelope, checked as `verify` checks a logged envelope.
  evidence::Envelope env{bundle.payload, bundle.payload_type,
                         {{bundle.key_hint, bundle.signature}}};
  auto keyid = evidence::VerifyEnvelope(env, trust);
  if (!keyid.ok()) return fail(ReferrerReason::kSignatureInvalid, keyid.status().message());
  if (bundle.payload_type != evidence::kInTotoPayloadType) {
    return fail(ReferrerReason::kMalformed, "payloadType is not in-toto");
  }
  auto j = evidence::ParseStrictJson(bundle.payload, "attached statement");
  if (!j.ok()) return fail(ReferrerReason::kMalformed, j.status().message());
  const nlohmann::json& st = *j;
  if (!st.is_object() || !st.contains("subject") || !st["subject"].is_array() ||
      !st.contains("predicate") || !st["predicate"].is_object()) {
    return fail(ReferrerReason::kMalformed, "not an in-toto statement");
  }
  const std::string hex = digest.substr(digest.find(':') + 1);
  const nlohmann::json& subjects = st["subject"];
  if (subjects.size() != 1 || !subjects[0].is_object() || !subjects[0].contains("digest") ||
      StringAt(subjects[0]["digest"], "sha256") != hex) {
    return fail(ReferrerReason::kSubjectMismatch,
                absl::StrCat("the statement's subject is not exactly ", digest));
  }
  out.keyid = *keyid;
  out.predicate_type = StringAt(st, "predicateType");
  const nlohmann::json& p = st["predicate"];
  out.passed = (out.predicate_type == evidence::kVerificationSummaryType &&
                StringAt(p, "verificationResult") == "PASSED") ||
               (out.predicate_type == evidence::kTestResultPredicateType &&
                StringAt(p, "result") == "PASSED");
  return out;
}

}  // namespace ckpt::oci
