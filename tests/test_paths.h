// Where tests find the source tree, its fixture data and the build's binaries. The paths live in
// one generated file (tests/test_paths.cc.in, filled in by CMake), not in any test's compile
// command, so that the same test compiles to the same command in every clone and a compiler
// cache serves a fresh clone (docs/PERFORMANCE.md, "Build").
#ifndef CKPT_TESTS_TEST_PATHS_H_
#define CKPT_TESTS_TEST_PATHS_H_

namespace ckpt::testing {

extern const char kSourceDir[];    // the checkout
extern const char kTestDataDir[];  // kSourceDir/tests/data
extern const char kBinaryDir[];    // the build folder

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TEST_PATHS_H_
