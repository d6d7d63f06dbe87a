// What a PJRT plugin may offer ferry's host side (src/device/pjrt/pjrt_host_services.h): staging
// chunks pinned with PJRT_Client_DmaMap where the plugin pins, pageable where it answers
// UNIMPLEMENTED (the XLA CPU plugin) or runs out of pinnable memory; the plugin's
// PJRT_Device_MemoryStats behind Device::memory_stats(), ferry's count where it has none. The
// pinning plugin is the real CPU plugin with those three entries replaced (PatchedPjrtApi).
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/core/mutex.h"
#include "ferry/device/registry.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#if FERRY_HAVE_PJRT
#include "pjrt_c_api.h"
#include "src/device/pjrt/pjrt_client.h"
#include "tests/device/pjrt_patched_api.h"
#include "tests/required_backends.h"
#endif

namespace ferry {
namespace {

#if FERRY_HAVE_PJRT
using ::testing::HasSubstr;

// The real plugin's library, or a skip with the reason.
#define PJRT_LIBRARY_OR_SKIP(var)                                                   \
  StatusOr<std::string> var##_path = pjrt::FindPjrtPlugin("");                      \
  if (!var##_path.ok()) {                                                           \
    FERRY_SKIP_OR_FAIL_UNAVAILABLE("no pjrt plugin here: " +                        \
                                   std::string(var##_path.status().message()));     \
  }                                                                                 \
  StatusOr<const pjrt::PjrtLibrary*> var##_or = pjrt::LoadPjrtLibrary(*var##_path); \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                                  \
  const pjrt::PjrtLibrary* var = *var##_or

std::unique_ptr<Client> MakeClient(const ClientOptions& options) {
  StatusOr<std::unique_ptr<Client>> client = CreateClient("pjrt", options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(client).value() : nullptr;
}

int64_t GaugeValue(const char* name) { return GetGauge(name, MetricUnit::kBytes)->Value(); }

// A float32 matrix put as bfloat16 through the plugin's own entries: the staged path, whose
// chunks come from the device's host-to-device staging ring. Checks the values that come back.
void StagedPutRoundTrips(Client& client) {
  constexpr int64_t kRows = 1024, kCols = 3000;  // 12 MiB of float32: two 8 MiB chunks
  std::vector<float> source(kRows * kCols);
  for (size_t i = 0; i < source.size(); ++i) source[i] = static_cast<float>(i % 251);
  auto buffer = client.BufferFromHostBuffer(
      HostView::Dense(source.data(), DType::kF32, {kRows, kCols}), DType::kBF16,
      client.devices()[0], HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "staged");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<float> back(source.size(), -1.0f);
  ASSERT_TRUE((*buffer)
                  ->ToHost(MutableHostView::Dense(back.data(), DType::kF32, {kRows, kCols}))
                  .Await()
                  .ok());
  EXPECT_EQ(back, source) << "small integers are exact in bfloat16";
}

TEST(PjrtHostServicesTest, TheCpuPluginDoesNotPinSoStagingIsPageableAndWorks) {
  PJRT_LIBRARY_OR_SKIP(library);
  ASSERT_FALSE(library->path.empty());
  const int64_t pageable_before = GaugeValue("PjrtStagingBytesPageable");
  const int64_t pinned_before = GaugeValue("PjrtStagingBytesPinned");
  {
    std::unique_ptr<Client> client = MakeClient(ClientOptions{.pjrt_direct_host_access = false});
    ASSERT_NE(client, nullptr);
    const auto& pinning = static_cast<pjrt::PjrtClient&>(*client).staging_pinning();
    EXPECT_FALSE(pinning->pins());
    EXPECT_FALSE(pinning->why_pageable().empty());
    EXPECT_THAT(client->devices()[0]->description(), HasSubstr("pageable staging"));
    StagedPutRoundTrips(*client);
    EXPECT_GT(GaugeValue("PjrtStagingBytesPageable"), pageable_before) << "the ring's chunks";
    EXPECT_EQ(GaugeValue("PjrtStagingBytesPinned"), pinned_before);
    // The CPU plugin keeps no memory statistics: the device reports ferry's own count.
    const DeviceMemoryStats stats = client->devices()[0]->memory_stats();
    EXPECT_EQ(stats.source, DeviceMemoryStats::Source::kFerry);
    EXPECT_EQ(stats.bytes_in_use, client->devices()[0]->bytes_in_use());
  }
  EXPECT_EQ(GaugeValue("PjrtStagingBytesPageable"), pageable_before) << "chunks freed";
}

// The CPU plugin with DmaMap, DmaUnmap and MemoryStats of a GPU plugin's kind: DmaMap records
// every registered range (and fails, RESOURCE_EXHAUSTED, for ranges larger than `map_limit`),
// DmaUnmap removes it; MemoryStats answers fixed numbers.
class PinningPlugin {
 public:
  explicit PinningPlugin(const pjrt::PjrtLibrary* library, size_t map_limit) : patched_(library) {
    map_limit_ = map_limit;
    {
      MutexLock lock(mutex_);
      mapped_.clear();
      maps_ = 0;
    }
    PJRT_Api& api = patched_.api();
    api.PJRT_Client_DmaMap = [](PJRT_Client_DmaMap_Args* args) -> PJRT_Error* {
      if (args->size > map_limit_) return Sentinel();
      MutexLock lock(mutex_);
      ++maps_;
      return mapped_.insert(args->data).second ? nullptr : Sentinel();
    };
    api.PJRT_Client_DmaUnmap = [](PJRT_Client_DmaUnmap_Args* args) -> PJRT_Error* {
      MutexLock lock(mutex_);
      return mapped_.erase(args->data) == 1 ? nullptr : Sentinel();
    };
    api.PJRT_Device_MemoryStats = [](PJRT_Device_MemoryStats_Args* args) -> PJRT_Error* {
      args->bytes_in_use = kBytesInUse;
      args->peak_bytes_in_use = kPeak;
      args->peak_bytes_in_use_is_set = true;
      args->bytes_limit_is_set = false;
      return nullptr;
    };
    patched_.AnswerSentinelError("no pinnable memory left (test)",
                                 PJRT_Error_Code_RESOURCE_EXHAUSTED);
  }

  static int64_t maps() {
    MutexLock lock(mutex_);
    return maps_;
  }
  static size_t still_mapped() {
    MutexLock lock(mutex_);
    return mapped_.size();
  }

  static constexpr int64_t kBytesInUse = 123456789;
  static constexpr int64_t kPeak = 987654321;

 private:
  static PJRT_Error* Sentinel() { return PatchedPjrtApi::SentinelError(); }

  PatchedPjrtApi patched_;
  static inline Mutex mutex_;
  static inline std::set<void*> mapped_;
  static inline int64_t maps_ = 0;
  static inline size_t map_limit_ = 0;
};

TEST(PjrtHostServicesTest, StagingChunksArePinnedWhereThePluginPinsAndUnpinnedWithTheClient) {
  PJRT_LIBRARY_OR_SKIP(library);
  PinningPlugin plugin(library, /*map_limit=*/size_t{1} << 30);
  const int64_t pinned_before = GaugeValue("PjrtStagingBytesPinned");
  const int64_t pageable_before = GaugeValue("PjrtStagingBytesPageable");
  {
    std::unique_ptr<Client> client = MakeClient(ClientOptions{.pjrt_direct_host_access = false});
    ASSERT_NE(client, nullptr);
    auto& pjrt_client = static_cast<pjrt::PjrtClient&>(*client);
    EXPECT_TRUE(pjrt_client.staging_pinning()->pins());
    EXPECT_EQ(PinningPlugin::maps(), 1) << "the probe";
    EXPECT_EQ(PinningPlugin::still_mapped(), 0u) << "the probe is unmapped at once";
    EXPECT_THAT(client->devices()[0]->description(), HasSubstr("pinned staging"));
    StagedPutRoundTrips(*client);
    // The put filled host-to-device chunks; the converting read came back through
    // device-to-host ones: both rings' chunks are pinned.
    auto* device = static_cast<pjrt::PjrtDevice*>(client->devices()[0]);
    int64_t chunks = 0, chunk_bytes = 0;
    for (auto direction :
         {pjrt::StagingDirection::kHostToDevice, pjrt::StagingDirection::kDeviceToHost}) {
      chunks += device->staging(direction).num_chunks();
      chunk_bytes +=
          device->staging(direction).num_chunks() * device->staging(direction).chunk_bytes();
    }
    EXPECT_EQ(PinningPlugin::still_mapped(), static_cast<size_t>(chunks));
    EXPECT_EQ(GaugeValue("PjrtStagingBytesPinned") - pinned_before, chunk_bytes);
    EXPECT_EQ(GaugeValue("PjrtStagingBytesPageable"), pageable_before);

    const DeviceMemoryStats stats = client->devices()[0]->memory_stats();
    EXPECT_EQ(stats.source, DeviceMemoryStats::Source::kPlugin);
    EXPECT_EQ(stats.bytes_in_use, PinningPlugin::kBytesInUse);
    EXPECT_EQ(stats.peak_bytes_in_use, PinningPlugin::kPeak);
    EXPECT_EQ(stats.bytes_limit, std::nullopt);
  }
  EXPECT_EQ(PinningPlugin::still_mapped(), 0u) << "every chunk unmapped before it is freed";
  EXPECT_EQ(GaugeValue("PjrtStagingBytesPinned"), pinned_before);
}

// A plugin that pinned the probe but cannot pin a chunk (out of pinnable memory): the chunk stays
// pageable and the transfer works.
TEST(PjrtHostServicesTest, AChunkThePluginCannotPinStaysPageable) {
  PJRT_LIBRARY_OR_SKIP(library);
  PinningPlugin plugin(library, /*map_limit=*/4096);
  const int64_t pageable_before = GaugeValue("PjrtStagingBytesPageable");
  std::unique_ptr<Client> client = MakeClient(ClientOptions{.pjrt_direct_host_access = false});
  ASSERT_NE(client, nullptr);
  EXPECT_TRUE(static_cast<pjrt::PjrtClient&>(*client).staging_pinning()->pins());
  StagedPutRoundTrips(*client);
  EXPECT_EQ(PinningPlugin::still_mapped(), 0u);
  EXPECT_GT(GaugeValue("PjrtStagingBytesPageable"), pageable_before);
}
#endif  // FERRY_HAVE_PJRT

TEST(DeviceMemoryStatsTest, BackendsWithoutARuntimeCountReportFerrysOwn) {
  StatusOr<std::unique_ptr<Client>> host = CreateClient("host");
  ASSERT_TRUE(host.ok()) << host.status();
  Device* device = (*host)->devices()[0];
  std::vector<float> source(1000, 1.0f);
  auto buffer = (*host)->BufferFromHostBuffer(
      HostView::Dense(source.data(), DType::kF32, {1000}), DType::kF32, device,
      HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "x");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const DeviceMemoryStats stats = device->memory_stats();
  EXPECT_EQ(stats.source, DeviceMemoryStats::Source::kFerry);
  EXPECT_EQ(stats.bytes_in_use, 4000);
  EXPECT_EQ(DeviceMemoryStatsSourceName(stats.source), "ferry");
}

}  // namespace
}  // namespace ferry
