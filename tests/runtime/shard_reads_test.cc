// Exact shard reads from a mapped file (src/runtime/shard_reads.h): the pages a process's shards
// cover, checked against every element's address, and a file read through the advice with only
// those pages made resident. Set FERRY_TEST_SEED to replay the random cases.
#include "src/runtime/shard_reads.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <random>
#include <set>
#include <string>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "gtest/gtest.h"

namespace ferry::internal {
namespace {

// The pages of every element that `parts` select, one element at a time, as ranges.
std::vector<PageRange> PagesOfEveryElement(const HostView& view,
                                           const std::vector<ShardIndex>& parts, uintptr_t page) {
  std::set<uintptr_t> pages;
  const int64_t rank = view.rank();
  for (const ShardIndex& index : parts) {
    int64_t count = 1;
    for (const DimRange& range : index) count *= range.size();
    std::vector<int64_t> position(static_cast<size_t>(rank), 0);
    for (int64_t i = 0; i < count; ++i) {
      auto address = reinterpret_cast<uintptr_t>(view.data);
      for (int64_t d = 0; d < rank; ++d) {
        address += static_cast<uintptr_t>((index[d].begin + position[d]) * view.byte_strides[d]);
      }
      for (uintptr_t byte = address; byte < address + view.element_size(); byte += 1) {
        pages.insert(byte / page);
      }
      for (int64_t d = rank - 1; d >= 0; --d) {
        if (++position[d] < index[d].size()) break;
        position[d] = 0;
      }
    }
  }
  std::vector<PageRange> ranges;
  for (uintptr_t p : pages) {
    if (!ranges.empty() && ranges.back().end == p * page) {
      ranges.back().end += page;
    } else {
      ranges.push_back({p * page, (p + 1) * page});
    }
  }
  return ranges;
}

uint64_t Seed() {
  if (const char* text = std::getenv("FERRY_TEST_SEED")) return std::strtoull(text, nullptr, 0);
  return std::random_device{}();
}

TEST(ShardReadsTest, RandomPartsCoverExactlyThePagesOfTheirElements) {
  const uint64_t seed = Seed();
  std::cout << "seed: " << seed << " (set FERRY_TEST_SEED to replay)\n";
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  const DType dtypes[] = {DType::kU8, DType::kBF16, DType::kF32, DType::kF64, DType::kC128};
  const uintptr_t pages[] = {8, 64, 256, 4096};
  for (int trial = 0; trial < 400; ++trial) {
    const DType dtype = dtypes[rng() % 5];
    const uintptr_t page = pages[rng() % 4];
    Dims dims;
    const int rank = static_cast<int>(rng() % 5);
    for (int d = 0; d < rank; ++d) dims.push_back(static_cast<int64_t>(1 + rng() % 9));
    // Addresses only (never read): any element-aligned start, in or across pages.
    const auto base = static_cast<uintptr_t>((1 << 20) + (rng() % 300) * DTypeSize(dtype));
    const HostView view = HostView::Dense(reinterpret_cast<const void*>(base), dtype, dims);
    std::vector<ShardIndex> parts;
    const int count = 1 + static_cast<int>(rng() % 3);
    for (int p = 0; p < count; ++p) {
      ShardIndex index;
      for (int d = 0; d < rank; ++d) {
        if (rng() % 3 == 0) {  // whole, as an unsplit dim
          index.push_back({0, dims[d]});
        } else {
          const int64_t begin = static_cast<int64_t>(rng() % dims[d]);
          index.push_back({begin, begin + 1 + static_cast<int64_t>(rng() % (dims[d] - begin))});
        }
      }
      parts.push_back(index);
    }
    SCOPED_TRACE(::testing::Message()
                 << "trial " << trial << ": " << view.DebugString() << ", page " << page);
    EXPECT_EQ(ShardPageRanges(view, parts, page), PagesOfEveryElement(view, parts, page));
  }
}

TEST(ShardReadsTest, ASplitOfWideRowsIsOneRangePerRowAndOfNarrowRowsOneRange) {
  const auto base = static_cast<uintptr_t>(1) << 24;  // page-aligned
  // 8 rows of 16 KiB; columns 0-2047 are the first 8 KiB of each row: 8 ranges of 2 pages.
  const HostView wide =
      HostView::Dense(reinterpret_cast<const void*>(base), DType::kF32, {8, 4096});
  const std::vector<PageRange> left = ShardPageRanges(wide, {{{0, 8}, {0, 2048}}}, 4096);
  ASSERT_EQ(left.size(), 8u);
  for (size_t row = 0; row < 8; ++row) {
    EXPECT_EQ(left[row], (PageRange{base + row * 16384, base + row * 16384 + 8192}));
  }
  // Two local parts (two devices of this process) next to each other: their runs join.
  EXPECT_EQ(ShardPageRanges(wide, {{{0, 8}, {2048, 3072}}, {{0, 8}, {0, 2048}}}, 4096).size(), 8u);
  EXPECT_EQ(ShardPageRanges(wide, {{{0, 8}, {0, 2048}}, {{0, 8}, {2048, 4096}}}, 4096),
            (std::vector<PageRange>{{base, base + 8 * 16384}}));
  // Rows of 256 bytes: every page holds rows of every shard, so a column split reads them all.
  const HostView narrow =
      HostView::Dense(reinterpret_cast<const void*>(base), DType::kF32, {64, 64});
  EXPECT_EQ(ShardPageRanges(narrow, {{{0, 64}, {32, 64}}}, 4096),
            (std::vector<PageRange>{{base, base + 16384}}));
  // Not row-major: no ranges (the caller leaves the kernel's read-around alone).
  HostView transposed = wide;
  std::swap(transposed.dims[0], transposed.dims[1]);
  std::swap(transposed.byte_strides[0], transposed.byte_strides[1]);
  EXPECT_TRUE(ShardPageRanges(transposed, {{{0, 2048}, {0, 8}}}, 4096).empty());
}

// A file of 64 rows of 64 KiB, dropped from the page cache, mapped; a quarter of its columns read
// through the strided copy after the advice: exactly the pages of those columns are resident.
TEST(ShardReadsTest, ReadingAStridedShardOfAMappedFileMakesOnlyItsPagesResident) {
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const Dims dims = {64, 16384};
  const size_t size = 64 * 16384 * sizeof(float);
  char path[] = "/tmp/ferry_shard_reads_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  unlink(path);
  std::vector<float> values(size / sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000003);
  ASSERT_EQ(write(fd, values.data(), size), static_cast<ssize_t>(size));
  fdatasync(fd);  // dirty pages cannot be dropped
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  void* mapped = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  ASSERT_NE(mapped, MAP_FAILED);
  std::vector<unsigned char> resident(size / page);
  const auto resident_pages = [&] {
    EXPECT_EQ(mincore(mapped, size, resident.data()), 0);
    std::set<uintptr_t> pages;
    for (size_t p = 0; p < resident.size(); ++p) {
      if (resident[p] & 1) pages.insert(reinterpret_cast<uintptr_t>(mapped) + p * page);
    }
    return pages;
  };
  if (!resident_pages().empty()) {
    munmap(mapped, size);
    GTEST_SKIP() << "the file stays in memory after posix_fadvise(DONTNEED) (tmpfs?): reads "
                    "cannot be observed";
  }
  const HostView view = HostView::Dense(mapped, DType::kF32, dims);
  const ShardIndex part = {{0, 64}, {4096, 8192}};
  const std::vector<PageRange> ranges = ShardPageRanges(view, {part}, page);
  ASSERT_TRUE(AdviseExactReads(view, ranges, page));
  const HostView shard = SubView(view, part);
  HostTensor copy = HostTensor::Allocate(DType::kF32, shard.dims).value();
  ASSERT_TRUE(CopyConvert(shard, copy.mutable_view()).ok());
  const auto* copied = reinterpret_cast<const float*>(copy.data());
  EXPECT_EQ(copied[0], values[4096]);
  EXPECT_EQ(copied[4096 * 63 + 4095], values[16384 * 63 + 8191]);

  std::set<uintptr_t> expected;
  for (const PageRange& range : ranges) {
    for (uintptr_t p = range.begin; p < range.end; p += page) expected.insert(p);
  }
  EXPECT_EQ(expected.size(), 64 * 16384 / page);  // a quarter of the file: 16 KiB of each row
  const std::set<uintptr_t> read = resident_pages();
  size_t outside = 0;
  for (uintptr_t p : read) outside += expected.count(p) == 0 ? 1 : 0;
  EXPECT_EQ(outside, 0u) << "pages read outside the shard's own pages, of " << read.size();
  EXPECT_EQ(read.size(), expected.size());
  munmap(mapped, size);
}

}  // namespace
}  // namespace ferry::internal
