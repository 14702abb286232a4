#include "core/interop/publish.h"

#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/test_result.h"
#include "core/sha256.h"

namespace ckpt::interop {

std::string EntryUri(const storage::EvidenceLog& log, uint64_t id) {
  return absl::StrCat(log.origin(), "#", id);
}

absl::StatusOr<PublishedAudit> PublishAudit(const evidence::EvidenceRecord& record,
                                            const evidence::SigningKey& key,
                                            storage::EvidenceLog& log) {
  auto payload = evidence::RecordPayload(record);
  if (!payload.ok()) return payload.status();
  PublishedAudit out;
  auto record_envelope = evidence::SignEnvelope(*payload, evidence::kInTotoPayloadType, key);
  if (!record_envelope.ok()) return record_envelope.status();
  out.record_envelope = *std::move(record_envelope);
  std::string envelope_sha256 = ToHex(Sha256Of(evidence::AsBytes(out.record_envelope)));
  // The test result's only input not known yet is the record's log position; building it once
  // now means a record that cannot have one (no OMS ROOT subject) appends nothing.
  if (auto s = evidence::TestResultPayload(record, {"", envelope_sha256}); !s.ok()) {
    return s.status();
  }

  auto appended = log.Append(out.record_envelope, key);
  if (!appended.ok()) return appended.status();
  out.record_id = appended->seq;
  auto test_payload =
      evidence::TestResultPayload(record, {EntryUri(log, out.record_id), envelope_sha256});
  if (!test_payload.ok()) return test_payload.status();
  auto test_envelope = evidence::SignEnvelope(*test_payload, evidence::kInTotoPayloadType, key);
  if (!test_envelope.ok()) return test_envelope.status();
  out.test_result_envelope = *std::move(test_envelope);
  auto second = log.Append(out.test_result_envelope, key);
  if (!second.ok()) return second.status();
  out.test_result_id = second->seq;
  out.last = *second;
  return out;
}

}  // namespace ckpt::interop
