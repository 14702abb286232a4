// A PKCS#11 module for tests that forwards every call to SoftHSM2, with two test hooks:
// - one line per C_Login appended to the file named by $CKPT_TEST_LOGIN_LOG, so a test can count
//   the PIN attempts ckpt-audit made (SoftHSM records only that an attempt failed, not how many);
// - $CKPT_TEST_SIGN_FAULT="N:KIND" makes the N-th C_Sign of the process (from 1) and every later
//   one go wrong: KIND "flip" returns SoftHSM's signature with one bit changed (a faulty or lying
//   token), "removed" returns CKR_DEVICE_REMOVED (the token pulled mid-run).
#include <dlfcn.h>
#include <p11-kit/pkcs11.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

CK_FUNCTION_LIST g_wrapped;
CK_C_Login g_real_login = nullptr;
CK_C_Sign g_real_sign = nullptr;
std::atomic<unsigned long> g_signs{0};

CK_RV CountingLogin(CK_SESSION_HANDLE session, CK_USER_TYPE user, CK_UTF8CHAR_PTR pin,
                    CK_ULONG pin_len) {
  if (const char* path = std::getenv("CKPT_TEST_LOGIN_LOG"); path != nullptr) {
    if (FILE* f = std::fopen(path, "a"); f != nullptr) {
      std::fputs("C_Login\n", f);
      std::fclose(f);
    }
  }
  return g_real_login(session, user, pin, pin_len);
}

CK_RV FaultySign(CK_SESSION_HANDLE session, CK_BYTE_PTR data, CK_ULONG data_len, CK_BYTE_PTR sig,
                 CK_ULONG_PTR sig_len) {
  CK_RV rv = g_real_sign(session, data, data_len, sig, sig_len);
  if (sig == nullptr) return rv;  // a length query is not a signature
  const unsigned long n = ++g_signs;
  const char* fault = std::getenv("CKPT_TEST_SIGN_FAULT");
  char* kind = nullptr;
  const unsigned long from = fault != nullptr ? std::strtoul(fault, &kind, 10) : 0;
  if (rv != CKR_OK || from == 0 || n < from || *kind != ':') return rv;
  if (std::strcmp(kind + 1, "removed") == 0) return CKR_DEVICE_REMOVED;
  if (std::strcmp(kind + 1, "flip") == 0 && *sig_len > 0) sig[*sig_len / 2] ^= 0x01;
  return rv;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) CK_RV C_GetFunctionList(
    CK_FUNCTION_LIST_PTR_PTR list) {
  void* real = ::dlopen(CKPT_SOFTHSM_MODULE, RTLD_NOW | RTLD_LOCAL);
  if (real == nullptr) return CKR_GENERAL_ERROR;
  auto get = reinterpret_cast<CK_C_GetFunctionList>(::dlsym(real, "C_GetFunctionList"));
  CK_FUNCTION_LIST_PTR fns = nullptr;
  if (get == nullptr || get(&fns) != CKR_OK || fns == nullptr) return CKR_GENERAL_ERROR;
  g_wrapped = *fns;
  g_real_login = fns->C_Login;
  g_real_sign = fns->C_Sign;
  g_wrapped.C_Login = CountingLogin;
  g_wrapped.C_Sign = FaultySign;
  *list = &g_wrapped;
  return CKR_OK;
}
