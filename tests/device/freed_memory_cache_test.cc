#include "src/core/freed_memory_cache.h"

#include <memory>
#include <optional>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/device/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Handles are ints; `released` records what the cache let go of, in order.
struct Recorder {
  std::vector<int> released;
  FreedMemoryCache<int> MakeCache(int64_t limit, int64_t min_size = 0) {
    return FreedMemoryCache<int>(limit, min_size,
                                 [this](int handle) { released.push_back(handle); });
  }
};

TEST(FreedMemoryCacheTest, TakesOnlyExactSizesNewestFirst) {
  Recorder recorder;
  auto cache = recorder.MakeCache(1000);
  cache.Give(1, 100);
  cache.Give(2, 200);
  cache.Give(3, 100);
  EXPECT_EQ(cache.cached_bytes(), 400);
  EXPECT_EQ(cache.Take(150), std::nullopt);
  EXPECT_EQ(cache.Take(100), 3);
  EXPECT_EQ(cache.Take(100), 1);
  EXPECT_EQ(cache.Take(100), std::nullopt);
  EXPECT_EQ(cache.cached_bytes(), 200);
  EXPECT_THAT(recorder.released, IsEmpty());
}

TEST(FreedMemoryCacheTest, EvictsTheOldestToStayWithinTheLimit) {
  Recorder recorder;
  auto cache = recorder.MakeCache(300);
  cache.Give(1, 100);
  cache.Give(2, 100);
  cache.Give(3, 100);
  cache.Give(4, 150);  // needs 150 more: 1 and 2 go
  EXPECT_THAT(recorder.released, ElementsAre(1, 2));
  EXPECT_EQ(cache.cached_bytes(), 250);
  cache.Give(5, 301);  // larger than the whole cache: released at once
  EXPECT_THAT(recorder.released, ElementsAre(1, 2, 5));
  EXPECT_EQ(cache.Take(150), 4);
}

// SetLimit: a smaller limit releases the oldest entries at once; the gauges follow both numbers.
TEST(FreedMemoryCacheTest, SetLimitReleasesTheOldestAndTheGaugesFollow) {
  std::vector<int> released;
  Gauge cached(MetricUnit::kBytes), limit(MetricUnit::kBytes);
  FreedMemoryCache<int> cache(
      1000, 0, [&released](int handle) { released.push_back(handle); }, &cached, &limit);
  EXPECT_EQ(limit.Value(), 1000);
  cache.Give(1, 100);
  cache.Give(2, 200);
  cache.Give(3, 300);
  EXPECT_EQ(cached.Value(), 600);
  cache.SetLimit(350);  // 1 and 2 go (oldest first); 3 stays
  EXPECT_THAT(released, ElementsAre(1, 2));
  EXPECT_EQ(cache.limit_bytes(), 350);
  EXPECT_EQ(limit.Value(), 350);
  EXPECT_EQ(cached.Value(), 300);
  cache.Give(4, 400);  // over the new limit: released at once
  EXPECT_THAT(released, ElementsAre(1, 2, 4));
  EXPECT_EQ(cache.Take(300), 3);
  EXPECT_EQ(cached.Value(), 0);
  cache.SetLimit(2000);
  cache.Give(5, 1500);
  EXPECT_EQ(cached.Value(), 1500);
  cache.ReleaseAll();
  EXPECT_EQ(cached.Value(), 0);
}

// Caches that share gauges (one per OpenCL device) add up in them, and each takes its share back
// when it is closed or destroyed.
TEST(FreedMemoryCacheTest, CachesSharingGaugesAddUpAndTakeTheirShareBack) {
  Gauge cached(MetricUnit::kBytes), limit(MetricUnit::kBytes);
  auto release_nothing = [](int) {};
  auto first = std::make_unique<FreedMemoryCache<int>>(1000, 0, release_nothing, &cached, &limit);
  FreedMemoryCache<int> second(3000, 0, release_nothing, &cached, &limit);
  EXPECT_EQ(limit.Value(), 4000);
  first->Give(1, 100);
  second.Give(2, 250);
  EXPECT_EQ(cached.Value(), 350);
  second.SetLimit(2000);
  EXPECT_EQ(limit.Value(), 3000);
  EXPECT_EQ(second.Take(250), 2);
  EXPECT_EQ(cached.Value(), 100);
  second.Give(3, 40);
  second.Close();  // its 40 bytes are released and its limit leaves the gauge
  EXPECT_EQ(cached.Value(), 100);
  EXPECT_EQ(limit.Value(), 1000);
  second.SetLimit(5000);  // a closed cache caches nothing, whatever its limit
  EXPECT_EQ(limit.Value(), 1000);
  first.reset();
  EXPECT_EQ(cached.Value(), 0);
  EXPECT_EQ(limit.Value(), 0);
}

// Eviction goes by age across sizes while Take goes by size: the two orders must stay in step
// over many entries of interleaved sizes.
TEST(FreedMemoryCacheTest, ManyEntriesOfMixedSizesKeepAgeAndSizeOrdersInStep) {
  Recorder recorder;
  auto cache = recorder.MakeCache(/*limit=*/10 * 1000);
  for (int i = 0; i < 30; ++i) cache.Give(i, i % 3 == 0 ? 1000 : 500);  // 10 x 1000 + 20 x 500
  // 20000 bytes given to a cache of 10000: exactly the oldest 10000 bytes went, in age order,
  // whatever their size.
  int64_t released_bytes = 0;
  for (int handle : recorder.released) released_bytes += handle % 3 == 0 ? 1000 : 500;
  EXPECT_EQ(released_bytes, 10 * 1000);
  for (size_t i = 0; i < recorder.released.size(); ++i) {
    EXPECT_EQ(recorder.released[i], static_cast<int>(i));  // oldest first
  }
  EXPECT_EQ(cache.cached_bytes(), 10 * 1000);
  // Newest first within a size, and every kept handle is found exactly once.
  std::vector<int> taken;
  while (std::optional<int> handle = cache.Take(1000)) taken.push_back(*handle);
  while (std::optional<int> handle = cache.Take(500)) taken.push_back(*handle);
  std::vector<int> want_1000, want_500;
  for (int i = 29; i >= static_cast<int>(recorder.released.size()); --i) {
    (i % 3 == 0 ? want_1000 : want_500).push_back(i);
  }
  want_1000.insert(want_1000.end(), want_500.begin(), want_500.end());
  EXPECT_EQ(taken, want_1000);
  EXPECT_EQ(cache.cached_bytes(), 0);
}

TEST(FreedMemoryCacheTest, SmallEntriesAreNeverCached) {
  Recorder recorder;
  auto cache = recorder.MakeCache(1000, /*min_size=*/64);
  cache.Give(1, 63);
  cache.Give(2, 64);
  EXPECT_THAT(recorder.released, ElementsAre(1));
  EXPECT_EQ(cache.cached_bytes(), 64);
}

TEST(FreedMemoryCacheTest, CloseReleasesEverythingAndCachesNoMore) {
  Recorder recorder;
  {
    auto cache = recorder.MakeCache(1000);
    cache.Give(1, 10);
    EXPECT_TRUE(cache.ReleaseAll());
    EXPECT_FALSE(cache.ReleaseAll());
    cache.Give(2, 10);
    cache.Close();
    EXPECT_THAT(recorder.released, ElementsAre(1, 2));
    cache.Give(3, 10);
    EXPECT_THAT(recorder.released, ElementsAre(1, 2, 3));
    EXPECT_EQ(cache.cached_bytes(), 0);
    cache.Give(4, 10);
    cache.Close();
  }
  EXPECT_THAT(recorder.released, ElementsAre(1, 2, 3, 4));
  {
    auto cache = recorder.MakeCache(1000);
    cache.Give(5, 10);
  }  // the destructor releases what is left
  EXPECT_THAT(recorder.released, ElementsAre(1, 2, 3, 4, 5));
}

// Host memory (the host backend's device memory, HostTensors): a freed block serves the next
// allocation of the same size, with the new contents, and is not counted as in use.
TEST(HostMemoryCacheTest, FreedDeviceMemoryServesTheNextBufferOfTheSameSize) {
  if (HostMemoryCacheLimitBytes() == 0) {
    GTEST_SKIP() << "the host memory cache is off in this build (AddressSanitizer) or by "
                    "FERRY_HOST_MEMORY_CACHE_BYTES=0";
  }
  ClientOptions options;
  options.num_devices = 2;
  StatusOr<std::unique_ptr<Client>> client = CreateClient("host", options);
  ASSERT_TRUE(client.ok()) << client.status();
  constexpr int64_t kElements = (int64_t{3} << 20) / 4 + 16;  // a size no other test uses
  std::vector<float> first(kElements, 1.5f), second(kElements, -2.5f), back(kElements);
  Device* device = (*client)->devices()[0];
  ReleaseCachedHostMemory();
  {
    StatusOr<std::unique_ptr<Buffer>> buffer = (*client)->BufferFromHostBuffer(
        HostView::Dense(first.data(), DType::kF32, {kElements}), DType::kF32, device,
        HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "first");
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_TRUE((*buffer)->Ready().Await().ok());
  }
  EXPECT_EQ(CachedHostMemoryBytes(), kElements * 4);
  EXPECT_EQ(device->bytes_in_use(), 0);
  // Another device takes it: host devices share the RAM.
  Device* other = (*client)->devices()[1];
  StatusOr<std::unique_ptr<Buffer>> buffer = (*client)->BufferFromHostBuffer(
      HostView::Dense(second.data(), DType::kF32, {kElements}), DType::kF32, other,
      HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "second");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(CachedHostMemoryBytes(), 0);
  EXPECT_EQ(other->bytes_in_use(), kElements * 4);
  ASSERT_TRUE((*buffer)
                  ->ToHost(MutableHostView::Dense(back.data(), DType::kF32, {kElements}))
                  .Await()
                  .ok());
  EXPECT_EQ(back, second);
  buffer->reset();
  ReleaseCachedHostMemory();
  EXPECT_EQ(CachedHostMemoryBytes(), 0);
}

}  // namespace
}  // namespace ferry
