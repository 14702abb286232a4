// core/io/page_buffer.h: large buffers are returned to the kernel when freed (their pages are
// no longer mapped); small and empty ones are valid; moves hand the buffer over; the pool
// hands a freed mapping to the next buffer of its size and keeps no more than its capacity.
#include "core/io/page_buffer.h"

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::io {
namespace {

using ::ckpt::testing::IsMapped;

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

TEST(PageBufferPool, AFreedMappingServesTheNextBufferOfItsSize) {
  PageBufferPool pool(8 << 20, 1 << 20);
  PageBuffer a = pool.Take((3 << 20) - 100);
  ASSERT_TRUE(a.mapped());
  EXPECT_EQ(a.size(), PageBuffer::MappedSize((3 << 20) - 100));
  const void* at = a.get();
  pool.Give(std::move(a));
  EXPECT_EQ(pool.kept_bytes(), PageBuffer::MappedSize((3 << 20) - 100));
  PageBuffer other = pool.Take(2 << 20);  // another size: a new mapping
  EXPECT_NE(other.get(), at);
  PageBuffer again = pool.Take(3 << 20);  // the same number of pages
  EXPECT_EQ(again.get(), at);
  EXPECT_EQ(pool.kept_bytes(), 0u);
}

TEST(PageBufferPool, KeepsNoMoreThanItsCapacityAndUnmapsTheOldest) {
  PageBufferPool pool(5 << 20, 1 << 20);
  PageBuffer first = pool.Take(2 << 20), second = pool.Take(2 << 20), third = pool.Take(2 << 20);
  const void* oldest = first.get();
  const void* newest = third.get();
  pool.Give(std::move(first));
  pool.Give(std::move(second));
  pool.Give(std::move(third));  // 6 MiB given, 5 MiB kept at most: the first goes
  EXPECT_EQ(pool.kept_bytes(), 4u << 20);
  EXPECT_FALSE(IsMapped(oldest));
  EXPECT_TRUE(IsMapped(newest));
  pool.Give(PageBuffer(100, 1 << 20));  // from new: freed, never kept
  pool.Give(pool.Take(6 << 20));        // over the capacity: unmapped
  EXPECT_EQ(pool.kept_bytes(), 4u << 20);
}

// What the pool keeps is unmapped with it (the stream's pool ends with its stream; checked here,
// on one thread, where no other mapping can take a freed address in between).
TEST(PageBufferPool, UnmapsWhatItKeepsWhenItEnds) {
  const void* kept = nullptr;
  {
    PageBufferPool pool(8 << 20, 1 << 20);
    PageBuffer b = pool.Take(2 << 20);
    kept = b.get();
    pool.Give(std::move(b));
    EXPECT_EQ(pool.kept_bytes(), 2u << 20);
    EXPECT_TRUE(IsMapped(kept));
  }
  EXPECT_FALSE(IsMapped(kept));
}

}  // namespace
}  // namespace ckpt::io
