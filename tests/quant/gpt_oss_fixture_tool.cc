// gpt-oss-fixture: makes the mini gpt-oss fixtures and dumps decoded values for the device check
// (tests/data/FIXTURES.md "mini-gpt-oss-*", tests/gpu/gpt_oss_transformers_check.py).
//
//   gpt-oss-fixture write OUTDIR
//       OUTDIR/mini-gpt-oss-mxfp4 (transformers' layout), OUTDIR/mini-gpt-oss-modelopt-nvfp4
//       (its lossless ModelOpt NVFP4 export) and OUTDIR/mini-gpt-oss-modelopt-lossy (ModelOpt's
//       k_max rule); OUTDIR must exist, the three must not.
//   gpt-oss-fixture dump ROOT OUT.safetensors
//       every expert tensor of ROOT decoded to F32 [E, fused rows, input columns].
#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/quant/gpt_oss_fixture.h"

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "gpt-oss-fixture: %s\n", s.ToString().c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace ckpt::quant::testing;
  namespace fs = std::filesystem;
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "write" && argc == 3) {
    const fs::path out = argv[2];
    const std::string src = (out / "mini-gpt-oss-mxfp4").string();
    if (absl::Status s = WriteGptOssMxfp4Fixture(src); !s.ok()) return Fail(s);
    for (const auto& [name, cast] :
         {std::pair{"mini-gpt-oss-modelopt-nvfp4", ModelOptCast::kLossless},
          std::pair{"mini-gpt-oss-modelopt-lossy", ModelOptCast::kModelOptRule}}) {
      if (absl::Status s = WriteGptOssModelOpt(src, (out / name).string(), cast); !s.ok()) {
        return Fail(s);
      }
    }
    return 0;
  }
  if (cmd == "dump" && argc == 4) {
    if (absl::Status s = DumpGptOssValues(argv[2], argv[3]); !s.ok()) return Fail(s);
    return 0;
  }
  std::fprintf(stderr, "usage: gpt-oss-fixture write OUTDIR | dump ROOT OUT.safetensors\n");
  return 2;
}
