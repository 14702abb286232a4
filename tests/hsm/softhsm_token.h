// A SoftHSM2 token for tests (docs/evidence.md, "Keys in an HSM"): its own SOFTHSM2_CONF and
// token directory under a test's temporary directory, and a direct C API session for making
// objects ckpt-audit would never make.
#ifndef CKPT_TESTS_HSM_SOFTHSM_TOKEN_H_
#define CKPT_TESTS_HSM_SOFTHSM_TOKEN_H_

#include <dlfcn.h>
#include <p11-kit/pkcs11.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "tests/test_util.h"

namespace ckpt::testing {

inline constexpr char kToken[] = "ckpt-test";
inline constexpr char kPin[] = "314159";

inline bool SoftHsmInstalled() { return std::filesystem::exists(CKPT_SOFTHSM_MODULE); }

// Points SOFTHSM2_CONF (inherited by child processes) at a configuration under `dir` and
// initializes token kToken there with user PIN kPin. Returns whether softhsm2-util succeeded.
inline bool InitSoftHsmToken(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir / "tokens");
  WriteAll(dir / "softhsm2.conf", "directories.tokendir = " + (dir / "tokens").string() +
                                      "\nobjectstore.backend = file\nlog.level = ERROR\n");
  ::setenv("SOFTHSM2_CONF", (dir / "softhsm2.conf").c_str(), 1);
  std::string cmd = std::string("softhsm2-util --init-token --free --label ") + kToken +
                    " --pin " + kPin + " --so-pin 27182818 > /dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// A logged-in read-write session on kToken through SoftHSM's own C API. Only one user of the
// module may be initialized in a process at a time: let this go before ckpt-audit's code opens
// a key in the same process.
class TokenSession {
 public:
  TokenSession() {
    lib_ = ::dlopen(CKPT_SOFTHSM_MODULE, RTLD_NOW | RTLD_LOCAL);
    if (lib_ == nullptr) return;
    auto get = reinterpret_cast<CK_C_GetFunctionList>(::dlsym(lib_, "C_GetFunctionList"));
    if (get == nullptr || get(&f_) != CKR_OK || f_->C_Initialize(nullptr) != CKR_OK) {
      f_ = nullptr;
      return;
    }
    CK_SLOT_ID slots[8];
    CK_ULONG n = 8;
    if (f_->C_GetSlotList(CK_TRUE, slots, &n) != CKR_OK) return;
    for (CK_ULONG i = 0; i < n && s_ == CK_INVALID_HANDLE; ++i) {
      CK_TOKEN_INFO info;
      if (f_->C_GetTokenInfo(slots[i], &info) != CKR_OK) continue;
      if (std::string(reinterpret_cast<char*>(info.label), sizeof info.label).rfind(kToken, 0) ==
          0) {
        f_->C_OpenSession(slots[i], CKF_SERIAL_SESSION | CKF_RW_SESSION, nullptr, nullptr, &s_);
      }
    }
    std::string pin = kPin;
    if (s_ != CK_INVALID_HANDLE &&
        f_->C_Login(s_, CKU_USER, reinterpret_cast<CK_UTF8CHAR_PTR>(pin.data()), pin.size()) ==
            CKR_OK) {
      ok_ = true;
    }
  }
  ~TokenSession() {
    if (s_ != CK_INVALID_HANDLE) f_->C_CloseSession(s_);
    if (f_ != nullptr) f_->C_Finalize(nullptr);
    if (lib_ != nullptr) ::dlclose(lib_);
  }
  TokenSession(const TokenSession&) = delete;
  TokenSession& operator=(const TokenSession&) = delete;

  bool ok() const { return ok_; }
  CK_FUNCTION_LIST_PTR f() const { return f_; }
  CK_SESSION_HANDLE s() const { return s_; }

  // The one object of `cls` labelled `label`, or CK_INVALID_HANDLE.
  CK_OBJECT_HANDLE Find(CK_OBJECT_CLASS cls, const std::string& label) const {
    std::string name = label;
    CK_ATTRIBUTE tmpl[] = {{CKA_CLASS, &cls, sizeof cls}, {CKA_LABEL, name.data(), name.size()}};
    CK_OBJECT_HANDLE found[2];
    CK_ULONG n = 0;
    if (f_->C_FindObjectsInit(s_, tmpl, 2) != CKR_OK) return CK_INVALID_HANDLE;
    f_->C_FindObjects(s_, found, 2, &n);
    f_->C_FindObjectsFinal(s_);
    return n == 1 ? found[0] : CK_INVALID_HANDLE;
  }

 private:
  void* lib_ = nullptr;
  CK_FUNCTION_LIST_PTR f_ = nullptr;
  CK_SESSION_HANDLE s_ = CK_INVALID_HANDLE;
  bool ok_ = false;
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_HSM_SOFTHSM_TOKEN_H_
