// What tests/oci needs around the registry client: child processes (Debian's docker-registry,
// the fake registry of fake_registry.py, with its configuration built blob by blob), a ModelPack
// pusher built on the client's own upload code, a small ustar writer for hostile layers, and
// curl as an independent HTTP reader (docs/interop.md, "OCI registries").
#ifndef CKPT_TESTS_OCI_OCI_HARNESS_H_
#define CKPT_TESTS_OCI_OCI_HARNESS_H_

#include <arpa/inet.h>
#include <zlib.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/evidence/base64.h"
#include "core/oci/manifest.h"
#include "core/oci/registry.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/test_paths.h"
#include "tests/test_util.h"

namespace ckpt::testing {

// A child process (argv), killed and reaped on destruction; its stdout is a pipe (read it with
// Line) or, when `log` is given, that file (a pipe nobody reads would stall a chatty child).
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv, const std::string& log = "") {
    int fds[2];
    if (::pipe(fds) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      int out = log.empty() ? fds[1] : ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      ::dup2(out, 1);
      if (!log.empty()) ::dup2(out, 2);
      ::close(fds[0]);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = ::fdopen(fds[0], "r");
  }
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ != nullptr) std::fclose(out_);
  }
  // The next line of its stdout ("" at its end).
  std::string Line() {
    char buf[256];
    if (out_ == nullptr || std::fgets(buf, sizeof buf, out_) == nullptr) return "";
    return buf;
  }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

inline bool Installed(const std::string& program) {
  return std::system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0;
}

// Debian's docker-registry (distribution 2.8) on the loopback port the kernel chose (its log
// names it), with its storage and config under `dir`; ready once it says it is listening, at
// most 30 s after it starts (a loaded 2-core CI machine).
class DockerRegistry {
 public:
  explicit DockerRegistry(const TempDir& dir) {
    std::filesystem::path config = dir / "registry.yml", log = dir / "registry.log";
    WriteAll(config, absl::StrCat("version: 0.1\nlog:\n  level: info\n  accesslog:\n",
                                  "    disabled: true\nstorage:\n  filesystem:\n",
                                  "    rootdirectory: ", (dir / "storage").string(),
                                  "\nhttp:\n  addr: 127.0.0.1:0\n"));
    child_ = std::make_unique<Child>(
        std::vector<std::string>{"docker-registry", "serve", config.string()}, log.string());
    const std::string said = "msg=\"listening on 127.0.0.1:";
    for (int i = 0; i < 300 && port_ == 0; ++i) {
      const std::vector<uint8_t> bytes = ReadAll(log);
      const std::string text(bytes.begin(), bytes.end());
      if (size_t at = text.find(said); at != std::string::npos) {
        port_ = std::atoi(text.c_str() + at + said.size());
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
    ready_ = port_ > 0;
  }
  bool ready() const { return ready_; }
  std::string host() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int port_ = 0;
  bool ready_ = false;
  std::unique_ptr<Child> child_;
};

// tests/oci/fake_registry.py with `config` (JSON text); host() is 127.0.0.1:PORT.
class FakeRegistry {
 public:
  FakeRegistry(const TempDir& dir, const std::string& config) {
    std::filesystem::path path = dir / "fake.json";
    WriteAll(path, config);
    child_ = std::make_unique<Child>(std::vector<std::string>{
        "python3", std::string(::ckpt::testing::kSourceDir) + "/tests/oci/fake_registry.py", path.string()});
    std::string line = child_->Line();
    if (line.rfind("PORT ", 0) == 0) port_ = std::stoi(line.substr(5));
  }
  bool ready() const { return port_ != 0; }
  std::string host() const { return absl::StrCat("127.0.0.1:", port_); }

 private:
  int port_ = 0;
  std::unique_ptr<Child> child_;
};

inline std::string Text(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }

// A ModelPack layer of the file `name` with `bytes`.
inline oci::Descriptor RawLayer(const std::string& name, const std::string& bytes) {
  oci::Descriptor d;
  d.media_type = name.ends_with(".safetensors") ? "application/vnd.cncf.model.weight.v1.raw"
                                                : "application/vnd.cncf.model.weight.config.v1.raw";
  d.digest = oci::DigestOf(bytes);
  d.size = bytes.size();
  d.annotations["org.cncf.model.filepath"] = name;
  return d;
}

// A ModelPack manifest over `layers` (a small model config blob of its own).
inline oci::Manifest ModelManifest(std::vector<oci::Descriptor> layers,
                                   const std::string& config_bytes) {
  oci::Manifest m;
  m.media_type = oci::kOciManifest;
  m.artifact_type = "application/vnd.cncf.model.manifest.v1+json";
  m.config.media_type = "application/vnd.cncf.model.config.v1+json";
  m.config.digest = oci::DigestOf(config_bytes);
  m.config.size = config_bytes.size();
  m.layers = std::move(layers);
  return m;
}

// One ustar entry (header and padded data): type '0' file, '1' hard link, '2' symlink, '5' dir.
inline std::string TarEntry(const std::string& name, char type, const std::string& data,
                            const std::string& link = "") {
  std::string h(512, '\0');
  std::copy(name.begin(), name.end(), h.begin());
  std::snprintf(&h[100], 8, "%07o", 0644);
  std::snprintf(&h[108], 8, "%07o", 0);
  std::snprintf(&h[116], 8, "%07o", 0);
  std::snprintf(&h[124], 12, "%011o", static_cast<unsigned>(data.size()));
  std::snprintf(&h[136], 12, "%011o", 0);
  h[156] = type;
  std::copy(link.begin(), link.end(), h.begin() + 157);
  std::copy_n("ustar\00000", 8, h.begin() + 257);
  std::fill(h.begin() + 148, h.begin() + 156, ' ');
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  std::string padded = data;
  padded.resize((data.size() + 511) / 512 * 512, '\0');
  return h + padded;
}
inline std::string TarEnd() { return std::string(1024, '\0'); }

// A gzip stream of `in`.
inline std::string Gzip(const std::string& in) {
  z_stream z{};
  deflateInit2(&z, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&z, in.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  z.avail_in = in.size();
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = out.size();
  deflate(&z, Z_FINISH);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

// `curl -s` of `url` (an independent HTTP reader: not the client under test).
inline std::string Curl(const std::string& url, const std::string& accept = "") {
  std::string cmd = "curl -sf " + (accept.empty() ? "" : "-H 'Accept: " + accept + "' ") + "'" +
                    url + "'";
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  char buf[4096];
  size_t n;
  while (p != nullptr && (n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  if (p != nullptr) ::pclose(p);
  return out;
}

// The fake registry's configuration, built as the test adds blobs and manifests.
class FakeSetup {
 public:
  FakeSetup() {
    cfg_ = {{"repo", "m"}, {"manifests", nlohmann::json::object()},
            {"blobs", nlohmann::json::object()}, {"log", (dir_ / "requests.log").string()}};
  }
  const TempDir& dir() const { return dir_; }
  nlohmann::json& cfg() { return cfg_; }
  std::string Blob(const std::string& bytes, const std::string& digest = "") {
    std::string d = digest.empty() ? oci::DigestOf(bytes) : digest;
    std::filesystem::path p = dir_ / ("blob-" + std::to_string(n_++));
    WriteAll(p, bytes);
    cfg_["blobs"][d] = p.string();
    return d;
  }
  // Pushes `m` (and a config blob); served under its digest (or `as`) and `tag`.
  std::string Manifest(oci::Manifest m, const std::string& tag = "", const std::string& as = "") {
    Blob("{}");
    m.config.digest = oci::DigestOf("{}");
    m.config.size = 2;
    std::string bytes = oci::ManifestBytes(m);
    std::filesystem::path p = dir_ / ("manifest-" + std::to_string(n_++));
    WriteAll(p, bytes);
    nlohmann::json e = {{"path", p.string()}, {"media_type", m.media_type}};
    std::string d = as.empty() ? oci::DigestOf(bytes) : as;
    cfg_["manifests"][d] = e;
    if (!tag.empty()) cfg_["manifests"][tag] = e;
    return d;
  }
  std::unique_ptr<FakeRegistry> Start() {
    auto r = std::make_unique<FakeRegistry>(dir_, cfg_.dump());
    EXPECT_TRUE(r->ready());
    return r;
  }
  std::string Log() { return Text(ReadAll(dir_ / "requests.log")); }
  // A Docker config with user:password for `host`.
  std::string DockerConfig(const std::string& host, const std::string& user_pass) {
    std::filesystem::path p = dir_ / "docker-config.json";
    WriteAll(p, nlohmann::json{{"auths", {{host, {{"auth", evidence::Base64Encode(user_pass)}}}}}}
                    .dump());
    return p.string();
  }

 private:
  TempDir dir_;
  nlohmann::json cfg_;
  int n_ = 0;
};

// The fixture's files as raw ModelPack layers; `tamper` (a file name) is served with one byte
// of its tensor data changed, under its true digest.
inline std::string ServeFixture(FakeSetup& s, const std::string& fixture,
                                const std::string& tamper) {
  std::vector<oci::Descriptor> layers;
  for (const auto& e : std::filesystem::directory_iterator(Fixture(fixture))) {
    std::string bytes = Text(ReadAll(e.path()));
    std::string name = e.path().filename().string();
    layers.push_back(RawLayer(name, bytes));
    if (name == tamper) bytes[bytes.size() - 100] ^= 0x40;
    s.Blob(bytes, layers.back().digest);
  }
  return s.Manifest(ModelManifest(layers, ""));
}

// Pushes `fixture` to `reg` as a ModelPack artifact under `tag`: safetensors as raw layers, the
// other files as raw layers too or (tar_configs) as one tar+gzip config layer.
inline std::string Push(const oci::Registry& reg, const std::string& fixture,
                        const std::string& tag, bool tar_configs) {
  std::vector<oci::Descriptor> layers;
  std::string tar;
  for (const auto& e : std::filesystem::directory_iterator(Fixture(fixture))) {
    std::string bytes = Text(ReadAll(e.path()));
    std::string name = e.path().filename().string();
    if (tar_configs && !name.ends_with(".safetensors")) {
      tar += TarEntry(name, '0', bytes);
      continue;
    }
    EXPECT_TRUE(reg.PushBlob(bytes).ok());
    layers.push_back(RawLayer(name, bytes));
  }
  if (tar_configs) {
    std::string gz = Gzip(tar + TarEnd());
    EXPECT_TRUE(reg.PushBlob(gz).ok());
    layers.push_back({"application/vnd.cncf.model.weight.config.v1.tar+gzip", oci::DigestOf(gz),
                      gz.size()});
  }
  const std::string config = R"({"descriptor":{"name":")" + fixture + R"("}})";
  EXPECT_TRUE(reg.PushBlob(config).ok());
  auto pushed = reg.PushManifest(tag, oci::kOciManifest,
                                 oci::ManifestBytes(ModelManifest(layers, config)));
  EXPECT_TRUE(pushed.ok()) << pushed.status();
  return pushed.ok() ? *pushed : "";
}

// Skips the test, saying so on stdout too, when Debian's docker-registry is not installed.
#define CKPT_SKIP_WITHOUT_DOCKER_REGISTRY()                                                  \
  if (!::ckpt::testing::Installed("docker-registry")) {                                      \
    std::printf("skipped: docker-registry is not installed (deploy/install-deps.sh)\n");     \
    GTEST_SKIP() << "docker-registry is not installed (deploy/install-deps.sh installs it)"; \
  }

// Debian's docker-registry under `dir` (which becomes $DOCKER_CONFIG, holding no config.json)
// with the fixture pair pushed to its repository m as ModelPack artifacts: mini-kimi-nvfp4 as
// raw layers (tag nvfp4), mini-kimi-mxfp4 with its JSON files in one tar+gzip layer (tag mxfp4).
struct PairInRegistry {
  std::unique_ptr<DockerRegistry> registry;
  std::shared_ptr<oci::Registry> reg;
  std::string nv, mx;  // the two manifest digests
  std::string host() const { return registry->host(); }
};
inline void PushPairToDockerRegistry(const TempDir& dir, PairInRegistry* out) {
  out->registry = std::make_unique<DockerRegistry>(dir);
  ASSERT_TRUE(out->registry->ready()) << "docker-registry did not start";
  setenv("DOCKER_CONFIG", dir.path().c_str(), 1);
  auto reg = oci::Registry::Connect(*oci::ParseReference("oci://" + out->host() + "/m:x"));
  ASSERT_TRUE(reg.ok()) << reg.status();
  out->reg = *std::move(reg);
  out->nv = Push(*out->reg, "mini-kimi-nvfp4", "nvfp4", false);
  out->mx = Push(*out->reg, "mini-kimi-mxfp4", "mxfp4", true);
  ASSERT_FALSE(out->nv.empty());
  ASSERT_FALSE(out->mx.empty());
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_OCI_OCI_HARNESS_H_
