// PrefaultForWriting (ferry/core/prefault.h): fresh pages are faulted in and keep their bytes,
// memory written before, small ranges, partial pages, read-only memory and FERRY_HOST_PREFAULT=off
// are left alone; CopyConvertPlan prefaults a dense destination and only a dense one.
#include "ferry/core/prefault.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "ferry/core/metrics.h"
#include "ferry/core/settings.h"

namespace ferry {
namespace {

constexpr int64_t kRangeBytes = int64_t{4} << 20;

int64_t PageBytes() { return sysconf(_SC_PAGESIZE); }

// A fresh private anonymous mapping (no page resident), without huge pages so that residency is
// counted page by page; unmapped at the end of the test.
class FreshMapping {
 public:
  explicit FreshMapping(int64_t size, int protection = PROT_READ | PROT_WRITE) : size_(size) {
    void* memory =
        mmap(nullptr, static_cast<size_t>(size), protection, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory != MAP_FAILED) {
      data_ = static_cast<std::byte*>(memory);
      madvise(data_, static_cast<size_t>(size), MADV_NOHUGEPAGE);
    }
  }
  ~FreshMapping() {
    if (data_ != nullptr) munmap(data_, static_cast<size_t>(size_));
  }
  FreshMapping(const FreshMapping&) = delete;
  FreshMapping& operator=(const FreshMapping&) = delete;

  std::byte* data() const { return data_; }

  // Whether each page of [offset, offset + size) is resident (offset and size page multiples).
  std::vector<bool> Resident(int64_t offset, int64_t size) const {
    std::vector<unsigned char> bits(static_cast<size_t>(size / PageBytes()));
    EXPECT_EQ(mincore(data_ + offset, static_cast<size_t>(size), bits.data()), 0);
    std::vector<bool> resident;
    for (unsigned char b : bits) resident.push_back((b & 1) != 0);
    return resident;
  }
  int64_t ResidentPages() const {
    int64_t count = 0;
    for (bool page : Resident(0, size_)) count += page ? 1 : 0;
    return count;
  }

 private:
  std::byte* data_ = nullptr;
  int64_t size_;
};

class PrefaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!KernelCanPrefault()) {
      GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14 and later have it): "
                      "PrefaultForWriting does nothing here";
    }
    // Whatever the environment says (FERRY_HOST_PREFAULT=off would leave everything alone).
    ASSERT_TRUE(SetSetting("FERRY_HOST_PREFAULT", "on").ok());
  }
  void TearDown() override { ASSERT_TRUE(ClearSetting("FERRY_HOST_PREFAULT").ok()); }
};

TEST_F(PrefaultTest, FaultsInFreshPagesAndKeepsEveryByte) {
  FreshMapping memory(kRangeBytes);
  ASSERT_NE(memory.data(), nullptr);
  // Two pages written before (one in the first MiB, one in the third), the rest fresh.
  const int64_t page = PageBytes();
  std::memset(memory.data() + 3 * page, 0x5a, static_cast<size_t>(page));
  std::memset(memory.data() + (int64_t{2} << 20) + page, 0xa5, static_cast<size_t>(page));
  ASSERT_EQ(memory.ResidentPages(), 2);

  const int64_t counted_before = metrics::HostBytesPrefaulted()->Value();
  EXPECT_EQ(PrefaultForWriting(memory.data(), kRangeBytes), kRangeBytes);
  EXPECT_EQ(metrics::HostBytesPrefaulted()->Value() - counted_before, kRangeBytes);
  EXPECT_EQ(memory.ResidentPages(), kRangeBytes / page);
  for (int64_t i = 0; i < kRangeBytes; ++i) {
    const auto expected = i >= 3 * page && i < 4 * page ? std::byte{0x5a}
                          : i >= (int64_t{2} << 20) + page && i < (int64_t{2} << 20) + 2 * page
                              ? std::byte{0xa5}
                              : std::byte{0};
    ASSERT_EQ(memory.data()[i], expected) << "byte " << i;
  }
}

TEST_F(PrefaultTest, LeavesMemoryWrittenBeforeAlone) {
  FreshMapping memory(kRangeBytes);
  ASSERT_NE(memory.data(), nullptr);
  std::memset(memory.data(), 1, static_cast<size_t>(kRangeBytes));
  const int64_t counted_before = metrics::HostBytesPrefaulted()->Value();
  EXPECT_EQ(PrefaultForWriting(memory.data(), kRangeBytes), 0);
  EXPECT_EQ(metrics::HostBytesPrefaulted()->Value(), counted_before);
}

TEST_F(PrefaultTest, FaultsInOnlyTheWindowsThatHoldFreshPages) {
  FreshMapping memory(kRangeBytes);
  ASSERT_NE(memory.data(), nullptr);
  const int64_t mib = int64_t{1} << 20;
  std::memset(memory.data(), 1, static_cast<size_t>(mib));                // first MiB written
  std::memset(memory.data() + 2 * mib, 1, static_cast<size_t>(2 * mib));  // last two too
  EXPECT_EQ(PrefaultForWriting(memory.data(), kRangeBytes), mib);         // only the second MiB
  EXPECT_EQ(memory.ResidentPages(), kRangeBytes / PageBytes());
}

TEST_F(PrefaultTest, SmallRangesAndPartialPagesAreLeftToTheCopy) {
  FreshMapping memory(kRangeBytes);
  ASSERT_NE(memory.data(), nullptr);
  const int64_t page = PageBytes();
  EXPECT_EQ(PrefaultForWriting(memory.data(), kMinPrefaultBytes - 1), 0);
  EXPECT_EQ(memory.ResidentPages(), 0);

  // From the middle of page 0 to the middle of the page 1 MiB later: only the whole pages in
  // between are faulted in.
  const int64_t size = int64_t{1} << 20;
  EXPECT_EQ(PrefaultForWriting(memory.data() + page / 2, size), size - page);
  const std::vector<bool> resident = memory.Resident(0, size + page);
  EXPECT_FALSE(resident.front()) << "the first, partial page";
  EXPECT_FALSE(resident.back()) << "the last, partial page";
  EXPECT_EQ(memory.ResidentPages(), size / page - 1);
}

TEST_F(PrefaultTest, NothingForReadOnlyOrNullMemory) {
  FreshMapping read_only(kRangeBytes, PROT_READ);
  ASSERT_NE(read_only.data(), nullptr);
  EXPECT_EQ(PrefaultForWriting(read_only.data(), kRangeBytes), 0);
  EXPECT_EQ(PrefaultForWriting(nullptr, kRangeBytes), 0);
}

TEST_F(PrefaultTest, OffTurnsItOff) {
  EXPECT_FALSE(SetSetting("FERRY_HOST_PREFAULT", "sometimes").ok());
  ASSERT_TRUE(SetSetting("FERRY_HOST_PREFAULT", "off").ok());
  FreshMapping memory(kRangeBytes);
  ASSERT_NE(memory.data(), nullptr);
  EXPECT_EQ(PrefaultForWriting(memory.data(), kRangeBytes), 0);
  EXPECT_EQ(memory.ResidentPages(), 0);
  ASSERT_TRUE(SetSetting("FERRY_HOST_PREFAULT", "on").ok());
  EXPECT_EQ(PrefaultForWriting(memory.data(), kRangeBytes), kRangeBytes);
}

TEST_F(PrefaultTest, ACopyPlanPrefaultsADenseDestinationOnly) {
  const int64_t rows = 1024;
  const int64_t columns = 1024;  // 4 MiB of f32
  std::vector<float> source(static_cast<size_t>(rows * columns));
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<float>(i);
  const HostView src = HostView::Dense(source.data(), DType::kF32, {rows, columns});

  FreshMapping dense(kRangeBytes);
  ASSERT_NE(dense.data(), nullptr);
  int64_t counted_before = metrics::HostBytesPrefaulted()->Value();
  ASSERT_TRUE(
      CopyConvert(src, MutableHostView::Dense(dense.data(), DType::kF32, {rows, columns})).ok());
  EXPECT_EQ(metrics::HostBytesPrefaulted()->Value() - counted_before, kRangeBytes);
  EXPECT_EQ(std::memcmp(dense.data(), source.data(), static_cast<size_t>(kRangeBytes)), 0);

  // Every other row of a destination twice as large: not dense, so nothing is faulted in ahead
  // (the copy itself touches only the rows it writes).
  FreshMapping strided(2 * kRangeBytes);
  ASSERT_NE(strided.data(), nullptr);
  const MutableHostView every_other_row(strided.data(), DType::kF32, {rows, columns},
                                        {2 * columns * 4, 4});
  counted_before = metrics::HostBytesPrefaulted()->Value();
  ASSERT_TRUE(CopyConvert(src, every_other_row).ok());
  EXPECT_EQ(metrics::HostBytesPrefaulted()->Value(), counted_before);
  EXPECT_EQ(std::memcmp(strided.data() + 2 * columns * 4 * 5, source.data() + 5 * columns,
                        static_cast<size_t>(columns * 4)),
            0);
}

}  // namespace
}  // namespace ferry
