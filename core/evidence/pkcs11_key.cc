#include "core/evidence/pkcs11_key.h"

#include <dlfcn.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ecdsa.h>
#include <p11-kit/pkcs11.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "core/sha256.h"

namespace ckpt::evidence {
namespace {

// The CKR_ names of the return codes a token is likely to give, for messages.
absl::string_view CkrName(CK_RV rv) {
  switch (rv) {
    case CKR_CANCEL: return "CKR_CANCEL";
    case CKR_HOST_MEMORY: return "CKR_HOST_MEMORY";
    case CKR_SLOT_ID_INVALID: return "CKR_SLOT_ID_INVALID";
    case CKR_GENERAL_ERROR: return "CKR_GENERAL_ERROR";
    case CKR_FUNCTION_FAILED: return "CKR_FUNCTION_FAILED";
    case CKR_ARGUMENTS_BAD: return "CKR_ARGUMENTS_BAD";
    case CKR_ATTRIBUTE_READ_ONLY: return "CKR_ATTRIBUTE_READ_ONLY";
    case CKR_ATTRIBUTE_SENSITIVE: return "CKR_ATTRIBUTE_SENSITIVE";
    case CKR_ATTRIBUTE_TYPE_INVALID: return "CKR_ATTRIBUTE_TYPE_INVALID";
    case CKR_ATTRIBUTE_VALUE_INVALID: return "CKR_ATTRIBUTE_VALUE_INVALID";
    case CKR_DATA_INVALID: return "CKR_DATA_INVALID";
    case CKR_DATA_LEN_RANGE: return "CKR_DATA_LEN_RANGE";
    case CKR_DEVICE_ERROR: return "CKR_DEVICE_ERROR";
    case CKR_DEVICE_MEMORY: return "CKR_DEVICE_MEMORY";
    case CKR_DEVICE_REMOVED: return "CKR_DEVICE_REMOVED";
    case CKR_FUNCTION_CANCELED: return "CKR_FUNCTION_CANCELED";
    case CKR_FUNCTION_NOT_SUPPORTED: return "CKR_FUNCTION_NOT_SUPPORTED";
    case CKR_KEY_HANDLE_INVALID: return "CKR_KEY_HANDLE_INVALID";
    case CKR_KEY_SIZE_RANGE: return "CKR_KEY_SIZE_RANGE";
    case CKR_KEY_TYPE_INCONSISTENT: return "CKR_KEY_TYPE_INCONSISTENT";
    case CKR_KEY_FUNCTION_NOT_PERMITTED: return "CKR_KEY_FUNCTION_NOT_PERMITTED";
    case CKR_MECHANISM_INVALID: return "CKR_MECHANISM_INVALID";
    case CKR_MECHANISM_PARAM_INVALID: return "CKR_MECHANISM_PARAM_INVALID";
    case CKR_OBJECT_HANDLE_INVALID: return "CKR_OBJECT_HANDLE_INVALID";
    case CKR_OPERATION_ACTIVE: return "CKR_OPERATION_ACTIVE";
    case CKR_OPERATION_NOT_INITIALIZED: return "CKR_OPERATION_NOT_INITIALIZED";
    case CKR_PIN_INCORRECT: return "CKR_PIN_INCORRECT";
    case CKR_PIN_INVALID: return "CKR_PIN_INVALID";
    case CKR_PIN_LEN_RANGE: return "CKR_PIN_LEN_RANGE";
    case CKR_PIN_EXPIRED: return "CKR_PIN_EXPIRED";
    case CKR_PIN_LOCKED: return "CKR_PIN_LOCKED";
    case CKR_SESSION_CLOSED: return "CKR_SESSION_CLOSED";
    case CKR_SESSION_COUNT: return "CKR_SESSION_COUNT";
    case CKR_SESSION_HANDLE_INVALID: return "CKR_SESSION_HANDLE_INVALID";
    case CKR_SESSION_READ_ONLY: return "CKR_SESSION_READ_ONLY";
    case CKR_TEMPLATE_INCOMPLETE: return "CKR_TEMPLATE_INCOMPLETE";
    case CKR_TEMPLATE_INCONSISTENT: return "CKR_TEMPLATE_INCONSISTENT";
    case CKR_TOKEN_NOT_PRESENT: return "CKR_TOKEN_NOT_PRESENT";
    case CKR_TOKEN_NOT_RECOGNIZED: return "CKR_TOKEN_NOT_RECOGNIZED";
    case CKR_TOKEN_WRITE_PROTECTED: return "CKR_TOKEN_WRITE_PROTECTED";
    case CKR_USER_NOT_LOGGED_IN: return "CKR_USER_NOT_LOGGED_IN";
    case CKR_USER_PIN_NOT_INITIALIZED: return "CKR_USER_PIN_NOT_INITIALIZED";
    case CKR_USER_TYPE_INVALID: return "CKR_USER_TYPE_INVALID";
    case CKR_USER_ANOTHER_ALREADY_LOGGED_IN: return "CKR_USER_ANOTHER_ALREADY_LOGGED_IN";
    case CKR_DOMAIN_PARAMS_INVALID: return "CKR_DOMAIN_PARAMS_INVALID";
    case CKR_CURVE_NOT_SUPPORTED: return "CKR_CURVE_NOT_SUPPORTED";
    case CKR_BUFFER_TOO_SMALL: return "CKR_BUFFER_TOO_SMALL";
    case CKR_CRYPTOKI_NOT_INITIALIZED: return "CKR_CRYPTOKI_NOT_INITIALIZED";
    case CKR_CRYPTOKI_ALREADY_INITIALIZED: return "CKR_CRYPTOKI_ALREADY_INITIALIZED";
    case CKR_FUNCTION_REJECTED: return "CKR_FUNCTION_REJECTED";
  }
  return "";
}

absl::StatusCode CodeOf(CK_RV rv) {
  switch (rv) {
    case CKR_PIN_INCORRECT:
    case CKR_PIN_INVALID:
    case CKR_PIN_LEN_RANGE:
    case CKR_USER_NOT_LOGGED_IN:
    case CKR_KEY_FUNCTION_NOT_PERMITTED:
      return absl::StatusCode::kPermissionDenied;
    case CKR_PIN_LOCKED:
    case CKR_PIN_EXPIRED:
    case CKR_USER_PIN_NOT_INITIALIZED:
    case CKR_KEY_TYPE_INCONSISTENT:
    case CKR_MECHANISM_INVALID:
    case CKR_CURVE_NOT_SUPPORTED:
    case CKR_TOKEN_WRITE_PROTECTED:
    case CKR_SESSION_READ_ONLY:
    case CKR_USER_ANOTHER_ALREADY_LOGGED_IN:
      return absl::StatusCode::kFailedPrecondition;
    case CKR_TOKEN_NOT_PRESENT:
    case CKR_TOKEN_NOT_RECOGNIZED:
    case CKR_DEVICE_REMOVED:
    case CKR_DEVICE_ERROR:
    case CKR_SESSION_CLOSED:
    case CKR_SESSION_COUNT:
      return absl::StatusCode::kUnavailable;
    case CKR_ARGUMENTS_BAD:
    case CKR_ATTRIBUTE_VALUE_INVALID:
    case CKR_ATTRIBUTE_TYPE_INVALID:
    case CKR_TEMPLATE_INCOMPLETE:
    case CKR_TEMPLATE_INCONSISTENT:
    case CKR_DOMAIN_PARAMS_INVALID:
    case CKR_DATA_LEN_RANGE:
      return absl::StatusCode::kInvalidArgument;
    case CKR_HOST_MEMORY:
    case CKR_DEVICE_MEMORY:
      return absl::StatusCode::kResourceExhausted;
    default:
      return absl::StatusCode::kInternal;
  }
}

// "PKCS#11 C_Login: CKR_PIN_INCORRECT (0xa0)" and what it means here.
absl::Status CkError(absl::string_view call, CK_RV rv, absl::string_view context = "") {
  absl::string_view name = CkrName(rv);
  std::string text = absl::StrCat("PKCS#11 ", call, ": ",
                                  name.empty() ? "a return code without a CKR_ name here" : name,
                                  " (0x", absl::Hex(rv), ")");
  if (rv == CKR_PIN_INCORRECT) {
    absl::StrAppend(&text, ": the token did not accept the PIN; not retried (each try counts "
                           "against the token's PIN attempts)");
  }
  if (!context.empty()) absl::StrAppend(&text, " (", context, ")");
  return absl::Status(CodeOf(rv), text);
}

// A loaded and initialized module. One per file per process: a second C_Initialize of the same
// module fails, and finalizing it under another user would end that user's sessions.
class Module {
 public:
  static absl::StatusOr<std::shared_ptr<Module>> Get(const std::string& path) {
    static std::mutex mu;
    static std::map<std::string, std::weak_ptr<Module>>* loaded =
        new std::map<std::string, std::weak_ptr<Module>>();
    if (path.empty() || path[0] != '/') {
      return absl::InvalidArgumentError(absl::StrCat(
          "PKCS#11 module ", path, ": give its absolute path (a bare or relative name would be "
          "found in the working directory, never the library search path)"));
    }
    char* real = ::realpath(path.c_str(), nullptr);
    if (real == nullptr) {
      return absl::NotFoundError(absl::StrCat("PKCS#11 module ", path, ": ", std::strerror(errno)));
    }
    std::string key(real);
    ::free(real);
    // The module sees the PIN and makes every signature: only a regular file (dlopen of a FIFO
    // would wait forever) that no one but its owner, root or this user, can rewrite.
    struct stat st;
    if (::stat(key.c_str(), &st) != 0) {
      return absl::NotFoundError(absl::StrCat("PKCS#11 module ", path, ": ", std::strerror(errno)));
    }
    if (!S_ISREG(st.st_mode)) {
      return absl::InvalidArgumentError(
          absl::StrCat("PKCS#11 module ", path, ": not a regular file"));
    }
    if ((st.st_mode & 022) != 0 || (st.st_uid != 0 && st.st_uid != ::geteuid())) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "PKCS#11 module %s: writable by group or others (mode %04o) or owned by uid %d, "
          "neither root nor this user: whoever can rewrite it sees the PIN and signs",
          path, st.st_mode & 07777, st.st_uid));
    }
    std::lock_guard<std::mutex> lock(mu);
    if (auto m = (*loaded)[key].lock()) return m;
    void* handle = ::dlopen(key.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* err = ::dlerror();
      return absl::InvalidArgumentError(absl::StrCat("PKCS#11 module ", path, ": cannot load: ",
                                                     err != nullptr ? err : "dlopen failed"));
    }
    auto get = reinterpret_cast<CK_C_GetFunctionList>(::dlsym(handle, "C_GetFunctionList"));
    CK_FUNCTION_LIST_PTR fns = nullptr;
    if (get == nullptr) {
      ::dlclose(handle);
      return absl::InvalidArgumentError(
          absl::StrCat("PKCS#11 module ", path, ": no C_GetFunctionList: not a PKCS#11 module"));
    }
    if (CK_RV rv = get(&fns); rv != CKR_OK || fns == nullptr) {
      ::dlclose(handle);
      return CkError("C_GetFunctionList", rv == CKR_OK ? CKR_GENERAL_ERROR : rv, path);
    }
    CK_C_INITIALIZE_ARGS args{};
    args.flags = CKF_OS_LOCKING_OK;  // this process signs from several threads
    if (CK_RV rv = fns->C_Initialize(&args); rv != CKR_OK) {
      ::dlclose(handle);
      return CkError("C_Initialize", rv, path);
    }
    auto m = std::shared_ptr<Module>(new Module(handle, fns, path));
    (*loaded)[key] = m;
    return m;
  }

  ~Module() {
    fns_->C_Finalize(nullptr);
    ::dlclose(handle_);
  }
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  CK_FUNCTION_LIST_PTR fns() const { return fns_; }
  const std::string& path() const { return path_; }

 private:
  Module(void* handle, CK_FUNCTION_LIST_PTR fns, std::string path)
      : handle_(handle), fns_(fns), path_(std::move(path)) {}
  void* const handle_;
  const CK_FUNCTION_LIST_PTR fns_;
  const std::string path_;
};

// A logged-in session on one token; closing the last session logs out.
class Session {
 public:
  Session(std::shared_ptr<Module> module, CK_SESSION_HANDLE handle, std::string token)
      : module_(std::move(module)), handle_(handle), token_(std::move(token)) {}
  ~Session() { module_->fns()->C_CloseSession(handle_); }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  CK_FUNCTION_LIST_PTR fns() const { return module_->fns(); }
  CK_SESSION_HANDLE handle() const { return handle_; }
  const std::string& token() const { return token_; }  // the token's label, for messages

 private:
  std::shared_ptr<Module> module_;
  const CK_SESSION_HANDLE handle_;
  const std::string token_;
};

// A CK_TOKEN_INFO text field without its blank padding.
std::string Field(const unsigned char* text, size_t n) {
  std::string s(reinterpret_cast<const char*>(text), n);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\0')) s.pop_back();
  return s;
}

std::string Describe(const Pkcs11Uri& uri) {
  std::vector<std::string> parts;
  if (uri.token) parts.push_back(absl::StrCat("token=", *uri.token));
  if (uri.manufacturer) parts.push_back(absl::StrCat("manufacturer=", *uri.manufacturer));
  if (uri.model) parts.push_back(absl::StrCat("model=", *uri.model));
  if (uri.serial) parts.push_back(absl::StrCat("serial=", *uri.serial));
  if (uri.object) parts.push_back(absl::StrCat("object=", *uri.object));
  if (uri.id) {
    std::string id = "id=";
    for (uint8_t b : *uri.id) absl::StrAppend(&id, "%", absl::Hex(b, absl::kZeroPad2));
    parts.push_back(std::move(id));
  }
  return absl::StrJoin(parts, ";");
}

// Finds the one token the URI's token attributes match and opens a logged-in session on it.
absl::StatusOr<std::shared_ptr<Session>> OpenSession(const Pkcs11Uri& uri,
                                                     const Pkcs11Access& access, bool read_write) {
  if (access.module.empty()) {
    return absl::InvalidArgumentError("a pkcs11: key needs --pkcs11-module PATH");
  }
  auto module = Module::Get(access.module);
  if (!module.ok()) return module.status();
  CK_FUNCTION_LIST_PTR f = (*module)->fns();
  CK_ULONG count = 0;
  if (CK_RV rv = f->C_GetSlotList(CK_TRUE, nullptr, &count); rv != CKR_OK) {
    return CkError("C_GetSlotList", rv);
  }
  std::vector<CK_SLOT_ID> slots(count);
  if (CK_RV rv = f->C_GetSlotList(CK_TRUE, slots.data(), &count); rv != CKR_OK) {
    return CkError("C_GetSlotList", rv);
  }
  slots.resize(count);
  std::vector<std::pair<CK_SLOT_ID, std::string>> matches;
  std::vector<std::string> seen;
  for (CK_SLOT_ID slot : slots) {
    CK_TOKEN_INFO info;
    if (CK_RV rv = f->C_GetTokenInfo(slot, &info); rv != CKR_OK) {
      if (rv == CKR_TOKEN_NOT_PRESENT || rv == CKR_TOKEN_NOT_RECOGNIZED) continue;
      return CkError("C_GetTokenInfo", rv);
    }
    if (!(info.flags & CKF_TOKEN_INITIALIZED)) continue;
    std::string label = Field(info.label, sizeof info.label);
    seen.push_back(label);
    if ((uri.token && *uri.token != label) ||
        (uri.manufacturer &&
         *uri.manufacturer != Field(info.manufacturerID, sizeof info.manufacturerID)) ||
        (uri.model && *uri.model != Field(info.model, sizeof info.model)) ||
        (uri.serial && *uri.serial != Field(info.serialNumber, sizeof info.serialNumber))) {
      continue;
    }
    matches.emplace_back(slot, label);
  }
  if (matches.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "PKCS#11: no token of ", access.module, " matches ", Describe(uri),
        seen.empty() ? " (no initialized token present)"
                     : absl::StrCat(" (tokens present: ", absl::StrJoin(seen, ", "), ")")));
  }
  if (matches.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PKCS#11: ", matches.size(), " tokens match ", Describe(uri),
        "; name one with token= or serial="));
  }
  CK_SESSION_HANDLE h = CK_INVALID_HANDLE;
  CK_FLAGS flags = CKF_SERIAL_SESSION | (read_write ? CKF_RW_SESSION : 0);
  if (CK_RV rv = f->C_OpenSession(matches[0].first, flags, nullptr, nullptr, &h); rv != CKR_OK) {
    return CkError("C_OpenSession", rv, absl::StrCat("token ", matches[0].second));
  }
  auto session = std::make_shared<Session>(*module, h, matches[0].second);
  // Exactly one attempt: a wrong PIN is reported, never tried again.
  std::string pin = access.pin;
  CK_RV rv = f->C_Login(h, CKU_USER, reinterpret_cast<CK_UTF8CHAR_PTR>(pin.data()), pin.size());
  OPENSSL_cleanse(pin.data(), pin.size());
  if (rv != CKR_OK && rv != CKR_USER_ALREADY_LOGGED_IN) {
    return CkError("C_Login", rv, absl::StrCat("token ", matches[0].second));
  }
  return session;
}

absl::StatusOr<std::vector<uint8_t>> BytesAttribute(const Session& s, CK_OBJECT_HANDLE obj,
                                                    CK_ATTRIBUTE_TYPE type, const char* name) {
  CK_ATTRIBUTE a{type, nullptr, 0};
  if (CK_RV rv = s.fns()->C_GetAttributeValue(s.handle(), obj, &a, 1); rv != CKR_OK) {
    return CkError("C_GetAttributeValue", rv, name);
  }
  if (a.ulValueLen == CK_UNAVAILABLE_INFORMATION || a.ulValueLen > 4096) {
    return absl::FailedPreconditionError(
        absl::StrCat("PKCS#11: the key object's ", name, " is unavailable or implausibly long"));
  }
  std::vector<uint8_t> value(a.ulValueLen);
  a.pValue = value.data();
  if (CK_RV rv = s.fns()->C_GetAttributeValue(s.handle(), obj, &a, 1); rv != CKR_OK) {
    return CkError("C_GetAttributeValue", rv, name);
  }
  value.resize(a.ulValueLen);
  return value;
}

absl::StatusOr<CK_ULONG> UlongAttribute(const Session& s, CK_OBJECT_HANDLE obj,
                                        CK_ATTRIBUTE_TYPE type, const char* name) {
  auto v = BytesAttribute(s, obj, type, name);
  if (!v.ok()) return v.status();
  CK_ULONG out = 0;
  if (v->size() != sizeof out) {
    return absl::FailedPreconditionError(absl::StrCat("PKCS#11: ", name, " is not a CK_ULONG"));
  }
  std::memcpy(&out, v->data(), sizeof out);
  return out;
}

absl::StatusOr<bool> BoolAttribute(const Session& s, CK_OBJECT_HANDLE obj,
                                   CK_ATTRIBUTE_TYPE type, const char* name) {
  auto v = BytesAttribute(s, obj, type, name);
  if (!v.ok()) return v.status();
  if (v->size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat("PKCS#11: ", name, " is not a CK_BBOOL"));
  }
  return (*v)[0] != CK_FALSE;
}

// The objects of `cls` with the URI's label and id (those given).
absl::StatusOr<std::vector<CK_OBJECT_HANDLE>> FindObjects(
    const Session& s, CK_OBJECT_CLASS cls, const std::optional<std::string>& label,
    const std::optional<std::vector<uint8_t>>& id) {
  std::vector<CK_ATTRIBUTE> tmpl;
  tmpl.push_back({CKA_CLASS, &cls, sizeof cls});
  std::string label_copy = label.value_or("");
  std::vector<uint8_t> id_copy = id.value_or(std::vector<uint8_t>());
  if (label) tmpl.push_back({CKA_LABEL, label_copy.data(), label_copy.size()});
  if (id) tmpl.push_back({CKA_ID, id_copy.data(), id_copy.size()});
  CK_FUNCTION_LIST_PTR f = s.fns();
  if (CK_RV rv = f->C_FindObjectsInit(s.handle(), tmpl.data(), tmpl.size()); rv != CKR_OK) {
    return CkError("C_FindObjectsInit", rv);
  }
  std::vector<CK_OBJECT_HANDLE> found;
  CK_RV rv = CKR_OK;
  while (found.size() < 64) {  // enough to say "several"; a token never makes this unbounded
    CK_OBJECT_HANDLE batch[16];
    CK_ULONG n = 0;
    rv = f->C_FindObjects(s.handle(), batch, 16, &n);
    if (rv != CKR_OK || n == 0) break;
    found.insert(found.end(), batch, batch + std::min<CK_ULONG>(n, 16));
  }
  f->C_FindObjectsFinal(s.handle());
  if (rv != CKR_OK) return CkError("C_FindObjects", rv);
  return found;
}

// DER encodings of the curves' CKA_EC_PARAMS: the named-curve OIDs, and for Ed25519 also the
// printable-string form PKCS#11 3.0 allows.
constexpr uint8_t kP256Oid[] = {0x06, 0x08, 0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07};
constexpr uint8_t kEd25519Oid[] = {0x06, 0x03, 0x2b, 0x65, 0x70};
constexpr char kEd25519Name[] = "\x13\x0c" "edwards25519";
// SubjectPublicKeyInfo of a P-256 key up to the 65-byte uncompressed point.
constexpr uint8_t kP256SpkiPrefix[] = {0x30, 0x59, 0x30, 0x13, 0x06, 0x07, 0x2a, 0x86, 0x48,
                                       0xce, 0x3d, 0x02, 0x01, 0x06, 0x08, 0x2a, 0x86, 0x48,
                                       0xce, 0x3d, 0x03, 0x01, 0x07, 0x03, 0x42, 0x00};

bool Equals(const std::vector<uint8_t>& v, const void* p, size_t n) {
  return v.size() == n && std::memcmp(v.data(), p, n) == 0;
}

// CKA_EC_POINT is a DER OCTET STRING around the point; some tokens store the point bare.
std::vector<uint8_t> UnwrapPoint(const std::vector<uint8_t>& v, size_t point_size) {
  if (v.size() == point_size + 2 && v[0] == 0x04 && v[1] == point_size) {
    return {v.begin() + 2, v.end()};
  }
  return v;
}

class TokenSigner final : public Signer {
 public:
  TokenSigner(std::shared_ptr<Session> session, CK_OBJECT_HANDLE key, Pkcs11KeyType type)
      : session_(std::move(session)), key_(key), type_(type) {}

  absl::StatusOr<std::vector<uint8_t>> Sign(std::span<const uint8_t> message) const override {
    std::vector<uint8_t> input;
    CK_MECHANISM mech{CKM_EDDSA, nullptr, 0};
    if (type_ == Pkcs11KeyType::kEcdsaP256) {
      Digest d = Sha256Of(message);
      input.assign(d.begin(), d.end());
      mech.mechanism = CKM_ECDSA;
    } else {
      input.assign(message.begin(), message.end());
    }
    std::vector<uint8_t> sig(512);
    CK_ULONG len = sig.size();
    {
      // A session holds one operation at a time: signatures from several threads take turns.
      std::lock_guard<std::mutex> lock(mu_);
      CK_FUNCTION_LIST_PTR f = session_->fns();
      if (CK_RV rv = f->C_SignInit(session_->handle(), &mech, key_); rv != CKR_OK) {
        return CkError("C_SignInit", rv, absl::StrCat("token ", session_->token()));
      }
      if (CK_RV rv = f->C_Sign(session_->handle(), input.data(), input.size(), sig.data(), &len);
          rv != CKR_OK) {
        return CkError("C_Sign", rv, absl::StrCat("token ", session_->token()));
      }
    }
    if (len > sig.size()) return absl::DataLossError("PKCS#11 C_Sign: length past its buffer");
    sig.resize(len);
    if (type_ == Pkcs11KeyType::kEd25519) return sig;
    return RawToDer(sig);
  }

  absl::StatusOr<std::string> PrivateKeyPem() const override {
    return absl::FailedPreconditionError(absl::StrCat(
        "the key is on PKCS#11 token ", session_->token(), " and never leaves it"));
  }

 private:
  // CKM_ECDSA gives r||s, each as long as the order; verifiers read DER SEQUENCE {r, s}.
  static absl::StatusOr<std::vector<uint8_t>> RawToDer(const std::vector<uint8_t>& raw) {
    if (raw.size() != 64) {
      return absl::DataLossError(
          absl::StrCat("PKCS#11 C_Sign: a P-256 signature is 64 bytes, got ", raw.size()));
    }
    ECDSA_SIG* sig = ECDSA_SIG_new();
    BIGNUM* r = BN_bin2bn(raw.data(), 32, nullptr);
    BIGNUM* s = BN_bin2bn(raw.data() + 32, 32, nullptr);
    if (sig == nullptr || r == nullptr || s == nullptr || ECDSA_SIG_set0(sig, r, s) != 1) {
      BN_free(r);
      BN_free(s);
      ECDSA_SIG_free(sig);
      return absl::InternalError("ECDSA signature encoding failed");
    }
    unsigned char* der = nullptr;
    int n = i2d_ECDSA_SIG(sig, &der);
    ECDSA_SIG_free(sig);
    if (n <= 0) return absl::InternalError("ECDSA signature encoding failed");
    std::vector<uint8_t> out(der, der + n);
    OPENSSL_free(der);
    return out;
  }

  std::shared_ptr<Session> session_;
  const CK_OBJECT_HANDLE key_;
  const Pkcs11KeyType type_;
  mutable std::mutex mu_;
};

struct OpenedKey {
  std::shared_ptr<const Signer> signer;
  std::vector<uint8_t> point;  // the public key: Ed25519's 32 bytes, P-256's 65-byte point
  std::string where;           // "token T, object URI" for messages
};

// Opens the private key and its public half and checks the attributes that keep it on the token.
absl::StatusOr<OpenedKey> OpenKey(const Pkcs11Uri& uri, Pkcs11KeyType type,
                                  const Pkcs11Access& access) {
  auto session = OpenSession(uri, access, /*read_write=*/false);
  if (!session.ok()) return session.status();
  const Session& s = **session;
  const std::string where = absl::StrCat("token ", s.token(), ", ", Describe(uri));
  auto keys = FindObjects(s, CKO_PRIVATE_KEY, uri.object, uri.id);
  if (!keys.ok()) return keys.status();
  if (keys->empty()) {
    return absl::NotFoundError(absl::StrCat("PKCS#11: no private key object matches ", where));
  }
  if (keys->size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PKCS#11: ", keys->size(), " private key objects match ", where, "; add id= to the URI"));
  }
  const CK_OBJECT_HANDLE key = (*keys)[0];
  const bool ed = type == Pkcs11KeyType::kEd25519;
  auto key_type = UlongAttribute(s, key, CKA_KEY_TYPE, "CKA_KEY_TYPE");
  if (!key_type.ok()) return key_type.status();
  if (*key_type != (ed ? CKK_EC_EDWARDS : CKK_EC)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PKCS#11: ", where, " is not ", ed ? "an Ed25519 (CKK_EC_EDWARDS)" : "an EC (CKK_EC)",
        " key: ", ed ? "evidence records need Ed25519" : "model signatures need ECDSA P-256"));
  }
  auto params = BytesAttribute(s, key, CKA_EC_PARAMS, "CKA_EC_PARAMS");
  if (!params.ok()) return params.status();
  bool curve_ok = ed ? Equals(*params, kEd25519Oid, sizeof kEd25519Oid) ||
                           Equals(*params, kEd25519Name, sizeof kEd25519Name - 1)
                     : Equals(*params, kP256Oid, sizeof kP256Oid);
  if (!curve_ok) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PKCS#11: ", where, " is on another curve than ", ed ? "Ed25519" : "P-256"));
  }
  // The private key must stay on the token: refuse a key that could be read out, or was.
  auto extractable = BoolAttribute(s, key, CKA_EXTRACTABLE, "CKA_EXTRACTABLE");
  if (!extractable.ok()) return extractable.status();
  if (*extractable) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PKCS#11: extractable key refused: ", where, " has CKA_EXTRACTABLE=true, so its private "
        "key can leave the token; create one with `ckpt-audit keys generate --pkcs11`"));
  }
  auto sensitive = BoolAttribute(s, key, CKA_SENSITIVE, "CKA_SENSITIVE");
  if (!sensitive.ok()) return sensitive.status();
  if (!*sensitive) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PKCS#11: non-sensitive key refused: ", where, " has CKA_SENSITIVE=false, so its private "
        "key value can be read; create one with `ckpt-audit keys generate --pkcs11`"));
  }
  auto can_sign = BoolAttribute(s, key, CKA_SIGN, "CKA_SIGN");
  if (!can_sign.ok()) return can_sign.status();
  if (!*can_sign) {
    return absl::FailedPreconditionError(
        absl::StrCat("PKCS#11: ", where, " may not sign (CKA_SIGN=false)"));
  }
  // The public half: the public key object with the private key's id, else its label.
  auto key_id = BytesAttribute(s, key, CKA_ID, "CKA_ID");
  if (!key_id.ok()) return key_id.status();
  std::optional<std::vector<uint8_t>> pub_id;
  std::optional<std::string> pub_label;
  if (!key_id->empty()) {
    pub_id = *key_id;
  } else {
    auto label = BytesAttribute(s, key, CKA_LABEL, "CKA_LABEL");
    if (!label.ok()) return label.status();
    pub_label = std::string(label->begin(), label->end());
  }
  auto pubs = FindObjects(s, CKO_PUBLIC_KEY, pub_label, pub_id);
  if (!pubs.ok()) return pubs.status();
  if (pubs->size() != 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PKCS#11: ", where, ": ", pubs->size(), " public key objects share its ",
        pub_id ? "CKA_ID" : "CKA_LABEL", "; exactly one is needed to know its public key"));
  }
  auto point = BytesAttribute(s, (*pubs)[0], CKA_EC_POINT, "CKA_EC_POINT");
  if (!point.ok()) return point.status();
  OpenedKey out;
  out.point = UnwrapPoint(*point, ed ? 32 : 65);
  out.signer = std::make_shared<TokenSigner>(*std::move(session), key, type);
  out.where = where;
  return out;
}

// The public key object could be anyone's: sign a probe and verify it before trusting it.
template <typename PublicKeyT>
absl::Status CheckPair(const Signer& signer, const PublicKeyT& pub, const std::string& where) {
  static constexpr char kProbe[] = "ckpt-audit pkcs11 key pair check";
  std::span<const uint8_t> probe(reinterpret_cast<const uint8_t*>(kProbe), sizeof kProbe - 1);
  auto sig = signer.Sign(probe);
  if (!sig.ok()) return sig.status();
  if (!pub.Verify(probe, *sig)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PKCS#11: ", where, ": the public key object beside it does not verify its signature"));
  }
  return absl::OkStatus();
}

// Every token signature is verified with the key's public half before anyone sees it: a token
// that returns a wrong signature (a fault, a lying module) fails the signing (DATA_LOSS), so
// nothing that does not verify is ever stored or written.
template <typename PublicKeyT>
class VerifiedSigner final : public Signer {
 public:
  VerifiedSigner(std::shared_ptr<const Signer> token, PublicKeyT pub, std::string where)
      : token_(std::move(token)), pub_(std::move(pub)), where_(std::move(where)) {}

  absl::StatusOr<std::vector<uint8_t>> Sign(std::span<const uint8_t> message) const override {
    auto sig = token_->Sign(message);
    if (!sig.ok()) return sig.status();
    if (!pub_.Verify(message, *sig)) {
      return absl::DataLossError(absl::StrCat("PKCS#11: ", where_, ": the token's signature does "
                                              "not verify with its public key; not used"));
    }
    return sig;
  }
  absl::StatusOr<std::string> PrivateKeyPem() const override { return token_->PrivateKeyPem(); }

 private:
  const std::shared_ptr<const Signer> token_;
  const PublicKeyT pub_;
  const std::string where_;
};

}  // namespace

absl::StatusOr<SigningKey> OpenPkcs11Ed25519Key(const Pkcs11Uri& uri,
                                                const Pkcs11Access& access) {
  auto opened = OpenKey(uri, Pkcs11KeyType::kEd25519, access);
  if (!opened.ok()) return opened.status();
  auto pub = PublicKey::FromRaw(opened->point);
  if (!pub.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("PKCS#11: ", opened->where, ": CKA_EC_POINT: ", pub.status().message()));
  }
  if (auto s = CheckPair(*opened->signer, *pub, opened->where); !s.ok()) return s;
  return SigningKey(
      std::make_shared<VerifiedSigner<PublicKey>>(opened->signer, *pub, opened->where), *pub);
}

absl::StatusOr<EcdsaSigningKey> OpenPkcs11EcdsaKey(const Pkcs11Uri& uri,
                                                   const Pkcs11Access& access) {
  auto opened = OpenKey(uri, Pkcs11KeyType::kEcdsaP256, access);
  if (!opened.ok()) return opened.status();
  std::vector<uint8_t> spki(kP256SpkiPrefix, kP256SpkiPrefix + sizeof kP256SpkiPrefix);
  spki.insert(spki.end(), opened->point.begin(), opened->point.end());
  auto pub = opened->point.size() == 65
                 ? EcdsaPublicKey::FromDer(spki)
                 : absl::StatusOr<EcdsaPublicKey>(absl::InvalidArgumentError(absl::StrCat(
                       "a P-256 point is 65 bytes, got ", opened->point.size())));
  if (!pub.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("PKCS#11: ", opened->where, ": CKA_EC_POINT: ", pub.status().message()));
  }
  if (auto s = CheckPair(*opened->signer, *pub, opened->where); !s.ok()) return s;
  return EcdsaSigningKey(
      std::make_shared<VerifiedSigner<EcdsaPublicKey>>(opened->signer, *pub, opened->where), *pub);
}

absl::Status GeneratePkcs11Key(const Pkcs11Uri& uri, Pkcs11KeyType type,
                               const Pkcs11Access& access) {
  if (!uri.object.has_value()) {
    return absl::InvalidArgumentError(
        "PKCS#11: keys generate --pkcs11 needs object=LABEL in the URI (the new key's label)");
  }
  auto session = OpenSession(uri, access, /*read_write=*/true);
  if (!session.ok()) return session.status();
  const Session& s = **session;
  // Never a second key under the same name: the open would then refuse both, or pick the wrong one.
  for (CK_OBJECT_CLASS cls : {CKO_PRIVATE_KEY, CKO_PUBLIC_KEY}) {
    for (bool by_id : {false, true}) {
      if (by_id && !uri.id) continue;
      auto found = FindObjects(s, cls, by_id ? std::nullopt : uri.object,
                               by_id ? uri.id : std::nullopt);
      if (!found.ok()) return found.status();
      if (!found->empty()) {
        return absl::AlreadyExistsError(absl::StrCat(
            "PKCS#11: token ", s.token(), " already holds a key object with ",
            by_id ? "this id" : absl::StrCat("label ", *uri.object), "; not replacing it"));
      }
    }
  }
  const bool ed = type == Pkcs11KeyType::kEd25519;
  std::vector<uint8_t> params =
      ed ? std::vector<uint8_t>(kEd25519Oid, kEd25519Oid + sizeof kEd25519Oid)
         : std::vector<uint8_t>(kP256Oid, kP256Oid + sizeof kP256Oid);
  std::string label = *uri.object;
  std::vector<uint8_t> id = uri.id.value_or(std::vector<uint8_t>());
  CK_BBOOL yes = CK_TRUE, no = CK_FALSE;
  std::vector<CK_ATTRIBUTE> pub = {
      {CKA_TOKEN, &yes, sizeof yes},
      {CKA_VERIFY, &yes, sizeof yes},
      {CKA_EC_PARAMS, params.data(), params.size()},
      {CKA_LABEL, label.data(), label.size()},
  };
  std::vector<CK_ATTRIBUTE> priv = {
      {CKA_TOKEN, &yes, sizeof yes},       {CKA_PRIVATE, &yes, sizeof yes},
      {CKA_SENSITIVE, &yes, sizeof yes},   {CKA_EXTRACTABLE, &no, sizeof no},
      {CKA_SIGN, &yes, sizeof yes},        {CKA_LABEL, label.data(), label.size()},
  };
  if (!id.empty()) {
    pub.push_back({CKA_ID, id.data(), id.size()});
    priv.push_back({CKA_ID, id.data(), id.size()});
  }
  CK_MECHANISM mech{ed ? CKM_EC_EDWARDS_KEY_PAIR_GEN : CKM_EC_KEY_PAIR_GEN, nullptr, 0};
  CK_OBJECT_HANDLE pub_handle = CK_INVALID_HANDLE, priv_handle = CK_INVALID_HANDLE;
  if (CK_RV rv = s.fns()->C_GenerateKeyPair(s.handle(), &mech, pub.data(), pub.size(),
                                            priv.data(), priv.size(), &pub_handle, &priv_handle);
      rv != CKR_OK) {
    return CkError("C_GenerateKeyPair", rv, absl::StrCat("token ", s.token()));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::evidence
