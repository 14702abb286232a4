// A PKCS#11 module for tests that forwards every call to SoftHSM2 and appends one line per
// C_Login to the file named by $CKPT_TEST_LOGIN_LOG, so a test can count the PIN attempts
// ckpt-audit made (SoftHSM records only that an attempt failed, not how many).
#include <dlfcn.h>
#include <p11-kit/pkcs11.h>

#include <cstdio>
#include <cstdlib>

namespace {

CK_FUNCTION_LIST g_wrapped;
CK_C_Login g_real_login = nullptr;

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
  g_wrapped.C_Login = CountingLogin;
  *list = &g_wrapped;
  return CKR_OK;
}
