// core/io/page_buffer.h: large buffers are returned to the kernel when freed (their pages are
// no longer mapped); small and empty ones are valid; moves hand the buffer over.
#include "core/io/page_buffer.h"

#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace ckpt::io {
namespace {

// Whether some mapping of this process holds `p` (/proc/self/maps).
bool IsMapped(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    std::istringstream range(line);
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    range >> std::hex >> begin >> dash >> end;
    if (begin <= at && at < end) return true;
  }
  return false;
}

TEST(PageBuffer, LargeBuffersAreMappingsUnmappedWhenFreed) {
  PageBuffer b(3 << 20, 1 << 20);
  ASSERT_TRUE(b);
  const void* at = b.get();
  b.get()[0] = 1;
  b.get()[(3 << 20) - 1] = 2;
  EXPECT_TRUE(IsMapped(at));
  PageBuffer moved = std::move(b);
  EXPECT_FALSE(b);
  EXPECT_EQ(moved.get(), at);
  moved.reset();
  EXPECT_FALSE(moved);
  EXPECT_FALSE(IsMapped(at));
}

TEST(PageBuffer, SmallAndEmptyBuffersComeFromNew) {
  PageBuffer small(100, 1 << 20);
  ASSERT_TRUE(small);
  small.get()[99] = 7;
  PageBuffer empty(0, 1 << 20);  // one byte: a valid pointer for an empty tensor
  EXPECT_TRUE(empty);
  small = std::move(empty);
  EXPECT_TRUE(small);
  EXPECT_FALSE(empty);
}

}  // namespace
}  // namespace ckpt::io
