#include "core/evidence/key_file.h"

#include <fcntl.h>
#include <openssl/pem.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/io/fd.h"
#include "core/io/small_file.h"

namespace ckpt::evidence {
namespace {

using io::Fd;

constexpr size_t kMaxKeyFile = 1 << 20;

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};

std::string PemOf(EVP_PKEY* pkey, bool private_key) {
  std::unique_ptr<BIO, BioDeleter> bio(BIO_new(BIO_s_mem()));
  if (private_key) {
    PEM_write_bio_PrivateKey(bio.get(), pkey, nullptr, nullptr, 0, nullptr, nullptr);
  } else {
    PEM_write_bio_PUBKEY(bio.get(), pkey);
  }
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

}  // namespace

absl::StatusOr<std::string> ReadPrivateKeyFile(const std::string& path) {
  io::SmallFileRules rules;
  rules.what = "private key";
  rules.max_bytes = kMaxKeyFile;
  rules.forbidden_mode = 077;
  rules.follow_link = true;  // Kubernetes secret volumes mount each key as a link
  return io::ReadSmallFile(path, rules);
}

absl::Status WritePrivateKeyFile(const std::string& path, const std::string& pem) {
  Fd f(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (f.get() < 0) {
    if (errno == EEXIST) return absl::AlreadyExistsError(absl::StrCat(path, ": already exists"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  }
  ::fchmod(f.get(), 0600);  // the umask may have narrowed it further, never widened; be exact
  size_t put = 0;
  while (put < pem.size()) {
    ssize_t n = ::write(f.get(), pem.data() + put, pem.size() - put);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::DataLossError(absl::StrCat(path, ": write failed"));
    put += static_cast<size_t>(n);
  }
  if (::fsync(f.get()) != 0) return absl::DataLossError(absl::StrCat(path, ": fsync failed"));
  return absl::OkStatus();
}

std::string PrivateKeyPem(EVP_PKEY* pkey) { return PemOf(pkey, true); }
std::string PublicKeyPem(EVP_PKEY* pkey) { return PemOf(pkey, false); }

}  // namespace ckpt::evidence
