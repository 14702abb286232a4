// The OCI registry client and oci:// audits (docs/interop.md, "OCI registries"): tar layers
// in-process, named errors against tests/oci/fake_registry.py (bearer tokens, redirects to
// storage, 429, wrong digests, tampered and mis-sized layers), and a ModelPack artifact of the
// fixture pair pushed to Debian's docker-registry, audited over oci:// and on disk; verdicts
// attached as referrers (`attach`, `verify-oci`) through the referrers tag schema there and the
// referrers API of the fake.
#include <zstd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "core/audit/audit_checks.h"
#include "core/evidence/base64.h"
#include "core/evidence/dsse.h"
#include "core/evidence/ed25519.h"
#include "core/evidence/record.h"
#include "core/interop/tree_subjects.h"
#include "core/oci/artifact.h"
#include "core/oci/audit_trees.h"
#include "core/oci/credentials.h"
#include "core/oci/referrers.h"
#include "core/oci/tar_layer.h"
#include "core/sha256.h"
#include "nlohmann/json.hpp"
#include "storage/evidence_log.h"
#include "tests/oci/oci_harness.h"

namespace ckpt {
namespace {

using ::ckpt::testing::Child;
using ::ckpt::testing::Curl;
using ::ckpt::testing::FakeRegistry;
using ::ckpt::testing::FakeSetup;
using ::ckpt::testing::Fixture;
using ::ckpt::testing::Gzip;
using ::ckpt::testing::ModelManifest;
using ::ckpt::testing::PairInRegistry;
using ::ckpt::testing::PushPairToDockerRegistry;
using ::ckpt::testing::Push;
using ::ckpt::testing::RawLayer;
using ::ckpt::testing::ReadAll;
using ::ckpt::testing::ServeFixture;
using ::ckpt::testing::TarEnd;
using ::ckpt::testing::TarEntry;
using ::ckpt::testing::TempDir;
using ::ckpt::testing::Text;
using ::ckpt::testing::WriteAll;
using ::testing::HasSubstr;

std::string Zstd(const std::string& in) {
  std::string out(ZSTD_compressBound(in.size()), '\0');
  out.resize(ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 3));
  return out;
}

absl::StatusOr<std::vector<oci::TarEntry>> Unpack(const std::string& bytes, oci::Compression c,
                                                  uint64_t budget = 1 << 20, size_t piece = 100) {
  oci::TarLayer tar("layer", c, &budget);
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  for (size_t i = 0; i < bytes.size(); i += piece) {  // in pieces, as the network gives them
    absl::Status s = tar.Feed({p + i, std::min<size_t>(piece, bytes.size() - i)});
    if (!s.ok()) return s;
  }
  return tar.Finish();
}

TEST(OciReference, ParsesDigestsAndTags) {
  const std::string hex(64, 'a');
  auto d = oci::ParseReference("oci://localhost:5000/org/model@sha256:" + hex);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->registry, "localhost:5000");
  EXPECT_EQ(d->repository, "org/model");
  EXPECT_EQ(d->digest, "sha256:" + hex);
  EXPECT_TRUE(d->Loopback());
  auto t = oci::ParseReference("oci://registry.example:443/model:v1.2");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->tag, "v1.2");
  EXPECT_FALSE(t->Loopback());
  // A registry alone (ckpt-auditd --allow-registry) is lower-cased as a reference's is.
  EXPECT_EQ(*oci::ParseRegistry("LocalHost:5000"), "localhost:5000");
  EXPECT_EQ(*oci::ParseRegistry("[::1]:5000"), "[::1]:5000");
  for (const char* bad : {"", "registry.example/path", "user@registry", "oci://r"}) {
    EXPECT_EQ(oci::ParseRegistry(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  for (const char* bad : {"registry/model:v1", "oci://registry", "oci://r/Model:v1",
                          "oci://r/model", "oci://r/model@sha256:abc", "oci://r/a//b:v1",
                          "oci://r/model@md5:0123"}) {
    EXPECT_EQ(oci::ParseReference(bad).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

TEST(OciTarLayer, UnpacksPlainGzipAndZstd) {
  const std::string tar = TarEntry("./dir/", '5', "") + TarEntry("./dir/a.json", '0', "{}") +
                          TarEntry("b.safetensors", '0', std::string(700, 'x')) + TarEnd();
  for (auto [bytes, c] : {std::pair{tar, oci::Compression::kNone},
                          std::pair{Gzip(tar), oci::Compression::kGzip},
                          std::pair{Zstd(tar), oci::Compression::kZstd}}) {
    auto entries = Unpack(bytes, c);
    ASSERT_TRUE(entries.ok()) << entries.status();
    ASSERT_EQ(entries->size(), 2u);
    EXPECT_EQ((*entries)[0].path, "dir/a.json");
    EXPECT_EQ(Text(*(*entries)[0].bytes), "{}");
    EXPECT_EQ((*entries)[1].bytes->size(), 700u);
  }
}

// A layer whose bytes are not the compression its media type says is refused, naming both,
// before anything is decompressed (docs/interop.md, "What is refused"); whether the bytes come
// one at a time or in pieces.
TEST(OciTarLayer, AMediaTypeThatLiesAboutCompressionIsNamed) {
  const std::string tar = TarEntry("a.json", '0', "{}") + TarEnd();
  const std::vector<std::pair<std::string, std::string>> bytes = {
      {tar, "(neither gzip nor zstd)"}, {Gzip(tar), "(gzip)"}, {Zstd(tar), "(zstd)"}};
  const std::vector<std::pair<oci::Compression, std::string>> declared = {
      {oci::Compression::kNone, "an uncompressed tar"},
      {oci::Compression::kGzip, "gzip"},
      {oci::Compression::kZstd, "zstd"}};
  for (size_t piece : {size_t{1}, size_t{100}}) {
    for (size_t b = 0; b < bytes.size(); ++b) {
      for (size_t d = 0; d < declared.size(); ++d) {
        auto got = Unpack(bytes[b].first, declared[d].first, 1 << 20, piece);
        if (b == d) {
          ASSERT_TRUE(got.ok()) << got.status();
          EXPECT_EQ(got->size(), 1u);
          continue;
        }
        EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument) << b << d;
        EXPECT_THAT(got.status().message(), HasSubstr("the media type says " + declared[d].second))
            << got.status();
        EXPECT_THAT(got.status().message(), HasSubstr(bytes[b].second)) << got.status();
      }
    }
  }
}

TEST(OciTarLayer, RefusesHostileEntries) {
  struct Case {
    std::string tar, why;
  } cases[] = {
      {TarEntry("../escape", '0', "x"), "'..' component"},
      {TarEntry("a/../../escape", '0', "x"), "'..' component"},
      {TarEntry("/etc/passwd", '0', "x"), "is absolute"},
      {TarEntry("model.safetensors", '2', "", "/etc/passwd"), "symbolic link"},
      {TarEntry("model.safetensors", '1', "", "other"), "hard link"},
      {TarEntry("dir/.wh.model.safetensors", '0', ""), "whiteout"},
      {TarEntry("fifo", '6', ""), "only regular files and directories"},
  };
  for (const Case& c : cases) {
    auto entries = Unpack(c.tar + TarEnd(), oci::Compression::kNone);
    EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument) << c.why;
    EXPECT_THAT(entries.status().message(), HasSubstr(c.why));
  }
  // A truncated archive and corrupt compression are refused, never half-read.
  std::string tar = TarEntry("a", '0', std::string(2000, 'a')) + TarEnd();
  EXPECT_FALSE(Unpack(tar.substr(0, 1000), oci::Compression::kNone).ok());
  std::string gz = Gzip(tar);
  EXPECT_FALSE(Unpack(gz.substr(0, gz.size() / 2), oci::Compression::kGzip).ok());
}

TEST(OciTarLayer, FilesCountAgainstTheWindowBeforeTheyAreKept) {
  std::string tar = TarEntry("big", '0', std::string(5000, 'b')) + TarEnd();
  auto entries = Unpack(tar, oci::Compression::kNone, 4096);
  EXPECT_EQ(entries.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(entries.status().message(), HasSubstr("--memory-window"));
  EXPECT_TRUE(Unpack(tar, oci::Compression::kNone, 5000 + 1024).ok());
}

// A pax header naming `path` for the entry after it.
std::string PaxPath(const std::string& path) {
  std::string record = " path=" + path + "\n";
  std::string len = std::to_string(record.size() + 1);
  len = std::to_string(record.size() + len.size());  // the length counts its own digits
  return TarEntry("pax", 'x', len + record);
}

TEST(OciTarLayer, NamesOfEmptyFilesCountAgainstTheWindowToo) {
  // 1000 empty files with 4 KiB names: 4 MiB kept for no contents (a gzip layer of such an
  // archive is a few KiB; with a million entries and 64 KiB names it would be 64 GiB).
  std::string tar;
  for (int i = 0; i < 1000; ++i) {
    tar += PaxPath(std::to_string(i) + "/" + std::string(4000, 'n')) + TarEntry("x", '0', "");
  }
  tar += TarEnd();
  auto entries = Unpack(Gzip(tar), oci::Compression::kGzip, 1 << 20);
  EXPECT_EQ(entries.status().code(), absl::StatusCode::kResourceExhausted) << entries.status();
  EXPECT_THAT(entries.status().message(), HasSubstr("of bookkeeping) do not fit"));
  auto fits = Unpack(Gzip(tar), oci::Compression::kGzip, 8 << 20);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->size(), 1000u);
  EXPECT_EQ(fits->back().path, "999/" + std::string(4000, 'n'));
}

// Whether `entries` pass the artifact's rule for its files (core/oci/artifact.cc AddFile): no
// name twice, and no file where another's directory is.
bool ArtifactTakes(const std::vector<oci::TarEntry>& entries) {
  std::set<std::string> files;
  for (const oci::TarEntry& e : entries) {
    if (!files.insert(e.path).second) return false;
  }
  for (const std::string& f : files) {
    for (size_t slash = f.find('/'); slash != std::string::npos; slash = f.find('/', slash + 1)) {
      if (files.contains(f.substr(0, slash))) return false;
    }
  }
  return true;
}

// The names audited are the names extractors write (docs/interop.md, "Tar headers"):
// tests/oci/tar_differential.py writes a corpus of odd headers (old-GNU times where ustar keeps
// a prefix, a pax path beside a GNU long name, global and sparse pax names, links, `..`,
// absolute paths, NUL in names, duplicates) beside archives that Python's tarfile and GNU tar
// make in each of their formats, and what `tar -xf` and tarfile make of each. An archive the
// layer reader (with the artifact's rule for names) accepts must give exactly the files both
// write; the corpus says which archives must be accepted and which refused.
TEST(OciTarLayer, AcceptedArchivesNameWhatGnuTarAndPythonTarfileWrite) {
  TempDir dir;
  const std::string script = std::string(testing::kSourceDir) + "/tests/oci/tar_differential.py";
  ASSERT_EQ(std::system(("python3 '" + script + "' '" + dir.path().string() + "'").c_str()), 0);
  const nlohmann::json cases = nlohmann::json::parse(Text(ReadAll(dir / "cases.json")));
  ASSERT_GE(cases.size(), 40u);
  int accepted = 0, refused = 0;
  for (const nlohmann::json& c : cases) {
    const std::string name = c["name"];
    auto entries = Unpack(Text(ReadAll(c["file"].get<std::string>())), oci::Compression::kNone);
    const bool ok = entries.ok() && ArtifactTakes(*entries);
    if (c["must_accept"] == true) {
      EXPECT_TRUE(ok) << name << ": " << entries.status();
      EXPECT_EQ(c["gnu"], c["python"]) << name << ": the two extractors disagree";
    } else if (c["must_accept"] == false) {
      EXPECT_FALSE(ok) << name << ": accepted";
    }
    if (!entries.ok()) {
      EXPECT_EQ(entries.status().code(), absl::StatusCode::kInvalidArgument)
          << name << ": " << entries.status();
    }
    if (!ok) {
      ++refused;
      continue;
    }
    ++accepted;
    nlohmann::json ours = nlohmann::json::object();
    for (const oci::TarEntry& e : *entries) {
      ours[ToHex({reinterpret_cast<const uint8_t*>(e.path.data()), e.path.size()})] =
          ToHex(Sha256Of(*e.bytes));
    }
    EXPECT_EQ(ours, c["gnu"]) << name << ": GNU tar writes other files";
    EXPECT_EQ(ours, c["python"]) << name << ": Python's tarfile names other files";
  }
  std::printf("tar corpus: %d archives accepted, %d refused\n", accepted, refused);
}

TEST(OciManifest, IndexIsRefusedByName) {
  std::string index = R"({"schemaVersion":2,"mediaType":")" + std::string(oci::kOciIndex) +
                      R"(","manifests":[]})";
  auto m = oci::ParseManifest(index, "", "oci://r/m@x");
  EXPECT_EQ(m.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(m.status().message(), HasSubstr("image index"));
}

oci::ArtifactOptions NoCredentials(const FakeSetup& s) {
  oci::ArtifactOptions o;
  o.client.docker_config = (s.dir() / "absent-config.json").string();
  return o;
}

// Reads the whole file `name` of the artifact through its io::Directory (by position).
absl::StatusOr<std::string> ReadFile(const oci::Artifact& a, const std::string& name,
                                     uint64_t size) {
  auto f = a.root()->OpenFile(name);
  if (!f.ok()) return f.status();
  std::string out(size, '\0');
  auto n = (*f)->Read(0, {reinterpret_cast<uint8_t*>(out.data()), out.size()});
  if (!n.ok()) return n.status();
  out.resize(*n);
  return out;
}

const std::string kWeights = std::string(3000, 'w');

TEST(OciFakeRegistry, BearerTokenFromTheDockerConfigsCredentials) {
  FakeSetup s;
  s.cfg()["token"] = {{"user", "u"}, {"password", "p"}, {"token", "tok123"}};
  s.Blob(kWeights);
  std::string digest = s.Manifest(ModelManifest({RawLayer("w.safetensors", kWeights)}, ""));
  auto reg = s.Start();
  oci::ArtifactOptions o;
  o.client.docker_config = s.DockerConfig(reg->host(), "u:p");
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, o);
  ASSERT_TRUE(a.ok()) << a.status();
  auto bytes = ReadFile(**a, "w.safetensors", kWeights.size());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, kWeights);
  std::string log = s.Log();
  EXPECT_THAT(log, HasSubstr("GET /token?service=fake&scope=repository%3Am%3Apull auth=Basic"));
  EXPECT_THAT(log, HasSubstr("/blobs/" + oci::DigestOf(kWeights) + " auth=Bearer tok123"));
}

TEST(OciFakeRegistry, TokenFlowFailuresAreUnauthenticated) {
  FakeSetup s;
  s.cfg()["token"] = {{"user", "u"}, {"password", "p"}, {"token", "tok123"}};
  std::string digest = s.Manifest(ModelManifest({}, ""));
  {
    auto reg = s.Start();  // no credentials: the token endpoint refuses
    auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, NoCredentials(s));
    EXPECT_EQ(a.status().code(), absl::StatusCode::kUnauthenticated);
    EXPECT_THAT(a.status().message(), HasSubstr("no credentials for this registry"));
  }
  s.cfg()["reject_token"] = true;
  auto reg = s.Start();
  oci::ArtifactOptions o;
  o.client.docker_config = s.DockerConfig(reg->host(), "u:p");
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, o);
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(a.status().message(), HasSubstr("answered 401 again after authenticating"));
}

TEST(OciFakeRegistry, RedirectToStorageNeverCarriesTheToken) {
  FakeSetup s;
  s.cfg()["token"] = {{"user", "u"}, {"password", "p"}, {"token", "tok123"}};
  s.cfg()["redirect_blobs"] = true;  // its storage answers 400 to any Authorization header
  s.Blob(kWeights);
  std::string digest = s.Manifest(ModelManifest({RawLayer("w.safetensors", kWeights)}, ""));
  auto reg = s.Start();
  oci::ArtifactOptions o;
  o.client.docker_config = s.DockerConfig(reg->host(), "u:p");
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, o);
  ASSERT_TRUE(a.ok()) << a.status();
  auto bytes = ReadFile(**a, "w.safetensors", kWeights.size());
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, kWeights);
  std::string log = s.Log();
  EXPECT_THAT(log, HasSubstr("storage GET /storage/" + oci::DigestOf(kWeights) + " auth=no"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("auth=yes")));
}

TEST(OciFakeRegistry, TooManyRequestsIsNamedAndNotRetried) {
  FakeSetup s;
  s.cfg()["status"] = {{"blobs", 429}};
  s.Blob(kWeights);
  std::string digest = s.Manifest(ModelManifest({RawLayer("w.safetensors", kWeights)}, ""));
  auto reg = s.Start();
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, NoCredentials(s));
  ASSERT_TRUE(a.ok()) << a.status();
  auto bytes = ReadFile(**a, "w.safetensors", kWeights.size());
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(bytes.status().message(), HasSubstr("registry " + reg->host() + " answered 429"));
  EXPECT_THAT(bytes.status().message(), HasSubstr("Retry-After: 7"));
  std::string log = s.Log();
  size_t blob_requests = 0;
  for (size_t at = log.find("/blobs/"); at != std::string::npos; at = log.find("/blobs/", at + 1)) {
    ++blob_requests;
  }
  EXPECT_EQ(blob_requests, 1u);
}

TEST(OciFakeRegistry, ManifestWhoseBytesAreNotTheDigestAskedFor) {
  FakeSetup s;
  const std::string other = oci::DigestOf("another manifest");
  s.Manifest(ModelManifest({}, ""), "", other);
  auto reg = s.Start();
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + other, NoCredentials(s));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(a.status().message(), HasSubstr("not the digest asked for"));
}

// A tag answered with a Docker-Content-Digest that is not the digest of the bytes served.
TEST(OciFakeRegistry, ATagAnsweredWithAnotherDigestIsRefused) {
  FakeSetup s;
  const std::string other = oci::DigestOf("another manifest");
  s.Manifest(ModelManifest({}, ""), "v1");
  s.cfg()["manifests"]["v1"]["digest_header"] = other;
  auto reg = s.Start();
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m:v1", NoCredentials(s));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(a.status().message(), HasSubstr("the registry says " + other));
}

TEST(OciFakeRegistry, LayerLongerOrShorterThanItsDescriptor) {
  FakeSetup s;
  oci::Descriptor longer = RawLayer("long.safetensors", kWeights);
  longer.size -= 10;  // the registry serves 10 more bytes than the manifest says
  oci::Descriptor shorter = RawLayer("short.safetensors", kWeights + "0123456789");
  s.Blob(kWeights, shorter.digest);  // the registry serves 10 fewer bytes
  s.Blob(kWeights);
  std::string tar = TarEntry("a.json", '0', "{}") + TarEnd();
  oci::Descriptor tar_layer{"application/vnd.oci.image.layer.v1.tar", oci::DigestOf(tar),
                            tar.size() - 512};
  s.Blob(tar);
  std::string raw_only = s.Manifest(ModelManifest({longer, shorter}, ""));
  std::string with_tar = s.Manifest(ModelManifest({tar_layer}, ""));
  auto reg = s.Start();
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + raw_only, NoCredentials(s));
  ASSERT_TRUE(a.ok()) << a.status();
  auto l = ReadFile(**a, "long.safetensors", 100);
  EXPECT_EQ(l.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(l.status().message(), HasSubstr("longer than its descriptor"));
  auto sh = ReadFile(**a, "short.safetensors", 100);
  EXPECT_EQ(sh.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(sh.status().message(), HasSubstr("shorter than its descriptor"));
  auto t = oci::Artifact::Open("oci://" + reg->host() + "/m@" + with_tar, NoCredentials(s));
  EXPECT_EQ(t.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(t.status().message(), HasSubstr("longer than its descriptor"));
}

TEST(OciFakeRegistry, TamperedTarLayerAndDuplicateNamesAreRefused) {
  FakeSetup s;
  std::string tar = TarEntry("a.json", '0', "{}") + TarEnd();
  std::string gz = Gzip(tar);
  oci::Descriptor layer{"application/vnd.cncf.model.weight.config.v1.tar+gzip",
                        oci::DigestOf(gz), gz.size()};
  std::string tampered = Gzip(TarEntry("a.json", '0', "[]") + TarEnd());
  ASSERT_EQ(tampered.size(), gz.size());
  s.Blob(tampered, layer.digest);
  std::string bad = s.Manifest(ModelManifest({layer}, ""));
  std::string dup_tar = TarEntry("a.json", '0', "{}") + TarEntry("./a.json", '0', "{}") + TarEnd();
  oci::Descriptor dup{"application/vnd.oci.image.layer.v1.tar", oci::DigestOf(dup_tar),
                      dup_tar.size()};
  s.Blob(dup_tar);
  std::string dups = s.Manifest(ModelManifest({dup}, ""));
  s.Blob("{}");
  std::string twice = s.Manifest(ModelManifest({RawLayer("a.json", "{}"), RawLayer("a.json", "{}")},
                                               ""));
  auto reg = s.Start();
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + bad, NoCredentials(s));
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(a.status().message(), HasSubstr("not to the manifest's digest"));
  for (const std::string& d : {dups, twice}) {
    auto b = oci::Artifact::Open("oci://" + reg->host() + "/m@" + d, NoCredentials(s));
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(b.status().message(), HasSubstr("duplicate names are refused"));
  }
}

// The fake registry's log lines of GETs of blob `digest`.
std::vector<std::string> BlobRequests(const std::string& log, const std::string& digest) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "GET /v2/m/blobs/" + digest)) out.emplace_back(line);
  }
  return out;
}

TEST(OciFakeRegistry, TamperedRawLayerFailsTheAuditAndSignsNothing) {
  for (const std::string tamper : {"", "model-00002-of-00002.safetensors"}) {
    FakeSetup s;
    std::string digest = ServeFixture(s, "mini-kimi-nvfp4", tamper);
    auto reg = s.Start();
    setenv("DOCKER_CONFIG", s.dir().path().c_str(), 1);  // holds no config.json
    audit::AuditOptions o;
    o.root = "oci://" + reg->host() + "/m@" + digest;
    ASSERT_TRUE(oci::OpenOciTrees(&o).ok());
    auto rec = audit::RunAudit(o, NoProgress());
    if (tamper.empty()) {
      EXPECT_TRUE(rec.ok()) << rec.status();
      // One Range request a read before the read-ahead buffer (docs/interop.md, "Fewer
      // requests"): 296 for this tree. Now a few for each file's header and stream.
      EXPECT_LE(BlobRequests(s.Log(), "").size(), 16u) << s.Log();
      continue;
    }
    EXPECT_EQ(rec.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(rec.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
    EXPECT_THAT(rec.status().message(), HasSubstr("a tampered layer"));
  }
}

// --- fewer, larger requests for raw layers (docs/interop.md, "Fewer requests") ---

std::string RandomBytes(size_t n) {
  std::mt19937 rng(7);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

TEST(OciReadAhead, ForwardReadsShareRequestsAndReadsBehindGetTheirOwn) {
  FakeSetup s;
  const std::string bytes = RandomBytes((3u << 20) + 123);
  const std::string blob = s.Blob(bytes);
  std::string digest = s.Manifest(ModelManifest({RawLayer("w.safetensors", bytes)}, ""));
  auto reg = s.Start();
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, NoCredentials(s));
  ASSERT_TRUE(a.ok()) << a.status();
  auto f = (*a)->root()->OpenFile("w.safetensors");
  ASSERT_TRUE(f.ok()) << f.status();
  // The engine's pattern: a cursor front to back in small reads from the end of the header,
  // jumping over tensors it read ahead (in two reads each, 600 KiB ahead of it), with reads far
  // ahead (the end of the file) and behind it (a tensor read again).
  std::vector<std::pair<uint64_t, size_t>> reads;
  std::map<uint64_t, uint64_t> kept;  // read ahead: begin -> end
  size_t positioned = 0;
  uint64_t behind = 0;
  for (uint64_t at = 1000, i = 0; at < bytes.size(); ++i) {
    if (auto k = kept.find(at); k != kept.end()) {
      at = k->second;  // hashed from what was read ahead: no read
      continue;
    }
    reads.emplace_back(at, 4096);
    if (i % 64 == 63 && at > (1u << 20)) {
      reads.emplace_back(bytes.size() - 3000 - at / 1000, 1000);  // ahead
      behind = at / 4 + 17;
      reads.emplace_back(behind, 5000);
      positioned += 2;
    }
    if (i % 128 == 1 && at + (600u << 10) + 20000 < bytes.size()) {
      const uint64_t tensor = at + (600u << 10);
      reads.emplace_back(tensor, 10000);
      reads.emplace_back(tensor + 10000, 10000);
      kept[tensor] = tensor + 20000;
      positioned += 2;
    }
    at += 4096;
  }
  for (auto [at, n] : reads) {
    std::string out(n, '\0');
    auto got = (*f)->Read(at, {reinterpret_cast<uint8_t*>(out.data()), n});
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(*got, std::min<uint64_t>(n, bytes.size() - at)) << at;
    ASSERT_EQ(out.substr(0, *got), bytes.substr(at, *got)) << "wrong bytes at " << at;
  }
  // At end of file: nothing, and no request.
  uint8_t extra;
  auto end = (*f)->Read(bytes.size(), {&extra, 1});
  ASSERT_TRUE(end.ok());
  EXPECT_EQ(*end, 0u);
  std::vector<std::string> requests = BlobRequests(s.Log(), blob);
  // One request a read before: 780. Now 256 KiB, 512 KiB, 1 MiB, 2 MiB for the cursor, and the
  // reads ahead of it or behind it outside the buffer: at most one each, of what was asked.
  EXPECT_LE(requests.size(), 4 + positioned) << absl::StrJoin(requests, "\n");
  EXPECT_THAT(requests[0], HasSubstr("range=bytes=1000-263143"));
  EXPECT_THAT(absl::StrJoin(requests, "\n"),
              HasSubstr(absl::StrCat("range=bytes=", behind, "-", behind + 4999)));
}

TEST(OciReadAhead, BuffersStayWithinTheArtifactsBudget) {
  FakeSetup s;
  const std::string bytes = RandomBytes(1u << 20);
  const std::string blob = s.Blob(bytes);
  std::string digest = s.Manifest(ModelManifest({RawLayer("w.safetensors", bytes)}, ""));
  auto reg = s.Start();
  auto read = [&](const oci::Artifact& a, int count) {
    auto f = a.root()->OpenFile("w.safetensors");
    ASSERT_TRUE(f.ok()) << f.status();
    for (int i = 0; i < count; ++i) {
      std::string out(1000, '\0');
      auto got = (*f)->Read(i * 1000, {reinterpret_cast<uint8_t*>(out.data()), out.size()});
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_EQ(out, bytes.substr(i * 1000, 1000));
    }
  };
  oci::ArtifactOptions none = NoCredentials(s);
  none.read_ahead_budget = 0;  // no buffer at all: a request for each read, as asked
  auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, none);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_NO_FATAL_FAILURE(read(**a, 10));
  std::vector<std::string> requests = BlobRequests(s.Log(), blob);
  ASSERT_EQ(requests.size(), 10u);
  EXPECT_THAT(requests[9], HasSubstr("range=bytes=9000-9999"));

  // A budget of one first buffer: a second file open at once gets none, and a file closed
  // gives its buffer back.
  oci::ArtifactOptions one = NoCredentials(s);
  one.read_ahead_budget = 256u << 10;
  auto b = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, one);
  ASSERT_TRUE(b.ok()) << b.status();
  auto first = (*b)->root()->OpenFile("w.safetensors");
  ASSERT_TRUE(first.ok());
  uint8_t byte;
  ASSERT_TRUE((*first)->Read(0, {&byte, 1}).ok());
  const size_t before = BlobRequests(s.Log(), blob).size();
  ASSERT_NO_FATAL_FAILURE(read(**b, 10));
  EXPECT_EQ(BlobRequests(s.Log(), blob).size(), before + 10);
  first->reset();
  ASSERT_NO_FATAL_FAILURE(read(**b, 10));
  EXPECT_EQ(BlobRequests(s.Log(), blob).size(), before + 11);
}

// An input, the error it must give and a part of that error's message.
struct NamedError {
  std::string input;
  absl::StatusCode code;
  std::string why;
};

TEST(OciReadAhead, RangeAnswersThatAreNotTheRangeAskedForAreNamed) {
  const NamedError cases[] = {
      {"ignore", absl::StatusCode::kFailedPrecondition, "answered 200 to a Range request"},
      {"other_range", absl::StatusCode::kDataLoss, "asked for [0, 262144), got 262144 bytes as "
                                                   "'bytes 1-262144/1048576'"},
      {"short", absl::StatusCode::kDataLoss, "asked for [0, 262144), got 262143 bytes"},
  };
  for (const NamedError& c : cases) {
    FakeSetup s;
    const std::string bytes = RandomBytes(1u << 20);
    s.Blob(bytes);
    std::string digest = s.Manifest(ModelManifest({RawLayer("w.safetensors", bytes)}, ""));
    s.cfg()["range_answer"] = c.input;
    auto reg = s.Start();
    auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, NoCredentials(s));
    ASSERT_TRUE(a.ok()) << a.status();
    auto got = ReadFile(**a, "w.safetensors", 100);
    EXPECT_EQ(got.status().code(), c.code) << c.input << ": " << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr(c.why)) << c.input;
    EXPECT_THAT(got.status().message(), HasSubstr("/w.safetensors at 0: ")) << c.input;
  }
}

// --- Docker credential helpers (docs/interop.md, "Authentication and transport") ---

// Fake `docker-credential-NAME` programs in a directory put first on PATH for the test's life.
class CredentialHelpers {
 public:
  CredentialHelpers() : path_(std::getenv("PATH") == nullptr ? "" : std::getenv("PATH")) {
    const std::string stdin_copy = "cat > '" + (dir_ / "stdin-of-").string() + "'\"$1\"\n";
    Add("good", stdin_copy + "printf '{\"Username\":\"u\",\"Secret\":\"p\"}'\n");
    Add("wrong", "cat >/dev/null\nprintf '{\"Username\":\"u\",\"Secret\":\"wrong\"}'\n");
    Add("tok", stdin_copy + "printf '{\"Username\":\"<token>\",\"Secret\":\"refresh123\"}'\n");
    Add("none", "printf 'credentials not found in native keychain\\n'\nexit 1\n");
    Add("fail", "printf 'hunter2-secret'\nexit 3\n");
    Add("garbage", "printf 'Username: u'\n");
    Add("nosecret", "printf '{\"Username\":\"u\"}'\n");
    Add("huge", "exec head -c 1000000 /dev/zero\n");
    Add("hang", "exec sleep 30\n");
    setenv("PATH", (dir_.path().string() + ":" + path_).c_str(), 1);
  }
  ~CredentialHelpers() { setenv("PATH", path_.c_str(), 1); }
  // What the helper `name` read on its standard input.
  std::string StdinOf(const std::string& name) {
    return Text(ReadAll(dir_ / ("stdin-of-" + name)));
  }

 private:
  void Add(const std::string& name, const std::string& body) {
    std::filesystem::path p = dir_ / ("docker-credential-" + name);
    // "$1" is "get"; the copy of stdin is named by the helper.
    std::string script = "#!/bin/sh\nset -- " + name + "\n" + body;
    WriteAll(p, script);
    std::filesystem::permissions(p, std::filesystem::perms::owner_all);
  }
  TempDir dir_;
  std::string path_;
};

std::string ConfigWith(const TempDir& dir, const nlohmann::json& j) {
  std::filesystem::path p = dir / "config.json";
  WriteAll(p, j.dump());
  return p.string();
}

TEST(OciCredentials, HelpersComeBeforeTheStoreWhichComesBeforeAuths) {
  CredentialHelpers helpers;
  TempDir dir;
  const std::string host = "127.0.0.1:5000";
  const nlohmann::json auths = {{host, {{"auth", evidence::Base64Encode("a:b")}}}};
  auto creds = [&](const nlohmann::json& j) {
    return oci::DockerCredentials(host, ConfigWith(dir, j), 5000);
  };
  auto c = creds({{"credHelpers", {{"https://" + host, "good"}}}, {"credsStore", "wrong"},
                  {"auths", auths}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->basic, evidence::Base64Encode("u:p"));
  EXPECT_EQ(helpers.StdinOf("good"), host);  // the registry, on standard input
  c = creds({{"credHelpers", {{"other.example", "wrong"}}}, {"credsStore", "tok"},
             {"auths", auths}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->basic, "");
  EXPECT_EQ(c->identity_token, "refresh123");
  c = creds({{"credsStore", ""}, {"auths", auths}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->basic, evidence::Base64Encode("a:b"));
  c = creds({{"auths", {{host, {{"identitytoken", "idt"}, {"auth", "eDp5"}}}}}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->identity_token, "idt");
  EXPECT_EQ(c->basic, "");
  // A helper that holds nothing for the registry: no credentials, as Docker reads it.
  c = creds({{"credsStore", "none"}, {"auths", auths}});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->empty());
}

TEST(OciCredentials, HelperFailuresAreNamedAndBounded) {
  CredentialHelpers helpers;
  TempDir dir;
  const std::string host = "127.0.0.1:5000";
  const NamedError cases[] = {
      {"absent", absl::StatusCode::kFailedPrecondition, "it is not on PATH"},
      {"fail", absl::StatusCode::kUnauthenticated, "failed (exit status 3)"},
      {"garbage", absl::StatusCode::kInvalidArgument, "not a JSON object with string Username"},
      {"nosecret", absl::StatusCode::kInvalidArgument, "not a JSON object with string Username"},
      {"huge", absl::StatusCode::kResourceExhausted, "printed more than 65536 bytes; killed"},
      {"hang", absl::StatusCode::kDeadlineExceeded, "no answer within 300 ms; killed"},
      {"../../bin/sh", absl::StatusCode::kInvalidArgument, "is not a plain name"},
      {"a b", absl::StatusCode::kInvalidArgument, "is not a plain name"},
      {"", absl::StatusCode::kInvalidArgument, "is not a plain name"},
  };
  for (const NamedError& c : cases) {
    const auto start = std::chrono::steady_clock::now();
    const std::string config = ConfigWith(dir, {{"credHelpers", {{host, c.input}}}});
    // Only the helper that hangs meets the short timeout; the others answer or fail at once,
    // however loaded the machine.
    auto got = oci::DockerCredentials(host, config, c.input == "hang" ? 300 : 30000);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << c.input;
    EXPECT_EQ(got.status().code(), c.code) << c.input << ": " << got.status();
    EXPECT_THAT(got.status().message(), HasSubstr(c.why)) << c.input;
    EXPECT_THAT(got.status().message(), HasSubstr(c.input)) << c.input;
    EXPECT_THAT(got.status().message(), HasSubstr("for registry " + host)) << c.input;
    // What a failing helper printed is never quoted.
    EXPECT_THAT(got.status().message(), ::testing::Not(HasSubstr("hunter2")));
  }
  // A credsStore is named as such.
  auto store = oci::DockerCredentials(host, ConfigWith(dir, {{"credsStore", "fail"}}), 30000);
  EXPECT_THAT(store.status().message(), HasSubstr("(credsStore of " + dir.path().string()));
}

TEST(OciCredentials, HelperCredentialsAndIdentityTokensBuyBearerTokens) {
  CredentialHelpers helpers;
  FakeSetup s;
  s.cfg()["token"] = {{"user", "u"}, {"password", "p"}, {"token", "tok123"},
                      {"refresh", "refresh123"}};
  s.Blob(kWeights);
  std::string digest = s.Manifest(ModelManifest({RawLayer("w.safetensors", kWeights)}, ""));
  auto reg = s.Start();
  for (const std::string helper : {"good", "tok", "wrong"}) {
    oci::ArtifactOptions o;
    o.client.docker_config = ConfigWith(s.dir(), {{"credHelpers", {{reg->host(), helper}}}});
    auto a = oci::Artifact::Open("oci://" + reg->host() + "/m@" + digest, o);
    if (helper == "wrong") {
      EXPECT_EQ(a.status().code(), absl::StatusCode::kUnauthenticated);
      EXPECT_THAT(a.status().message(), HasSubstr("to the Docker config's credentials"));
      continue;
    }
    ASSERT_TRUE(a.ok()) << helper << ": " << a.status();
    auto bytes = ReadFile(**a, "w.safetensors", kWeights.size());
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_EQ(*bytes, kWeights);
  }
  std::string log = s.Log();
  EXPECT_THAT(log, HasSubstr("GET /token?service=fake&scope=repository%3Am%3Apull auth=Basic"));
  // The identity token: POSTed as an OAuth2 refresh_token grant, never as Basic.
  EXPECT_THAT(log, HasSubstr("POST /token form=client_id,grant_type,refresh_token,scope,service"));
  EXPECT_THAT(log, HasSubstr("auth=Bearer tok123"));
}

TEST(OciDockerRegistry, PairOverOciAuditsLikeTheSameFilesOnDisk) {
  CKPT_SKIP_WITHOUT_DOCKER_REGISTRY();
  TempDir dir;
  PairInRegistry pair;
  ASSERT_NO_FATAL_FAILURE(PushPairToDockerRegistry(dir, &pair));
  const std::string &nv = pair.nv, &mx = pair.mx;

  audit::AuditOptions over;
  over.root = "oci://" + pair.host() + "/m@" + nv;
  over.source = "oci://" + pair.host() + "/m:mxfp4";  // a tag, recorded by its digest
  ASSERT_TRUE(oci::OpenOciTrees(&over).ok());
  auto remote = audit::RunAudit(over, NoProgress());
  ASSERT_TRUE(remote.ok()) << remote.status();
  audit::AuditOptions disk;
  disk.root = Fixture("mini-kimi-nvfp4").string();
  disk.source = Fixture("mini-kimi-mxfp4").string();
  auto local = audit::RunAudit(disk, NoProgress());
  ASSERT_TRUE(local.ok()) << local.status();

  EXPECT_EQ(remote->OverallVerdict(), evidence::Verdict::kPass);
  EXPECT_EQ(remote->OverallVerdict(), local->OverallVerdict());
  ASSERT_EQ(remote->checks.size(), local->checks.size());
  for (size_t i = 0; i < local->checks.size(); ++i) {
    EXPECT_EQ(remote->checks[i].name, local->checks[i].name);
    EXPECT_EQ(remote->checks[i].verdict, local->checks[i].verdict) << local->checks[i].name;
  }
  auto subjects = [](std::vector<evidence::Subject> v) {
    std::vector<std::pair<std::string, std::string>> out;
    for (auto& s : v) out.emplace_back(s.name, s.sha256);
    return out;
  };
  auto expected = subjects(local->subjects);
  expected.emplace_back(evidence::kOciManifestSubject, nv.substr(7));
  EXPECT_EQ(subjects(remote->subjects), expected);
  auto expected_source = subjects(local->source->files);
  expected_source.emplace_back(evidence::kOciManifestSubject, mx.substr(7));
  EXPECT_EQ(subjects(remote->source->files), expected_source);
  EXPECT_EQ(remote->source->manifest_root, local->source->manifest_root);
  EXPECT_EQ(remote->root, "oci://" + pair.host() + "/m@" + nv);
  EXPECT_EQ(remote->refs.source_ref, "oci://" + pair.host() + "/m@" + mx);

  // The command line: `ckpt-audit audit oci://... --source oci://...`.
  const std::string env = "DOCKER_CONFIG='" + dir.path().string() + "' XDG_DATA_HOME='" +
                          (dir / "xdg").string() + "'";
  testing::CliResult key = testing::RunCli("keys generate --out " + (dir / "key.pem").string() +
                                               " --trust " + (dir / "trusted").string(),
                                           dir.path(), env);
  ASSERT_EQ(key.rc, 0) << key.err;
  testing::CliResult cli = testing::RunCli(
      "audit --json --db " + (dir / "log.db").string() + " --key " + (dir / "key.pem").string() +
          " oci://" + pair.host() + "/m@" + nv + " --source oci://" + pair.host() +
          "/m:mxfp4",
      dir.path(), env);
  EXPECT_EQ(cli.rc, 0) << cli.err << cli.out;
  EXPECT_THAT(cli.out, HasSubstr("\"verdict\": \"pass\""));
  EXPECT_THAT(cli.out, HasSubstr("\"model_ref\": \"oci://" + pair.host() + "/m@" + nv));
  // The record verifies against the same files on disk: the manifest digest names no file.
  const auto id = nlohmann::json::parse(cli.out)["record_id"].get<uint64_t>();
  testing::CliResult verify = testing::RunCli(
      "verify --db " + (dir / "log.db").string() + " --id " + std::to_string(id) + " --trust " +
          (dir / "trusted").string() + " --root " + Fixture("mini-kimi-nvfp4").string() +
          " --source " + Fixture("mini-kimi-mxfp4").string(),
      dir.path(), env);
  EXPECT_EQ(verify.rc, 0) << verify.err << verify.out;
}

TEST(OciSubjects, ManifestSubjectNamesNoFileUnlessTheTreeHasOne) {
  const std::string hex(64, 'a'), other(64, 'b');
  std::map<std::string, std::string> stated = {{"a.json", hex},
                                               {evidence::kOciManifestSubject, other}};
  EXPECT_TRUE(interop::SubjectDifferences(stated, {{"a.json", hex}}).empty());
  // A file of that name on disk is compared like any other.
  EXPECT_EQ(interop::SubjectDifferences(stated, {{"a.json", hex}, {"oci-manifest", hex}}).size(),
            1u);
}

// --- attach and verify-oci (docs/interop.md, "Attaching verdicts") ---

// Reads every referrer listed at the tag `sha256-HEX` by raw HTTP and checks, with openssl, that
// its bundle's DSSE signature is by `pub_pem` and its statement's one subject is the manifest.
// Returns the predicate types seen.
std::vector<std::string> IndependentlyVerified(const std::string& host, const std::string& digest,
                                               const std::filesystem::path& pub_pem,
                                               const TempDir& dir) {
  std::vector<std::string> seen;
  const std::string base = "http://" + host + "/v2/m/";
  auto index = nlohmann::json::parse(
      Curl(base + "manifests/sha256-" + digest.substr(7), oci::kOciIndex), nullptr, false);
  EXPECT_TRUE(index.is_object() && index["manifests"].is_array()) << index.dump();
  if (!index.is_object()) return seen;
  for (const auto& d : index["manifests"]) {
    EXPECT_EQ(d.value("artifactType", ""), "application/vnd.dev.sigstore.bundle.v0.3+json");
    auto m = nlohmann::json::parse(
        Curl(base + "manifests/" + d["digest"].get<std::string>(), oci::kOciManifest));
    EXPECT_EQ(m["subject"]["digest"], digest);
    EXPECT_EQ(m["config"]["mediaType"], "application/vnd.oci.empty.v1+json");
    auto bundle = nlohmann::json::parse(
        Curl(base + "blobs/" + m["layers"][0]["digest"].get<std::string>()));
    EXPECT_EQ(bundle["mediaType"], "application/vnd.dev.sigstore.bundle.v0.3+json");
    const auto& env = bundle["dsseEnvelope"];
    std::string payload = Text(*evidence::Base64Decode(env["payload"].get<std::string>()));
    std::string type = env["payloadType"];
    auto statement = nlohmann::json::parse(payload);
    EXPECT_EQ(statement["subject"].size(), 1u);
    EXPECT_EQ(statement["subject"][0]["digest"]["sha256"], digest.substr(7));
    seen.push_back(statement["predicateType"]);
    const std::string pae = "DSSEv1 " + std::to_string(type.size()) + " " + type + " " +
                            std::to_string(payload.size()) + " " + payload;
    WriteAll(dir / "pae", pae);
    WriteAll(dir / "sig",
             Text(*evidence::Base64Decode(env["signatures"][0]["sig"].get<std::string>())));
    const std::string verify = "openssl pkeyutl -verify -pubin -inkey '" + pub_pem.string() +
                               "' -rawin -in '" + (dir / "pae").string() + "' -sigfile '" +
                               (dir / "sig").string() + "' >/dev/null 2>&1";
    EXPECT_EQ(std::system(verify.c_str()), 0) << "openssl rejects the signature of " << d;
  }
  return seen;
}

int CountOf(const std::vector<std::string>& v, const std::string& what) {
  return static_cast<int>(std::count(v.begin(), v.end(), what));
}

constexpr char kVsa[] = "https://slsa.dev/verification_summary/v1";
constexpr char kTestResult[] = "https://in-toto.io/attestation/test-result/v0.1";

TEST(OciDockerRegistry, AttachKeepsConcurrentReferrersAndVerifiesThem) {
  CKPT_SKIP_WITHOUT_DOCKER_REGISTRY();
  TempDir dir;
  PairInRegistry pair;
  ASSERT_NO_FATAL_FAILURE(PushPairToDockerRegistry(dir, &pair));
  const std::string &nv = pair.nv, &mx = pair.mx;
  const std::string env = "DOCKER_CONFIG='" + dir.path().string() + "' XDG_DATA_HOME='" +
                          (dir / "xdg").string() + "'";
  const std::string db = " --db " + (dir / "log.db").string() + " --key " +
                         (dir / "key.pem").string();
  const std::string model = "oci://" + pair.host() + "/m@" + nv;
  ASSERT_EQ(testing::RunCli("keys generate --out " + (dir / "key.pem").string() + " --trust " +
                                (dir / "trusted").string(), dir.path(), env).rc, 0);
  ASSERT_EQ(std::system(("openssl pkey -in '" + (dir / "key.pem").string() + "' -pubout -out '" +
                         (dir / "pub.pem").string() + "'").c_str()), 0);
  // Eight records of the pair audited over oci:// (eight, so that eight attaches differ).
  constexpr int kAttaches = 8;
  std::vector<uint64_t> ids;
  for (int i = 0; i < kAttaches; ++i) {
    testing::CliResult audited = testing::RunCli(
        "audit --json" + db + " " + model + " --source oci://" + pair.host() + "/m:mxfp4",
        dir.path(), env);
    ASSERT_EQ(audited.rc, 0) << audited.err << audited.out;
    ids.push_back(nlohmann::json::parse(audited.out)["record_id"].get<uint64_t>());
  }

  // A record is attached only to the manifest it was audited from.
  testing::CliResult wrong = testing::RunCli(
      "attach oci://" + pair.host() + "/m@" + mx + " --id " + std::to_string(ids[0]) + db,
      dir.path(), env);
  EXPECT_EQ(wrong.rc, 2);
  EXPECT_THAT(wrong.err, HasSubstr("not-audited-from-manifest"));
  EXPECT_THAT(wrong.err, HasSubstr("audited from manifest " + nv));

  // Eight attaches at once, each from its own process, all pushing the same empty config blob
  // and writing the same tag index: every one succeeds and all sixteen referrers remain listed.
  std::vector<testing::CliResult> attached(kAttaches);
  std::vector<std::thread> threads;
  for (int i = 0; i < kAttaches; ++i) {
    std::filesystem::create_directories(dir / std::to_string(i));
    threads.emplace_back([&, i] {
      attached[i] = testing::RunCli(
          "attach --json " + model + " --id " + std::to_string(ids[i]) + db,
          dir / std::to_string(i), env);
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& r : attached) {
    ASSERT_EQ(r.rc, 0) << r.err << r.out;
    EXPECT_THAT(r.out, HasSubstr("\"referrers_api\": false"));
  }
  std::vector<std::string> types = IndependentlyVerified(pair.host(), nv, dir / "pub.pem", dir);
  EXPECT_EQ(types.size(), 2u * kAttaches);
  EXPECT_EQ(CountOf(types, kVsa), kAttaches);
  EXPECT_EQ(CountOf(types, kTestResult), kAttaches);

  const std::string trust = " --trust " + (dir / "trusted").string();
  testing::CliResult ok = testing::RunCli("verify-oci --json " + model + trust, dir.path(), env);
  EXPECT_EQ(ok.rc, 0) << ok.err << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("\"listed_by\": \"referrers-tag\""));
  EXPECT_THAT(ok.out, HasSubstr("\"verdict\": \"pass\""));
  // A trust file of another key only: every referrer fails its signature check.
  ASSERT_EQ(testing::RunCli("keys generate --out " + (dir / "other.pem").string() + " --trust " +
                                (dir / "other-trust").string(), dir.path(), env).rc, 0);
  testing::CliResult untrusted = testing::RunCli(
      "verify-oci " + model + " --trust " + (dir / "other-trust").string(), dir.path(), env);
  EXPECT_EQ(untrusted.rc, 1) << untrusted.err << untrusted.out;
  EXPECT_THAT(untrusted.out, HasSubstr("signature-invalid"));

  const std::string tag = oci::ReferrersTag(nv);
  auto saved = pair.reg->GetManifest(tag);
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto listed = oci::ListReferrers(*pair.reg, nv);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_FALSE(listed->bundles.empty());
  auto first = pair.reg->GetManifest(listed->bundles[0].digest);
  ASSERT_TRUE(first.ok());
  auto first_manifest = oci::ParseManifest(first->bytes, first->media_type, "referrer");
  ASSERT_TRUE(first_manifest.ok());
  std::string bundle;
  ASSERT_TRUE(pair.reg->ReadBlob(first_manifest->layers[0].digest, first_manifest->layers[0].size,
                                 [&](std::span<const uint8_t> b) {
                                   bundle.append(reinterpret_cast<const char*>(b.data()),
                                                 b.size());
                                   return absl::OkStatus();
                                 }).ok());
  const oci::Descriptor nv_subject{oci::kOciManifest, nv, 0};
  auto restore = [&] {
    ASSERT_TRUE(pair.reg->PushManifest(tag, oci::kOciIndex, saved->bytes).ok());
  };

  // A tampered bundle: the statement changed, the signature kept.
  auto j = nlohmann::json::parse(bundle);
  std::string payload =
      Text(*evidence::Base64Decode(j["dsseEnvelope"]["payload"].get<std::string>()));
  payload.replace(payload.find("PASSED"), 6, "PASSEE");
  j["dsseEnvelope"]["payload"] = evidence::Base64Encode(payload);
  ASSERT_TRUE(oci::AttachBundle(*pair.reg, nv_subject, j.dump(), kVsa).ok());
  testing::CliResult tampered = testing::RunCli("verify-oci " + model + trust, dir.path(), env);
  EXPECT_EQ(tampered.rc, 1) << tampered.err << tampered.out;
  EXPECT_THAT(tampered.out, HasSubstr("signature-invalid"));
  EXPECT_THAT(tampered.out, HasSubstr("fail: referrer-failed"));
  restore();

  EXPECT_EQ(testing::RunCli("verify-oci " + model + trust, dir.path(), env).rc, 0);

  // nv's signed summary attached to mx: its statement names another manifest.
  auto mx_manifest = pair.reg->GetManifest(mx);
  ASSERT_TRUE(mx_manifest.ok());
  ASSERT_TRUE(oci::AttachBundle(*pair.reg, {oci::kOciManifest, mx, mx_manifest->bytes.size()},
                                bundle, kVsa).ok());
  testing::CliResult moved = testing::RunCli(
      "verify-oci oci://" + pair.host() + "/m@" + mx + trust, dir.path(), env);
  EXPECT_EQ(moved.rc, 1) << moved.err << moved.out;
  EXPECT_THAT(moved.out, HasSubstr("subject-mismatch"));

  // No referrers at all: no passing summary.
  const std::string other = Push(*pair.reg, "mini-kimi-nvfp4", "again", true);
  testing::CliResult none = testing::RunCli(
      "verify-oci oci://" + pair.host() + "/m@" + other + trust, dir.path(), env);
  EXPECT_EQ(none.rc, 1) << none.err << none.out;
  EXPECT_THAT(none.out, HasSubstr("no-passing-vsa"));
}

// The fixture's NVFP4 tree pushed to `fake` and audited over oci:// with a fresh key: what the
// attach tests against the fake registry start from.
struct AuditedOnFake {
  std::shared_ptr<oci::Registry> reg;
  std::filesystem::path dir;
  std::string nv, env, db, model;
  uint64_t id = 0;

  // `ckpt-audit attach --json MODEL --id ID` with the audit's log and key.
  testing::CliResult Attach(uint64_t record) const {
    return testing::RunCli("attach --json " + model + " --id " + std::to_string(record) + db,
                           dir, env);
  }
};

void AuditOnFake(const TempDir& dir, const FakeRegistry& fake, AuditedOnFake* out) {
  ASSERT_TRUE(fake.ready());
  setenv("DOCKER_CONFIG", dir.path().c_str(), 1);
  auto reg = oci::Registry::Connect(*oci::ParseReference("oci://" + fake.host() + "/m:x"));
  ASSERT_TRUE(reg.ok()) << reg.status();
  out->reg = *std::move(reg);
  out->dir = dir.path();
  out->nv = Push(*out->reg, "mini-kimi-nvfp4", "nvfp4", false);
  ASSERT_FALSE(out->nv.empty());
  out->env = "DOCKER_CONFIG='" + dir.path().string() + "' XDG_DATA_HOME='" +
             (dir / "xdg").string() + "'";
  out->db = " --db " + (dir / "log.db").string() + " --key " + (dir / "key.pem").string();
  out->model = "oci://" + fake.host() + "/m@" + out->nv;
  ASSERT_EQ(testing::RunCli("keys generate --out " + (dir / "key.pem").string() + " --trust " +
                                (dir / "trusted").string(), dir.path(), out->env).rc, 0);
  testing::CliResult audited =
      testing::RunCli("audit --json" + out->db + " " + out->model, dir.path(), out->env);
  ASSERT_EQ(audited.rc, 0) << audited.err << audited.out;
  out->id = nlohmann::json::parse(audited.out)["record_id"].get<uint64_t>();
}

TEST(OciFakeRegistry, AttachUsesTheReferrersApiWhenTheRegistryHasOne) {
  TempDir dir;
  FakeRegistry fake(dir, R"({"repo": "m", "writable": true, "referrers_api": true,
                             "log": ")" + (dir / "requests.log").string() + R"("})");
  AuditedOnFake a;
  ASSERT_NO_FATAL_FAILURE(AuditOnFake(dir, fake, &a));
  const std::shared_ptr<oci::Registry>& reg = a.reg;
  const std::string &nv = a.nv, &env = a.env, &model = a.model;
  testing::CliResult attached = a.Attach(a.id);
  ASSERT_EQ(attached.rc, 0) << attached.err << attached.out;
  EXPECT_THAT(attached.out, HasSubstr("\"referrers_api\": true"));
  // With the API, no tag index is written.
  EXPECT_TRUE(absl::IsNotFound(reg->GetManifest(oci::ReferrersTag(nv)).status()));
  auto listed = oci::ListReferrers(*reg, nv);
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_TRUE(listed->referrers_api);
  ASSERT_EQ(listed->bundles.size(), 2u);

  const std::string trust = " --trust " + (dir / "trusted").string();
  testing::CliResult ok = testing::RunCli("verify-oci --json " + model + trust, dir.path(), env);
  EXPECT_EQ(ok.rc, 0) << ok.err << ok.out;
  EXPECT_THAT(ok.out, HasSubstr("\"listed_by\": \"referrers-api\""));

  // Deleted referrers are no longer listed by the API: nothing passing is left.
  for (const oci::Descriptor& d : listed->bundles) {
    ASSERT_EQ(std::system(("curl -sf -X DELETE 'http://" + fake.host() + "/v2/m/manifests/" +
                           d.digest + "'").c_str()), 0);
  }
  testing::CliResult after = testing::RunCli("verify-oci " + model + trust, dir.path(), env);
  EXPECT_EQ(after.rc, 1) << after.err << after.out;
  EXPECT_THAT(after.out, HasSubstr("no-passing-vsa"));
}

// A record binds a manifest by its typed `oci_manifest` alone, which only an audit that read the
// manifest from a registry sets (docs/interop.md, "How digests bind"). A tree cannot pose as one:
// a file named like the binding's subject is refused before anything is signed, and a record
// that names the manifest only by that subject (signed by hand, or made before the typed field)
// is attached to nothing.
TEST(OciFakeRegistry, AFileNamedLikeTheBindingBindsNothing) {
  TempDir dir;
  FakeRegistry fake(dir, R"({"repo": "m", "writable": true})");
  AuditedOnFake a;
  ASSERT_NO_FATAL_FAILURE(AuditOnFake(dir, fake, &a));
  auto manifest = a.reg->GetManifest(a.nv);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  const std::string log_path = (dir / "log.db").string();
  auto size = [&] { return *(*storage::EvidenceLog::OpenReadOnly(log_path))->Size(); };
  const uint64_t before = size();

  const std::filesystem::path tree = dir / "posing";
  std::filesystem::copy(Fixture("mini-kimi-nvfp4"), tree,
                        std::filesystem::copy_options::recursive);
  for (const char* name : {evidence::kOciManifestSubject, evidence::kManifestRootSubject}) {
    WriteAll(tree / name, manifest->bytes);
    testing::CliResult posing =
        testing::RunCli("audit --json" + a.db + " " + tree.string(), dir.path(), a.env);
    EXPECT_EQ(posing.rc, 2) << posing.err << posing.out;
    EXPECT_THAT(posing.err, HasSubstr(std::string("/") + name + ": a file may not be named"));
    std::filesystem::remove(tree / name);
  }
  EXPECT_EQ(size(), before);

  auto key = evidence::SigningKey::Load((dir / "key.pem").string());
  ASSERT_TRUE(key.ok()) << key.status();
  for (const std::string& root : {tree.string(), a.model}) {
    evidence::EvidenceRecord r;
    r.root = root;
    r.subjects = {{"config.json", std::string(64, 'c')},
                  {evidence::kOciManifestSubject, a.nv.substr(7)},
                  {evidence::kManifestRootSubject, std::string(64, 'f')}};
    r.policy = audit::PolicyRefOf(*audit::PolicyByName("scale-window"));
    r.started_at = r.finished_at = "2026-12-07T00:00:00Z";
    auto payload = evidence::RecordPayload(r);
    ASSERT_TRUE(payload.ok()) << payload.status();
    uint64_t id = 0;
    {
      auto log = storage::EvidenceLog::Open(log_path, false);
      ASSERT_TRUE(log.ok()) << log.status();
      auto appended = (*log)->Append(
          *evidence::SignEnvelope(*payload, evidence::kInTotoPayloadType, *key), *key);
      ASSERT_TRUE(appended.ok()) << appended.status();
      id = appended->seq;
    }
    testing::CliResult attached = a.Attach(id);
    EXPECT_EQ(attached.rc, 2) << attached.err << attached.out;
    EXPECT_THAT(attached.err, HasSubstr("not-audited-from-manifest: record " + std::to_string(id) +
                                        " (root " + root + ") was not audited from an OCI "
                                        "manifest"));
  }
  // The audit that read the manifest binds it.
  testing::CliResult ok = a.Attach(a.id);
  EXPECT_EQ(ok.rc, 0) << ok.err << ok.out;
}

// What verify-oci makes of a registry's list (docs/interop.md, "Attaching verdicts"): a referrer
// listed twice is checked and reported once, and a referrer listed for the model whose manifest
// names another manifest as its subject fails verification as subject-mismatch.
TEST(OciFakeRegistry, AReferrerListedTwiceOrAboutAnotherManifest) {
  TempDir dir;
  FakeRegistry fake(dir, R"({"repo": "m", "writable": true})");
  AuditedOnFake a;
  ASSERT_NO_FATAL_FAILURE(AuditOnFake(dir, fake, &a));
  testing::CliResult attached = a.Attach(a.id);
  ASSERT_EQ(attached.rc, 0) << attached.err << attached.out;
  const std::string tag = oci::ReferrersTag(a.nv);
  const std::string trust = " --trust " + (dir / "trusted").string();
  auto saved = a.reg->GetManifest(tag);
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto index = oci::ParseIndex(saved->bytes, "index");
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), 2u);

  std::vector<oci::Descriptor> twice = *index;
  twice.push_back((*index)[0]);
  ASSERT_TRUE(a.reg->PushManifest(tag, oci::kOciIndex, oci::IndexBytes(twice)).ok());
  testing::CliResult listed_twice =
      testing::RunCli("verify-oci --json " + a.model + trust, dir.path(), a.env);
  EXPECT_EQ(listed_twice.rc, 0) << listed_twice.err << listed_twice.out;
  EXPECT_EQ(nlohmann::json::parse(listed_twice.out)["referrers"].size(), 2u) << listed_twice.out;

  // The first referrer's manifest, its subject moved to another manifest, listed for the model.
  const std::string mx = Push(*a.reg, "mini-kimi-mxfp4", "mxfp4", false);
  auto mx_manifest = a.reg->GetManifest(mx);
  ASSERT_TRUE(mx_manifest.ok()) << mx_manifest.status();
  auto first = a.reg->GetManifest((*index)[0].digest);
  ASSERT_TRUE(first.ok()) << first.status();
  auto moved = oci::ParseManifest(first->bytes, first->media_type, "referrer");
  ASSERT_TRUE(moved.ok()) << moved.status();
  moved->subject = oci::Descriptor{oci::kOciManifest, mx, mx_manifest->bytes.size()};
  const std::string moved_bytes = oci::ManifestBytes(*moved);
  auto pushed = a.reg->PushManifest(oci::DigestOf(moved_bytes), oci::kOciManifest, moved_bytes);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  std::vector<oci::Descriptor> listed = *index;
  listed.push_back((*index)[0]);
  listed.back().digest = *pushed;
  listed.back().size = moved_bytes.size();
  ASSERT_TRUE(a.reg->PushManifest(tag, oci::kOciIndex, oci::IndexBytes(listed)).ok());
  testing::CliResult about_other =
      testing::RunCli("verify-oci " + a.model + trust, dir.path(), a.env);
  EXPECT_EQ(about_other.rc, 1) << about_other.err << about_other.out;
  EXPECT_THAT(about_other.out, HasSubstr(*pushed + " subject-mismatch the referrer manifest's "
                                         "subject is " + mx + ", not " + a.nv));
}

// Two attaches at once against Debian's registry: a read of the referrers tag that meets the
// other attach's write of it may be answered 500. Such reads are tried again (the fake answers
// the first 3 with 500); a registry that keeps answering 500 ends the attach with its answer.
TEST(OciFakeRegistry, ATagIndexReadAnswered500IsTriedAgain) {
  for (const int failures : {3, 1000}) {
    TempDir dir;
    FakeRegistry fake(dir, absl::StrCat(R"({"repo": "m", "writable": true, "fail_tag_reads": )",
                                        failures, "}"));
    AuditedOnFake a;
    ASSERT_NO_FATAL_FAILURE(AuditOnFake(dir, fake, &a));
    testing::CliResult attached = a.Attach(a.id);
    if (failures == 3) {
      ASSERT_EQ(attached.rc, 0) << attached.err << attached.out;
      EXPECT_THAT(attached.out, HasSubstr("\"index_writes\": 1"));
      EXPECT_EQ(testing::RunCli("verify-oci " + a.model + " --trust " +
                                    (dir / "trusted").string(), dir.path(), a.env).rc, 0);
    } else {
      EXPECT_EQ(attached.rc, 2) << attached.err << attached.out;
      EXPECT_THAT(attached.err, HasSubstr("UNAVAILABLE"));
      EXPECT_THAT(attached.err, HasSubstr("answered 500"));
    }
  }
}

// Debian's registry answers a manifest PUT 400 DIGEST_INVALID + MANIFEST_BLOB_UNKNOWN while
// another attach's upload of the same blob (the empty config) rewrites its link. Such a PUT is
// tried again after the blobs are checked again and the missing one pushed (the fake forgets the
// config blob with each such answer); a registry that answers so every time ends the attach
// ABORTED with its answer.
TEST(OciFakeRegistry, AManifestPutThatMeetsABlobInFluxIsTriedAgain) {
  const std::string empty_blob = oci::DigestOf("{}");
  for (const int failures : {2, 1000}) {
    TempDir dir;
    const std::string log = (dir / "requests.log").string();
    FakeRegistry fake(dir, absl::StrCat(R"({"repo": "m", "writable": true, "blob_in_flux": )",
                                        failures, R"(, "log": ")", log, R"("})"));
    AuditedOnFake a;
    ASSERT_NO_FATAL_FAILURE(AuditOnFake(dir, fake, &a));
    testing::CliResult attached = a.Attach(a.id);
    if (failures == 2) {
      ASSERT_EQ(attached.rc, 0) << attached.err << attached.out;
      EXPECT_EQ(testing::RunCli("verify-oci " + a.model + " --trust " +
                                    (dir / "trusted").string(), dir.path(), a.env).rc, 0);
      // The empty blob is uploaded once, then once after each answer that lost it; the second
      // statement finds it (HEAD) and uploads it no more.
      const std::string requests = Text(ReadAll(log));
      size_t uploads = 0;
      for (size_t at = 0; (at = requests.find("digest=" + empty_blob, at)) != std::string::npos;
           ++at) {
        ++uploads;
      }
      EXPECT_EQ(uploads, 3u) << requests;
      EXPECT_THAT(requests, HasSubstr("HEAD /v2/m/blobs/" + empty_blob));
    } else {
      EXPECT_EQ(attached.rc, 2) << attached.err << attached.out;
      EXPECT_THAT(attached.err, HasSubstr("ABORTED"));
      EXPECT_THAT(attached.err, HasSubstr("MANIFEST_BLOB_UNKNOWN"));
      // Tried a bounded number of times: 12 PUTs of the referrer manifest, then no more.
      const std::string requests = Text(ReadAll(log));
      size_t puts = 0;
      for (size_t at = 0; (at = requests.find("PUT /v2/m/manifests/sha256:", at)) !=
                          std::string::npos;
           ++at) {
        ++puts;
      }
      EXPECT_EQ(puts, 12u) << requests;
    }
  }
}

// The tag index path against the fake: an index write that a concurrent writer overwrote is
// noticed and written again (lose_index_writes). And since the fake takes the tag index as given
// (Debian's registry refuses an index naming a manifest it lacks), a listed referrer that is not
// there is `missing-referrer`.
TEST(OciFakeRegistry, ListedReferrerThatIsGoneFailsVerification) {
  TempDir dir;
  FakeRegistry fake(dir, R"({"repo": "m", "writable": true, "lose_index_writes": 1})");
  AuditedOnFake a;
  ASSERT_NO_FATAL_FAILURE(AuditOnFake(dir, fake, &a));
  const std::shared_ptr<oci::Registry>& reg = a.reg;
  const std::string &nv = a.nv, &env = a.env, &model = a.model;
  testing::CliResult attached = a.Attach(a.id);
  ASSERT_EQ(attached.rc, 0) << attached.err << attached.out;
  EXPECT_THAT(attached.out, HasSubstr("\"referrers_api\": false"));
  EXPECT_THAT(attached.out, HasSubstr("\"index_writes\": 2"));  // the lost write, then again
  const std::string trust = " --trust " + (dir / "trusted").string();
  EXPECT_EQ(testing::RunCli("verify-oci " + model + trust, dir.path(), env).rc, 0);

  const std::string tag = oci::ReferrersTag(nv);
  auto saved = reg->GetManifest(tag);
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto index = oci::ParseIndex(saved->bytes, "index");
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->size(), 2u);
  oci::Descriptor gone;
  gone.media_type = oci::kOciManifest;
  gone.digest = "sha256:" + std::string(64, '0');
  gone.size = 10;
  gone.artifact_type = "application/vnd.dev.sigstore.bundle.v0.3+json";
  index->push_back(gone);
  ASSERT_TRUE(reg->PushManifest(tag, oci::kOciIndex, oci::IndexBytes(*index)).ok());
  testing::CliResult missing = testing::RunCli("verify-oci --json " + model + trust, dir.path(),
                                               env);
  EXPECT_EQ(missing.rc, 1) << missing.err << missing.out;
  EXPECT_THAT(missing.out, HasSubstr("\"result\": \"missing-referrer\""));
  EXPECT_THAT(missing.out, HasSubstr("\"reason\": \"referrer-failed\""));
}

}  // namespace
}  // namespace ckpt
