#include "core/oci/manifest.h"

#include "absl/strings/str_cat.h"
#include "core/oci/reference.h"
#include "core/oci/registry.h"
#include "core/text/json_dump.h"
#include "core/text/json_parse.h"

namespace ckpt::oci {
namespace {

absl::StatusOr<Descriptor> DescriptorOf(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", why));
  };
  if (!j.is_object()) return bad("not an object");
  Descriptor d;
  if (!j.contains("mediaType") || !j["mediaType"].is_string()) return bad("no mediaType");
  d.media_type = j["mediaType"].get<std::string>();
  if (!j.contains("digest") || !j["digest"].is_string()) return bad("no digest");
  d.digest = j["digest"].get<std::string>();
  if (absl::Status s = CheckDigest(d.digest, where); !s.ok()) return s;
  if (!j.contains("size") || !j["size"].is_number_unsigned()) {
    return bad("no size (a non-negative integer)");
  }
  d.size = j["size"].get<uint64_t>();
  if (j.contains("artifactType")) {
    if (!j["artifactType"].is_string()) return bad("artifactType is not a string");
    d.artifact_type = j["artifactType"].get<std::string>();
  }
  if (j.contains("annotations")) {
    if (!j["annotations"].is_object()) return bad("annotations is not an object");
    for (const auto& [k, v] : j["annotations"].items()) {
      if (!v.is_string()) return bad(absl::StrCat("annotation ", k, " is not a string"));
      d.annotations[k] = v.get<std::string>();
    }
  }
  return d;
}

nlohmann::ordered_json DescriptorJson(const Descriptor& d) {
  nlohmann::ordered_json j = {{"mediaType", d.media_type}, {"digest", d.digest}, {"size", d.size}};
  if (!d.artifact_type.empty()) j["artifactType"] = d.artifact_type;
  if (!d.annotations.empty()) j["annotations"] = d.annotations;
  return j;
}

}  // namespace

absl::StatusOr<Manifest> ParseManifest(absl::string_view bytes, absl::string_view content_type,
                                       const std::string& label) {
  auto j = ParseBoundedJson(std::string_view(bytes.data(), bytes.size()), label);
  if (!j.ok()) return j.status();
  if (!j->is_object()) return absl::InvalidArgumentError(absl::StrCat(label, ": not an object"));
  Manifest m;
  if (j->contains("mediaType") && (*j)["mediaType"].is_string()) {
    m.media_type = (*j)["mediaType"].get<std::string>();
  } else {
    m.media_type = std::string(content_type.substr(0, content_type.find(';')));
  }
  if (m.media_type == kOciIndex || m.media_type == kDockerManifestList ||
      (m.media_type.empty() && j->contains("manifests"))) {
    return absl::FailedPreconditionError(absl::StrCat(
        label, " is an image index (", m.media_type.empty() ? kOciIndex : m.media_type,
        "): ckpt-audit does not pick a platform; name one of its manifests by digest"));
  }
  if (m.media_type.empty()) m.media_type = kOciManifest;  // the OCI spec's default
  if (m.media_type != kOciManifest && m.media_type != kDockerManifest) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": media type ", m.media_type, " is neither ", kOciManifest, " nor ",
        kDockerManifest));
  }
  if (!j->contains("schemaVersion") || (*j)["schemaVersion"] != 2) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": schemaVersion is not 2"));
  }
  if (j->contains("artifactType")) {
    if (!(*j)["artifactType"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(label, ": artifactType is not a string"));
    }
    m.artifact_type = (*j)["artifactType"].get<std::string>();
  }
  if (!j->contains("config")) return absl::InvalidArgumentError(absl::StrCat(label, ": no config"));
  auto config = DescriptorOf((*j)["config"], absl::StrCat(label, ": config"));
  if (!config.ok()) return config.status();
  m.config = *std::move(config);
  if (!j->contains("layers") || !(*j)["layers"].is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": no layers array"));
  }
  size_t i = 0;
  for (const auto& l : (*j)["layers"]) {
    auto d = DescriptorOf(l, absl::StrCat(label, ": layer ", i++));
    if (!d.ok()) return d.status();
    m.layers.push_back(*std::move(d));
  }
  if (j->contains("subject")) {
    auto s = DescriptorOf((*j)["subject"], absl::StrCat(label, ": subject"));
    if (!s.ok()) return s.status();
    m.subject = *std::move(s);
  }
  if (j->contains("annotations") && (*j)["annotations"].is_object()) {
    for (const auto& [k, v] : (*j)["annotations"].items()) {
      if (v.is_string()) m.annotations[k] = v.get<std::string>();
    }
  }
  return m;
}

std::string ManifestBytes(const Manifest& m) {
  nlohmann::ordered_json j = {{"schemaVersion", 2}, {"mediaType", m.media_type}};
  if (!m.artifact_type.empty()) j["artifactType"] = m.artifact_type;
  j["config"] = DescriptorJson(m.config);
  j["layers"] = nlohmann::ordered_json::array();
  for (const Descriptor& d : m.layers) j["layers"].push_back(DescriptorJson(d));
  if (m.subject) j["subject"] = DescriptorJson(*m.subject);
  if (!m.annotations.empty()) j["annotations"] = m.annotations;
  return DumpJson(j);
}

absl::StatusOr<std::vector<Descriptor>> ParseIndex(absl::string_view bytes,
                                                   const std::string& label) {
  auto j = ParseBoundedJson(std::string_view(bytes.data(), bytes.size()), label);
  if (!j.ok()) return absl::InvalidArgumentError(j.status().message());
  if (!j->is_object() || !j->contains("schemaVersion") || (*j)["schemaVersion"] != 2 ||
      !j->contains("mediaType") || (*j)["mediaType"] != kOciIndex || !j->contains("manifests") ||
      !(*j)["manifests"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": not an OCI image index (schemaVersion 2, mediaType ", kOciIndex,
                     ", a manifests array)"));
  }
  std::vector<Descriptor> out;
  for (size_t i = 0; i < (*j)["manifests"].size(); ++i) {
    auto d = DescriptorOf((*j)["manifests"][i], absl::StrCat(label, " manifests[", i, "]"));
    if (!d.ok()) return d.status();
    out.push_back(*std::move(d));
  }
  return out;
}

std::string IndexBytes(const std::vector<Descriptor>& manifests) {
  nlohmann::ordered_json j = {{"schemaVersion", 2}, {"mediaType", kOciIndex}};
  j["manifests"] = nlohmann::ordered_json::array();
  for (const Descriptor& d : manifests) j["manifests"].push_back(DescriptorJson(d));
  return DumpJson(j);
}

}  // namespace ckpt::oci
