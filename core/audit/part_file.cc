#include "core/audit/part_file.h"

#include "absl/strings/str_cat.h"
#include "core/evidence/dsse.h"
#include "core/evidence/strict_json.h"
#include "core/text/json_dump.h"
#include "core/text/name_encoding.h"

namespace ckpt::audit {
namespace {

using nlohmann::json;

constexpr char kSchema[] = "ckpt-audit/audit-part/v1";

// Parse errors thrown while reading a part (caught once, in ParsePart).
struct BadPart {
  std::string why;
};

std::string Raw(const json& j) {
  absl::StatusOr<std::string> raw = DecodeName(j.get<std::string>());
  if (!raw.ok()) throw BadPart{std::string(raw.status().message())};
  return *raw;
}

template <size_t N>
std::array<uint8_t, N> Bytes(const json& j) {
  std::array<uint8_t, N> out{};
  if (!FromHex(j.get<std::string>(), out)) throw BadPart{"a digest that is not lower-case hex"};
  return out;
}

json FindingsJson(const quant::FindingList& list) {
  json listed = json::array();
  for (const quant::Finding& f : list.kept()) {
    listed.push_back({{"code", f.code}, {"tensor", EncodeName(f.tensor)}, {"row", f.row},
                      {"group", f.group}, {"message", EncodeName(f.message)},
                      {"numbers", f.numbers}});
  }
  return {{"cap", list.cap()}, {"by_code", list.by_code()}, {"listed", listed}};
}

quant::FindingList FindingsOf(const json& j) {
  std::vector<quant::Finding> kept;
  for (const json& f : j.at("listed")) {
    kept.push_back({f.at("code").get<std::string>(), Raw(f.at("tensor")),
                    f.at("row").get<int64_t>(), f.at("group").get<int64_t>(),
                    Raw(f.at("message")), f.at("numbers").get<std::map<std::string, int64_t>>()});
  }
  auto list = quant::FindingList::Restore(j.at("cap").get<size_t>(), std::move(kept),
                                          j.at("by_code").get<std::map<std::string, uint64_t>>());
  if (!list.ok()) throw BadPart{std::string(list.status().message())};
  return *std::move(list);
}

template <typename T>
json Optional(const std::optional<T>& v) {
  return v ? json(*v) : json();
}

template <typename T>
std::optional<T> OptionalOf(const json& j) {
  if (j.is_null()) return std::nullopt;
  return j.get<T>();
}

// A pair unit's source scale-byte counts (quant::PairUnitOutcome), sparse: [byte, active, zero].
json ScaleBytesJson(const quant::PairUnitOutcome& o) {
  json out = json::array();
  for (int b = 0; b < 256; ++b) {
    if (o.active_bytes[b] || o.zero_bytes[b]) out.push_back({b, o.active_bytes[b], o.zero_bytes[b]});
  }
  return out;
}

void ScaleBytesOf(const json& j, quant::PairUnitOutcome* o) {
  for (const json& e : j) {
    const int b = e.at(0).get<int>();
    if (b < 0 || b > 255 || e.size() != 3) throw BadPart{"a scale byte count that is not [0..255, n, n]"};
    o->active_bytes[b] = e.at(1).get<uint64_t>();
    o->zero_bytes[b] = e.at(2).get<uint64_t>();
  }
}

json StatsJson(const quant::TensorScaleStats& t) {
  return {{"tensor", EncodeName(t.tensor)},
          {"kind", t.kind},
          {"fused_group", EncodeName(t.fused_group)},
          {"rows", t.rows},
          {"groups", t.groups},
          {"active_groups", t.active_groups},
          {"zero_groups", t.zero_groups},
          {"zero_groups_out_of_window", t.zero_groups_out_of_window},
          {"nan_scales_active", t.nan_scales_active},
          {"nan_scales_zero", t.nan_scales_zero},
          {"over_span_groups", t.over_span_groups},
          {"k_min", Optional(t.k_min)},
          {"k_max", Optional(t.k_max)},
          {"pair_k_max", Optional(t.pair_k_max)},
          {"global_scale_bits", Optional(t.global_scale_bits)}};
}

// A time as the part's node wrote it (evidence::Rfc3339Now: "2026-12-01T18:55:02.123Z"); the
// merge takes the earliest part's start as the record's, comparing them as strings.
std::string TimeOf(const json& j) {
  std::string t = j.get<std::string>();
  static constexpr char kShape[] = "dddd-dd-ddTdd:dd:dd.dddZ";
  bool ok = t.size() == sizeof(kShape) - 1;
  for (size_t i = 0; ok && i < t.size(); ++i) {
    ok = kShape[i] == 'd' ? (t[i] >= '0' && t[i] <= '9') : t[i] == kShape[i];
  }
  if (!ok) throw BadPart{"a time that is not YYYY-MM-DDTHH:MM:SS.mmmZ"};
  return t;
}

// A power-of-two scale exponent: no float format reaches 2^±4096, and the merge's spans
// (k_max - k_min) of such exponents cannot overflow.
std::optional<int> ExponentOf(const json& j) {
  std::optional<int> k = OptionalOf<int>(j);
  if (k && (*k < -4096 || *k > 4096)) throw BadPart{"a scale exponent out of range"};
  return k;
}

quant::TensorScaleStats StatsOf(const json& j) {
  quant::TensorScaleStats t;
  t.tensor = Raw(j.at("tensor"));
  t.kind = j.at("kind").get<std::string>();
  t.fused_group = Raw(j.at("fused_group"));
  t.rows = j.at("rows").get<uint64_t>();
  t.groups = j.at("groups").get<uint64_t>();
  t.active_groups = j.at("active_groups").get<uint64_t>();
  t.zero_groups = j.at("zero_groups").get<uint64_t>();
  t.zero_groups_out_of_window = j.at("zero_groups_out_of_window").get<uint64_t>();
  t.nan_scales_active = j.at("nan_scales_active").get<uint64_t>();
  t.nan_scales_zero = j.at("nan_scales_zero").get<uint64_t>();
  t.over_span_groups = j.at("over_span_groups").get<uint64_t>();
  t.k_min = ExponentOf(j.at("k_min"));
  t.k_max = ExponentOf(j.at("k_max"));
  t.pair_k_max = ExponentOf(j.at("pair_k_max"));
  t.global_scale_bits = OptionalOf<uint32_t>(j.at("global_scale_bits"));
  return t;
}

json TensorJson(const PartTensor& t) {
  return {{"name", EncodeName(t.name)}, {"begin", t.begin}, {"end", t.end},
          {"sha256", ToHex(t.sha256)}};
}

PartTensor TensorOf(const json& j) {
  PartTensor t{Raw(j.at("name")), j.at("begin").get<uint64_t>(), j.at("end").get<uint64_t>(),
               Bytes<32>(j.at("sha256"))};
  if (t.end < t.begin) throw BadPart{"a tensor range that ends before it begins"};
  return t;
}

unsigned TreeOf(const json& j) {
  const std::string tree = j.get<std::string>();
  if (tree != "root" && tree != "source") throw BadPart{"a tree other than root or source"};
  return tree == "root" ? 0 : 1;
}

json PartJson(const AuditPart& p) {
  const PartOptions& o = p.options;
  const evidence::Environment& env = p.environment;
  json files = json::array();
  for (const PartFile& f : p.files) {
    json e = {{"tree", f.tree == 0 ? "root" : "source"}, {"name", f.name}, {"size", f.size},
              {"seen", ToHex(f.seen)}, {"hashed", f.hashed}};
    if (f.hashed) {
      e["sha256"] = f.sha256 ? json(ToHex(*f.sha256)) : json();
      e["git_blob_id"] = f.git_blob_id ? json(ToHex(*f.git_blob_id)) : json();
      e["tensors"] = json::array();
      for (const PartTensor& t : f.tensors) e["tensors"].push_back(TensorJson(t));
    }
    files.push_back(std::move(e));
  }
  json ranges = json::array();
  for (const PartRange& r : p.ranges) {
    json e = TensorJson(r.tensor);
    e["tree"] = r.tree == 0 ? "root" : "source";
    e["file"] = r.file;
    ranges.push_back(std::move(e));
  }
  json window = json::array();
  for (const WindowUnitResult& u : p.window_units) {
    json members = json::array();
    for (const quant::ScaleWindowMemberResult& m : u.members) {
      members.push_back({{"order", m.order}, {"stats", StatsJson(m.stats)},
                         {"nan", FindingsJson(m.nan)}, {"over_span", FindingsJson(m.over_span)}});
    }
    window.push_back({{"unit", u.unit}, {"name", EncodeName(u.name)}, {"members", members}});
  }
  json pair = json::array();
  for (const PairUnitResult& u : p.pair_units) {
    const quant::PairUnitOutcome& o = u.outcome;
    pair.push_back({{"unit", u.unit},
                    {"name", EncodeName(u.name)},
                    {"found", FindingsJson(o.found)},
                    {"packed_bytes", o.packed_bytes},
                    {"value_blocks", o.value_blocks},
                    {"zero_canonicalized", o.zero_canonicalized},
                    {"ignored_bytes", o.ignored_bytes},
                    {"global_bits", Optional(o.global_bits)},
                    {"scale_bytes", ScaleBytesJson(o)}});
  }
  return {{"schema", kSchema},
          {"part", {{"index", p.spec.index}, {"count", p.spec.count}}},
          {"options",
           {{"root", EncodeName(o.root)},
            {"source", EncodeName(o.source)},
            {"policy", o.policy},
            {"root_map", o.root_map},
            {"model_ref", o.model_ref},
            {"source_ref", o.source_ref},
            {"image_digest", o.image_digest},
            {"invoker", o.invoker},
            {"allow_symlinks", o.allow_symlinks},
            {"confine", o.confine},
            {"allowed", o.allowed}}},
          {"environment",
           {{"tool_version", env.tool_version},
            {"git_commit", env.git_commit},
            {"host", EncodeName(env.host)},
            {"os", env.os},
            {"cpu_model", env.cpu_model},
            {"cpu_threads", env.cpu_threads}}},
          {"roots_seen",
           {{"root", EncodeName(p.root_seen)}, {"source", EncodeName(p.source_seen)}}},
          {"started_at", p.started_at},
          {"finished_at", p.finished_at},
          {"bytes_read", p.bytes_read},
          {"verdict", p.verdict},
          {"files", files},
          {"ranges", ranges},
          {"scale_window_units", window},
          {"pair_units", pair}};
}

AuditPart PartOf(const json& j) {
  if (j.at("schema").get<std::string>() != kSchema) throw BadPart{"not an audit part schema"};
  AuditPart p;
  p.spec.index = j.at("part").at("index").get<unsigned>();
  p.spec.count = j.at("part").at("count").get<unsigned>();
  if (p.spec.count == 0 || p.spec.index >= p.spec.count) throw BadPart{"part index out of range"};
  const json& o = j.at("options");
  p.options.root = Raw(o.at("root"));
  p.options.source = Raw(o.at("source"));
  p.options.policy = o.at("policy").get<std::string>();
  p.options.root_map = o.at("root_map").get<std::vector<std::string>>();
  p.options.model_ref = o.at("model_ref").get<std::string>();
  p.options.source_ref = o.at("source_ref").get<std::string>();
  p.options.image_digest = o.at("image_digest").get<std::string>();
  p.options.invoker = o.at("invoker").get<std::string>();
  p.options.allow_symlinks = o.at("allow_symlinks").get<bool>();
  p.options.confine = o.at("confine").get<std::vector<std::string>>();
  p.options.allowed = o.at("allowed").get<std::vector<std::string>>();
  const json& env = j.at("environment");
  p.environment.tool_version = env.at("tool_version").get<std::string>();
  p.environment.git_commit = env.at("git_commit").get<std::string>();
  p.environment.host = Raw(env.at("host"));
  p.environment.os = env.at("os").get<std::string>();
  p.environment.cpu_model = env.at("cpu_model").get<std::string>();
  p.environment.cpu_threads = env.at("cpu_threads").get<int>();
  p.root_seen = Raw(j.at("roots_seen").at("root"));
  p.source_seen = Raw(j.at("roots_seen").at("source"));
  p.started_at = TimeOf(j.at("started_at"));
  p.finished_at = TimeOf(j.at("finished_at"));
  if (p.finished_at < p.started_at) throw BadPart{"a part that finished before it started"};
  p.bytes_read = j.at("bytes_read").get<uint64_t>();
  p.verdict = j.at("verdict").get<std::string>();
  for (const json& e : j.at("files")) {
    PartFile f;
    f.tree = TreeOf(e.at("tree"));
    f.name = e.at("name").get<std::string>();
    f.size = e.at("size").get<uint64_t>();
    f.seen = Bytes<32>(e.at("seen"));
    f.hashed = e.at("hashed").get<bool>();
    if (f.hashed) {
      if (!e.at("sha256").is_null()) f.sha256 = Bytes<32>(e.at("sha256"));
      if (!e.at("git_blob_id").is_null()) f.git_blob_id = Bytes<20>(e.at("git_blob_id"));
      for (const json& t : e.at("tensors")) f.tensors.push_back(TensorOf(t));
    }
    p.files.push_back(std::move(f));
  }
  for (const json& e : j.at("ranges")) {
    p.ranges.push_back({TreeOf(e.at("tree")), e.at("file").get<std::string>(), TensorOf(e)});
  }
  for (const json& e : j.at("scale_window_units")) {
    WindowUnitResult u{e.at("unit").get<size_t>(), Raw(e.at("name")), {}};
    for (const json& m : e.at("members")) {
      u.members.push_back({m.at("order").get<size_t>(), StatsOf(m.at("stats")),
                           FindingsOf(m.at("nan")), FindingsOf(m.at("over_span"))});
    }
    p.window_units.push_back(std::move(u));
  }
  for (const json& e : j.at("pair_units")) {
    PairUnitResult u{e.at("unit").get<size_t>(), Raw(e.at("name")), {}};
    u.outcome.found = FindingsOf(e.at("found"));
    u.outcome.packed_bytes = e.at("packed_bytes").get<uint64_t>();
    u.outcome.value_blocks = e.at("value_blocks").get<uint64_t>();
    u.outcome.zero_canonicalized = e.at("zero_canonicalized").get<uint64_t>();
    u.outcome.ignored_bytes = e.at("ignored_bytes").get<uint64_t>();
    u.outcome.global_bits = OptionalOf<uint32_t>(e.at("global_bits"));
    ScaleBytesOf(e.at("scale_bytes"), &u.outcome);
    p.pair_units.push_back(std::move(u));
  }
  return p;
}

}  // namespace

absl::StatusOr<std::string> SignAuditPart(const AuditPart& part, const evidence::SigningKey& key) {
  std::string payload;
  try {
    payload = DumpJson(PartJson(part));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("audit part: ", e.what()));
  }
  return evidence::SignEnvelope(payload, kAuditPartPayloadType, key);
}

absl::StatusOr<SignedPart> OpenAuditPart(const std::string& envelope,
                                         const evidence::TrustStore& trust,
                                         const std::string& label) {
  absl::StatusOr<evidence::Envelope> env = evidence::ParseEnvelope(envelope);
  if (!env.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", env.status().message()));
  }
  if (env->payload_type != kAuditPartPayloadType) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": payload type '", env->payload_type,
                                                   "' is not an audit part's"));
  }
  absl::StatusOr<std::string> signer = evidence::VerifyEnvelope(*env, trust);
  if (!signer.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(label, ": not a part signed by a trusted node key: ",
                     signer.status().message()));
  }
  absl::StatusOr<json> j = evidence::ParseStrictJson(env->payload, label);
  if (!j.ok()) return j.status();
  SignedPart signed_part;
  try {
    signed_part.part = PartOf(*j);
  } catch (const BadPart& e) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not an audit part: ", e.why));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not an audit part: ", e.what()));
  }
  signed_part.signer = *signer;
  signed_part.digest = Sha256Of(evidence::AsBytes(envelope));
  signed_part.label = label;
  return signed_part;
}

}  // namespace ckpt::audit
