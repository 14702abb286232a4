#include "core/oci/registry.h"

#include <curl/curl.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "core/oci/credentials.h"
#include "core/sha256.h"
#include "core/text/json_parse.h"

namespace ckpt::oci {
namespace {

constexpr size_t kMaxHeaderBytes = 64u << 10;
constexpr size_t kMaxErrorBody = 4u << 10;
constexpr size_t kMaxDiscardedBody = 1u << 20;
constexpr size_t kMaxTokenAnswer = 1u << 20;
constexpr int kMaxRedirects = 5;
constexpr char kManifestAccept[] =
    "Accept: application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json, "
    "application/vnd.oci.image.index.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json";

void GlobalInit() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// The parts of a URL that decide where a request goes.
struct Url {
  std::string full, scheme, host, port;
  std::string Origin() const { return absl::StrCat(scheme, "://", host, ":", port); }
  bool Loopback() const {
    return host == "localhost" || host == "127.0.0.1" || host == "[::1]" || host == "::1";
  }
};

// `location` resolved against `base` (relative Locations are normal for uploads and blobs).
absl::StatusOr<Url> ResolveUrl(const std::string& base, const std::string& location) {
  CURLU* u = curl_url();
  auto fail = [&](const std::string& what) {
    curl_url_cleanup(u);
    return absl::InvalidArgumentError(absl::StrCat("registry URL '", what, "' does not parse"));
  };
  if (curl_url_set(u, CURLUPART_URL, base.c_str(), 0) != CURLUE_OK) return fail(base);
  if (!location.empty() && curl_url_set(u, CURLUPART_URL, location.c_str(), 0) != CURLUE_OK) {
    return fail(location);
  }
  Url out;
  auto get = [&](CURLUPart part, std::string* into, unsigned flags) {
    char* s = nullptr;
    if (curl_url_get(u, part, &s, flags) != CURLUE_OK) return false;
    *into = s;
    curl_free(s);
    return true;
  };
  if (!get(CURLUPART_URL, &out.full, 0) || !get(CURLUPART_SCHEME, &out.scheme, 0) ||
      !get(CURLUPART_HOST, &out.host, 0) || !get(CURLUPART_PORT, &out.port, CURLU_DEFAULT_PORT)) {
    return fail(location.empty() ? base : location);
  }
  curl_url_cleanup(u);
  out.scheme = absl::AsciiStrToLower(out.scheme);
  out.host = absl::AsciiStrToLower(out.host);
  if (out.scheme != "https" && out.scheme != "http") {
    return absl::FailedPreconditionError(
        absl::StrCat("registry URL '", out.full, "' is neither https nor http"));
  }
  return out;
}

struct Request {
  std::string method = "GET";
  std::string url;
  std::vector<std::string> headers;
  std::optional<absl::string_view> body;  // sent as is (POST/PUT)
  BlobSink sink;                         // a 2xx answer's body; unset: kept in Response::body
  uint64_t max_body = 0;                 // cap on Response::body
  bool push = false;                     // the token scope asks for push too
  bool partial = false;                  // a Range request: only a 206 answer's body is taken
  bool manifest_put = false;             // a 400 naming a blob in flux is ABORTED (registry.h)
};

struct Response {
  long status = 0;
  std::map<std::string, std::string> headers;  // lower-case names; the last value of each
  std::string body;        // a 2xx answer's body when the request had no sink
  std::string error_body;  // the first kMaxErrorBody bytes of any other answer
  std::string url;
  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

struct Transfer {
  const Request* req;
  Response* resp;
  size_t header_bytes = 0;
  uint64_t discarded = 0;
  absl::Status error;
};

size_t OnHeader(char* data, size_t size, size_t n, void* p) {
  Transfer& t = *static_cast<Transfer*>(p);
  size_t len = size * n;
  t.header_bytes += len;
  if (t.header_bytes > kMaxHeaderBytes) {
    t.error = absl::ResourceExhaustedError(absl::StrCat(
        t.resp->url, ": the answer's headers are longer than ", kMaxHeaderBytes, " bytes"));
    return 0;
  }
  absl::string_view line(data, len);
  line = absl::StripTrailingAsciiWhitespace(line);
  if (absl::StartsWith(line, "HTTP/")) {  // a new answer (after 100 Continue): start over
    t.resp->headers.clear();
    size_t sp = line.find(' ');
    long code = 0;
    if (sp != absl::string_view::npos) {
      (void)absl::SimpleAtoi(line.substr(sp + 1, 3), &code);
    }
    t.resp->status = code;
    return len;
  }
  size_t colon = line.find(':');
  if (colon != absl::string_view::npos) {
    t.resp->headers[absl::AsciiStrToLower(line.substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(line.substr(colon + 1)));
  }
  return len;
}

size_t OnBody(char* data, size_t size, size_t n, void* p) {
  Transfer& t = *static_cast<Transfer*>(p);
  size_t len = size * n;
  std::span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(data), len);
  if (t.resp->status < 200 || t.resp->status >= 300) {
    size_t keep = std::min(len, kMaxErrorBody - std::min(kMaxErrorBody, t.resp->error_body.size()));
    t.resp->error_body.append(data, keep);
    t.discarded += len;
    if (t.discarded > kMaxDiscardedBody) {
      t.error = absl::ResourceExhaustedError(absl::StrCat(
          t.resp->url, ": an error answer longer than ", kMaxDiscardedBody, " bytes"));
      return 0;
    }
    return len;
  }
  if (t.req->partial && t.resp->status != 206) {
    t.error = absl::FailedPreconditionError(absl::StrCat(
        t.resp->url, ": answered ", t.resp->status,
        " to a Range request (the registry ignores Range); raw layers are read by position"));
    return 0;
  }
  if (t.req->sink) {
    t.error = t.req->sink(bytes);
    return t.error.ok() ? len : 0;
  }
  if (t.resp->body.size() + len > t.req->max_body) {
    t.error = absl::ResourceExhaustedError(absl::StrCat(
        t.resp->url, ": the answer is longer than the ", t.req->max_body, " bytes allowed"));
    return 0;
  }
  t.resp->body.append(data, len);
  return len;
}

// The parameters of a `Bearer k="v",k="v"` challenge.
std::map<std::string, std::string> ChallengeParams(absl::string_view s) {
  std::map<std::string, std::string> out;
  while (!s.empty()) {
    s = absl::StripLeadingAsciiWhitespace(s);
    size_t eq = s.find('=');
    if (eq == absl::string_view::npos) break;
    std::string key = absl::AsciiStrToLower(absl::StripAsciiWhitespace(s.substr(0, eq)));
    s.remove_prefix(eq + 1);
    std::string value;
    if (absl::ConsumePrefix(&s, "\"")) {
      size_t end = s.find('"');
      if (end == absl::string_view::npos) break;
      value = std::string(s.substr(0, end));
      s.remove_prefix(end + 1);
    } else {
      size_t end = s.find(',');
      value = std::string(absl::StripAsciiWhitespace(s.substr(0, end)));
      s.remove_prefix(end == absl::string_view::npos ? s.size() : end);
    }
    out[key] = value;
    s = absl::StripLeadingAsciiWhitespace(s);
    absl::ConsumePrefix(&s, ",");
  }
  return out;
}

bool HeaderSafe(absl::string_view v) {
  for (char c : v) {
    if (static_cast<unsigned char>(c) < 0x21 || static_cast<unsigned char>(c) > 0x7e) return false;
  }
  return !v.empty();
}

// Whether an error answer's `errors` name a blob as unknown or a digest as invalid: what Debian's
// docker-registry answers to a manifest PUT that checks a blob while another push of the same
// blob rewrites its link file in place (registry.h, ABORTED).
bool NamesABlobInFlux(const std::string& error_body) {
  auto j = ParseBoundedJson(error_body, "error answer");
  if (!j.ok() || !j->is_object() || !j->contains("errors") || !(*j)["errors"].is_array()) {
    return false;
  }
  for (const nlohmann::json& e : (*j)["errors"]) {
    if (!e.is_object() || !e.contains("code") || !e["code"].is_string()) continue;
    const std::string& code = e["code"].get_ref<const std::string&>();
    if (code == "BLOB_UNKNOWN" || code == "MANIFEST_BLOB_UNKNOWN" || code == "DIGEST_INVALID") {
      return true;
    }
  }
  return false;
}

std::string DockerConfigPath(const ClientOptions& o) {
  if (!o.docker_config.empty()) return o.docker_config;
  if (const char* d = std::getenv("DOCKER_CONFIG"); d != nullptr && *d != '\0') {
    return absl::StrCat(d, "/config.json");
  }
  const char* home = std::getenv("HOME");
  return absl::StrCat(home == nullptr ? "" : home, "/.docker/config.json");
}

}  // namespace

struct Registry::Impl {
  Url base;  // scheme://registry
  std::string repository;
  std::string registry;
  ClientOptions options;
  RegistryCredentials creds;

  mutable std::mutex mu;
  mutable std::vector<CURL*> idle;
  mutable std::string token;       // the last token the realm issued
  mutable bool use_basic = false;  // the registry asked for Basic

  ~Impl() {
    for (CURL* c : idle) curl_easy_cleanup(c);
  }

  CURL* Take() const {
    std::lock_guard<std::mutex> lock(mu);
    if (idle.empty()) return curl_easy_init();
    CURL* c = idle.back();
    idle.pop_back();
    return c;
  }
  void Give(CURL* c) const {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(c);
  }

  std::string AuthHeader() const {
    std::lock_guard<std::mutex> lock(mu);
    if (!token.empty()) return absl::StrCat("Authorization: Bearer ", token);
    if (use_basic && !creds.basic.empty()) {
      return absl::StrCat("Authorization: Basic ", creds.basic);
    }
    return "";
  }

  // One HTTP exchange, no redirects followed, `auth` sent when not empty.
  absl::Status Perform(const Request& req, const std::string& url, const std::string& auth,
                       Response* resp) const {
    CURL* c = Take();
    if (c == nullptr) return absl::InternalError("curl_easy_init failed");
    curl_easy_reset(c);
    resp->url = url;
    Transfer t{&req, resp, 0, 0, absl::OkStatus()};
    curl_slist* headers = nullptr;
    for (const std::string& h : req.headers) headers = curl_slist_append(headers, h.c_str());
    if (!auth.empty()) headers = curl_slist_append(headers, auth.c_str());
    headers = curl_slist_append(headers, "Expect:");
    curl_easy_setopt(c, CURLOPT_URL, url.c_str());
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
    if (!options.ca_file.empty()) curl_easy_setopt(c, CURLOPT_CAINFO, options.ca_file.c_str());
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, options.connect_timeout_s);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, options.low_speed_timeout_s);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, OnHeader);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, OnBody);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
    if (req.body) {
      curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(req.body->size()));
      curl_easy_setopt(c, CURLOPT_POSTFIELDS, req.body->data() ? req.body->data() : "");
    }
    if (req.method == "HEAD") {
      curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (req.method != "GET" && !(req.method == "POST" && req.body)) {
      curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, req.method.c_str());
    }
    CURLcode rc = curl_easy_perform(c);
    curl_slist_free_all(headers);
    Give(c);
    if (!t.error.ok()) return t.error;
    if (rc != CURLE_OK) {
      return absl::UnavailableError(absl::StrCat(req.method, " ", url, ": ",
                                                 curl_easy_strerror(rc)));
    }
    return absl::OkStatus();
  }

  // The token of a Bearer challenge: GET realm?service=&scope= (with the config's credentials),
  // or with an identity token, POST realm grant_type=refresh_token&... (docs/interop.md,
  // "Authentication and transport").
  absl::Status FetchToken(const std::string& challenge, const Request& req) const {
    auto params = ChallengeParams(challenge.substr(challenge.find(' ') + 1));
    const std::string& realm = params["realm"];
    auto realm_url = ResolveUrl(realm, "");
    if (realm.empty() || !realm_url.ok()) {
      return absl::UnauthenticatedError(absl::StrCat(
          "registry ", registry, ": the Bearer challenge has no usable realm: ", challenge));
    }
    if (realm_url->scheme != "https" && !realm_url->Loopback()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "registry ", registry, ": token realm ", realm, " is plain HTTP off loopback"));
    }
    std::string scope = params.count("scope")
                            ? params["scope"]
                            : absl::StrCat("repository:", repository, req.push ? ":pull,push"
                                                                                : ":pull");
    CURL* c = Take();
    if (c == nullptr) return absl::InternalError("curl_easy_init failed");
    auto escape = [c](const std::string& v) {
      char* e = curl_easy_escape(c, v.c_str(), static_cast<int>(v.size()));
      std::string out = e == nullptr ? "" : e;
      curl_free(e);
      return out;
    };
    const std::string query = absl::StrCat("service=", escape(params["service"]), "&scope=",
                                           escape(scope));
    Request treq;
    treq.max_body = kMaxTokenAnswer;
    std::string form;
    if (!creds.identity_token.empty()) {
      // An identity token is an OAuth2 refresh token: POSTed as a refresh_token grant.
      form = absl::StrCat("grant_type=refresh_token&refresh_token=", escape(creds.identity_token),
                          "&", query, "&client_id=ckpt-audit");
      treq.method = "POST";
      treq.url = realm_url->full;
      treq.headers = {"Content-Type: application/x-www-form-urlencoded"};
      treq.body = form;
    } else {
      treq.url = absl::StrCat(realm_url->full,
                              realm.find('?') == std::string::npos ? "?" : "&", query);
    }
    Give(c);
    Response resp;
    std::string auth =
        creds.basic.empty() ? "" : absl::StrCat("Authorization: Basic ", creds.basic);
    if (absl::Status s = Perform(treq, treq.url, auth, &resp); !s.ok()) return s;
    if (resp.status == 401 || resp.status == 403) {
      return absl::UnauthenticatedError(absl::StrCat(
          "registry ", registry, ": token endpoint ", realm_url->Origin(), " answered ",
          resp.status,
          !creds.identity_token.empty() ? " to the identity token"
          : creds.basic.empty()         ? " (no credentials for this registry in the Docker config)"
                                        : " to the Docker config's credentials"));
    }
    if (resp.status == 429) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "registry ", registry, ": token endpoint answered 429 Too Many Requests; not retried"));
    }
    if (resp.status != 200) {
      return absl::UnauthenticatedError(absl::StrCat("registry ", registry,
                                                     ": token endpoint answered ", resp.status));
    }
    auto j = ParseBoundedJson(resp.body, absl::StrCat("token answer of ", realm_url->Origin()));
    if (!j.ok()) return absl::UnauthenticatedError(j.status().message());
    std::string tok;
    for (const char* key : {"token", "access_token"}) {
      if (j->is_object() && j->contains(key) && (*j)[key].is_string()) {
        tok = (*j)[key].get<std::string>();
        break;
      }
    }
    if (!HeaderSafe(tok)) {
      return absl::UnauthenticatedError(absl::StrCat(
          "registry ", registry, ": the token answer holds no token of printable characters"));
    }
    std::lock_guard<std::mutex> lock(mu);
    token = tok;
    return absl::OkStatus();
  }

  // A request with the registry's auth, its redirects and its named errors.
  absl::StatusOr<Response> Send(const Request& req) const {
    bool authenticated_again = false;
    int redirects = 0;
    auto url = ResolveUrl(req.url, "");
    if (!url.ok()) return url.status();
    while (true) {
      const bool home = url->Origin() == base.Origin();
      Response resp;
      // The registry's credentials go only to the registry itself, never to storage elsewhere.
      absl::Status s = Perform(req, url->full, home ? AuthHeader() : "", &resp);
      if (!s.ok()) return s;
      const std::string what = absl::StrCat(req.method, " ", url->full);
      if (resp.status == 401) {
        if (!home || authenticated_again) {
          return absl::UnauthenticatedError(absl::StrCat(
              "registry ", registry, ": ", what, " answered 401 ",
              home ? "again after authenticating" : "(storage outside the registry)"));
        }
        std::string challenge = resp.Header("www-authenticate");
        if (absl::StartsWithIgnoreCase(challenge, "bearer ")) {
          if (absl::Status t = FetchToken(challenge, req); !t.ok()) return t;
        } else if (absl::StartsWithIgnoreCase(challenge, "basic") && !creds.basic.empty()) {
          std::lock_guard<std::mutex> lock(mu);
          use_basic = true;
        } else {
          return absl::UnauthenticatedError(absl::StrCat(
              "registry ", registry, ": ", what, " answered 401",
              challenge.empty() ? " without a challenge"
                                : absl::StrCat(" (", challenge.substr(0, 200), ")"),
              creds.empty() ? " and the Docker config has no credentials for it" : ""));
        }
        authenticated_again = true;
        continue;
      }
      if (resp.status == 301 || resp.status == 302 || resp.status == 303 ||
          resp.status == 307 || resp.status == 308) {
        if (++redirects > kMaxRedirects) {
          return absl::UnavailableError(absl::StrCat("registry ", registry, ": ", what,
                                                     ": more than ", kMaxRedirects, " redirects"));
        }
        if (req.body) {
          return absl::FailedPreconditionError(
              absl::StrCat("registry ", registry, ": ", what, " redirected an upload"));
        }
        auto next = ResolveUrl(url->full, resp.Header("location"));
        if (!next.ok()) return next.status();
        if (next->scheme == "http" && !next->Loopback()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "registry ", registry, ": ", what, " redirected to plain HTTP off loopback: ",
              next->full));
        }
        url = *std::move(next);
        continue;
      }
      const std::string said = resp.error_body.empty()
                                   ? ""
                                   : absl::StrCat(": ", resp.error_body.substr(0, 300));
      if (resp.status == 429) {
        std::string after = resp.Header("retry-after");
        return absl::ResourceExhaustedError(absl::StrCat(
            "registry ", registry, " answered 429 Too Many Requests to ", what,
            after.empty() ? "" : absl::StrCat(" (Retry-After: ", after.substr(0, 40), ")"),
            "; not retried"));
      }
      if (resp.status == 403) {
        return absl::PermissionDeniedError(
            absl::StrCat("registry ", registry, ": ", what, " answered 403", said));
      }
      if (resp.status == 404) {
        return absl::NotFoundError(
            absl::StrCat("registry ", registry, ": ", what, " answered 404", said));
      }
      if (resp.status >= 500 || resp.status < 200) {
        return absl::UnavailableError(
            absl::StrCat("registry ", registry, ": ", what, " answered ", resp.status, said));
      }
      if (resp.status == 400 && req.manifest_put && NamesABlobInFlux(resp.error_body)) {
        return absl::AbortedError(
            absl::StrCat("registry ", registry, ": ", what, " answered 400", said));
      }
      if (resp.status >= 300 && resp.status != 416) {
        return absl::FailedPreconditionError(
            absl::StrCat("registry ", registry, ": ", what, " answered ", resp.status, said));
      }
      return resp;
    }
  }

  std::string Path(const std::string& tail) const {
    return absl::StrCat(base.full, "v2/", repository, "/", tail);
  }

  // GET of a manifest-like document (a manifest, an index, a referrers list) at `tail`, within
  // the manifest cap; its bytes, their digest and media type, and the answer's headers in
  // `*resp`. Any answer but 200 is an error naming `what`.
  absl::StatusOr<FetchedManifest> GetDocument(const std::string& tail, std::string accept,
                                              const std::string& what, Response* resp) const {
    Request req;
    req.url = Path(tail);
    req.headers = {std::move(accept)};
    req.max_body = options.max_manifest;
    auto got = Send(req);
    if (!got.ok()) return got.status();
    if (got->status != 200) {
      return absl::FailedPreconditionError(
          absl::StrCat("registry ", registry, ": ", what, " answered ", got->status));
    }
    *resp = *std::move(got);
    FetchedManifest m;
    m.bytes = std::move(resp->body);
    m.digest = DigestOf(m.bytes);
    m.media_type = resp->Header("content-type");
    return m;
  }
};

Registry::Registry(Reference ref, std::unique_ptr<Impl> impl)
    : ref_(std::move(ref)), impl_(std::move(impl)) {}
Registry::~Registry() = default;

absl::StatusOr<std::shared_ptr<Registry>> Registry::Connect(const Reference& ref,
                                                            const ClientOptions& options) {
  GlobalInit();
  auto impl = std::make_unique<Impl>();
  auto base = ResolveUrl(absl::StrCat(ref.Loopback() ? "http://" : "https://", ref.registry, "/"),
                         "");
  if (!base.ok()) return base.status();
  impl->base = *base;
  impl->repository = ref.repository;
  impl->registry = ref.registry;
  impl->options = options;
  auto creds = DockerCredentials(ref.registry, DockerConfigPath(options),
                                 options.credential_helper_timeout_ms);
  if (!creds.ok()) return creds.status();
  impl->creds = *std::move(creds);
  return std::shared_ptr<Registry>(new Registry(ref, std::move(impl)));
}

absl::StatusOr<FetchedManifest> Registry::GetManifest(const std::string& tag_or_digest) const {
  const bool by_digest = absl::StartsWith(tag_or_digest, "sha256:");
  Response resp;
  absl::StatusOr<FetchedManifest> got =
      impl_->GetDocument(absl::StrCat("manifests/", tag_or_digest), kManifestAccept,
                         absl::StrCat("manifest ", tag_or_digest), &resp);
  if (!got.ok()) return got.status();
  FetchedManifest& m = *got;
  const std::string named = ref_.ByDigest(tag_or_digest).ToString();
  if (by_digest && m.digest != tag_or_digest) {
    return absl::DataLossError(absl::StrCat("manifest of ", named, ": the bytes served hash to ",
                                            m.digest, ", not the digest asked for"));
  }
  std::string said = resp.Header("docker-content-digest");
  if (!by_digest && !said.empty() && said != m.digest) {
    return absl::DataLossError(absl::StrCat(
        "manifest of ", ref_.registry, "/", ref_.repository, ":", tag_or_digest,
        ": the bytes served hash to ", m.digest, ", the registry says ", said));
  }
  return got;
}

absl::Status Registry::ReadBlobRange(const std::string& digest, uint64_t size, uint64_t offset,
                                     std::span<uint8_t> out) const {
  if (out.empty()) return absl::OkStatus();
  const std::string named = absl::StrCat("blob ", digest, " of ", ref_.registry, "/",
                                         ref_.repository);
  if (offset + out.size() > size || offset + out.size() < offset) {
    return absl::OutOfRangeError(absl::StrCat(named, ": [", offset, ", +", out.size(),
                                              ") is past its descriptor's ", size, " bytes"));
  }
  const uint64_t last = offset + out.size() - 1;
  uint64_t got = 0;
  Request req;
  req.url = impl_->Path(absl::StrCat("blobs/", digest));
  req.headers = {absl::StrCat("Range: bytes=", offset, "-", last)};
  req.partial = true;
  req.sink = [&](std::span<const uint8_t> bytes) {
    if (got + bytes.size() > out.size()) {
      return absl::DataLossError(absl::StrCat(named, ": more bytes than the range [", offset, ", ",
                                              last + 1, ") asked for"));
    }
    std::copy(bytes.begin(), bytes.end(), out.begin() + got);
    got += bytes.size();
    return absl::OkStatus();
  };
  auto resp = impl_->Send(req);
  if (!resp.ok()) return resp.status();
  // "bytes A-B/TOTAL" (or "bytes */TOTAL" with 416): TOTAL is the blob's real length.
  const std::string cr = resp->Header("content-range");
  const std::string total_text = cr.substr(cr.rfind('/') + 1);
  uint64_t total = 0;
  const bool has_total = cr.find('/') != absl::string_view::npos &&
                         absl::SimpleAtoi(total_text, &total);
  if (has_total && total != size) {
    return absl::DataLossError(absl::StrCat(
        named, ": the registry holds ", total, " bytes, the manifest's descriptor says ", size,
        total > size ? " (longer than its descriptor)" : " (shorter than its descriptor)"));
  }
  if (resp->status == 416) {
    return absl::DataLossError(absl::StrCat(named, ": range [", offset, ", ", last + 1,
                                            ") not satisfiable: shorter than its descriptor's ",
                                            size, " bytes"));
  }
  if (resp->status != 206 || !has_total) {
    return absl::FailedPreconditionError(absl::StrCat(
        named, ": the registry answered ", resp->status,
        " without a Content-Range to a Range request; raw layers are read by position"));
  }
  std::string expect = absl::StrCat("bytes ", offset, "-", last, "/");
  if (!absl::StartsWith(cr, expect) || got != out.size()) {
    return absl::DataLossError(absl::StrCat(named, ": asked for [", offset, ", ", last + 1,
                                            "), got ", got, " bytes as '", cr.substr(0, 80), "'"));
  }
  return absl::OkStatus();
}

absl::Status Registry::ReadBlob(const std::string& digest, uint64_t size,
                                const BlobSink& sink) const {
  const std::string named = absl::StrCat("blob ", digest, " of ", ref_.registry, "/",
                                         ref_.repository);
  uint64_t got = 0;
  Sha256 hasher;
  Request req;
  req.url = impl_->Path(absl::StrCat("blobs/", digest));
  req.sink = [&](std::span<const uint8_t> bytes) {
    got += bytes.size();
    if (got > size) {
      return absl::DataLossError(absl::StrCat(named, ": longer than its descriptor's ", size,
                                              " bytes"));
    }
    hasher.Update(bytes);
    return sink(bytes);
  };
  auto resp = impl_->Send(req);
  if (!resp.ok()) return resp.status();
  if (resp->status != 200) {
    return absl::FailedPreconditionError(
        absl::StrCat(named, ": the registry answered ", resp->status));
  }
  if (got < size) {
    return absl::DataLossError(absl::StrCat(named, ": ", got,
                                            " bytes, shorter than its descriptor's ", size));
  }
  std::string seen = absl::StrCat("sha256:", ToHex(hasher.Finish()));
  if (seen != digest) {
    return absl::DataLossError(absl::StrCat(named, ": the bytes served hash to ", seen,
                                            ", not to the manifest's digest"));
  }
  return absl::OkStatus();
}

absl::Status Registry::PushBlob(absl::string_view bytes) const {
  const std::string digest = DigestOf(bytes);
  // A blob the registry has is not uploaded again: a second upload of a blob rewrites its link
  // in place, and a concurrent push that checks the blob meanwhile is refused (ABORTED).
  Request head;
  head.method = "HEAD";
  head.url = impl_->Path(absl::StrCat("blobs/", digest));
  head.push = true;
  auto has = impl_->Send(head);
  if (has.ok() && has->status == 200) return absl::OkStatus();
  // A 5xx is what a HEAD meets while another push rewrites the link (the caller may try again);
  // any other answer (404, 401, 403, 405, ...) leaves the upload to find out and say.
  if (absl::IsUnavailable(has.status())) return has.status();
  Request start;
  start.method = "POST";
  start.url = impl_->Path("blobs/uploads/");
  start.body = absl::string_view();
  start.push = true;
  auto begun = impl_->Send(start);
  if (!begun.ok()) return begun.status();
  std::string location = begun->Header("location");
  if (begun->status != 202 || location.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "registry ", ref_.registry, ": upload of ", digest, " answered ", begun->status,
        " without a Location"));
  }
  auto at = ResolveUrl(begun->url, location);
  if (!at.ok()) return at.status();
  Request put;
  put.method = "PUT";
  put.url = absl::StrCat(at->full, at->full.find('?') == std::string::npos ? "?" : "&",
                         "digest=", digest);
  put.headers = {"Content-Type: application/octet-stream"};
  put.body = bytes;
  put.push = true;
  auto done = impl_->Send(put);
  if (!done.ok()) return done.status();
  if (done->status != 201) {
    return absl::FailedPreconditionError(absl::StrCat(
        "registry ", ref_.registry, ": upload of ", digest, " answered ", done->status));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Registry::PushManifest(const std::string& tag_or_digest,
                                                   const std::string& media_type,
                                                   absl::string_view bytes,
                                                   std::string* oci_subject) const {
  Request put;
  put.method = "PUT";
  put.url = impl_->Path(absl::StrCat("manifests/", tag_or_digest));
  put.headers = {absl::StrCat("Content-Type: ", media_type)};
  put.body = bytes;
  put.push = true;
  put.manifest_put = true;
  auto done = impl_->Send(put);
  if (!done.ok()) return done.status();
  if (done->status != 201) {
    return absl::FailedPreconditionError(absl::StrCat(
        "registry ", ref_.registry, ": manifest ", tag_or_digest, " answered ", done->status,
        done->error_body.empty() ? "" : absl::StrCat(": ", done->error_body.substr(0, 300))));
  }
  if (oci_subject != nullptr) *oci_subject = done->Header("oci-subject");
  return DigestOf(bytes);
}

absl::StatusOr<FetchedManifest> Registry::GetReferrers(const std::string& digest) const {
  if (absl::Status s = CheckDigest(digest, "referrers subject"); !s.ok()) return s;
  Response resp;
  return impl_->GetDocument(absl::StrCat("referrers/", digest),
                            absl::StrCat("Accept: ", kOciIndex),
                            absl::StrCat("referrers of ", digest), &resp);
}

}  // namespace ckpt::oci
