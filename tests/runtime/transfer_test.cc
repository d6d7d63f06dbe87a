#include "ferry/runtime/transfer.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "ferry/core/metrics.h"
#include "ferry/core/runtime_thread.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/dtype_policy.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<Client> MakeHostClient(ClientOptions options = {}) {
  auto client = CreateClient("host", options);
  EXPECT_TRUE(client.ok()) << client.status();
  return *std::move(client);
}

std::shared_ptr<const TensorSource> MakeSource(DType dtype, std::vector<int64_t> dims,
                                               std::string name = "t") {
  HostTensor tensor = HostTensor::Allocate(dtype, dims).value();
  for (int64_t i = 0; i < tensor.size_bytes(); ++i) {
    tensor.data()[i] = static_cast<std::byte>((i * 37 + 11) & 0x3F);  // finite floats
  }
  return TensorSource::FromHostTensor(std::move(tensor), std::move(name));
}

// A borrowed source whose keep-alive records when it is destroyed.
struct Tracked {
  std::vector<float> values;
  std::atomic<int>* destroyed;
  ~Tracked() { destroyed->fetch_add(1); }
};

TEST(DTypePolicyTest, ExplicitRequestWins) {
  bool downcast = false;
  auto chosen =
      ChooseDeviceDType(DType::kF32, DType::kBF16, DeviceCapabilities::All(), "x", &downcast);
  ASSERT_TRUE(chosen.ok());
  EXPECT_EQ(*chosen, DType::kBF16);
  EXPECT_TRUE(downcast);
}

TEST(DTypePolicyTest, ProfilePicksNearestHeldType) {
  const DeviceCapabilities tpu_like = DeviceCapabilities::No64BitFloats();
  bool downcast = false;
  EXPECT_EQ(ChooseDeviceDType(DType::kF64, std::nullopt, tpu_like, "x", &downcast).value(),
            DType::kF32);
  EXPECT_TRUE(downcast);
  EXPECT_EQ(ChooseDeviceDType(DType::kC128, std::nullopt, tpu_like, "x", &downcast).value(),
            DType::kC64);
  EXPECT_TRUE(downcast);
  EXPECT_EQ(ChooseDeviceDType(DType::kF32, std::nullopt, tpu_like, "x", &downcast).value(),
            DType::kF32);
  EXPECT_FALSE(downcast);
}

TEST(DTypePolicyTest, RequestingAnUnheldTypeIsInvalidArgument) {
  auto chosen =
      ChooseDeviceDType(DType::kF32, DType::kF64, DeviceCapabilities::No64BitFloats(), "w");
  EXPECT_EQ(chosen.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(chosen.status().message()), HasSubstr("'w'"));
}

TEST(DTypePolicyTest, NoHeldFallbackIsInvalidArgument) {
  DeviceCapabilities only_f32;
  only_f32.dtypes.set(static_cast<size_t>(DType::kF32));
  EXPECT_EQ(ChooseDeviceDType(DType::kS8, std::nullopt, only_f32, "x").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TransferTest, RoundTripReturnsLogicalDtypeAndCountsDowncasts) {
  ResetMetrics();
  ClientOptions options;
  options.capabilities = DeviceCapabilities::No64BitFloats();
  auto client = MakeHostClient(options);
  Device* device = client->devices()[0];
  std::vector<double> values(64);
  std::iota(values.begin(), values.end(), -10.0);  // exact in f32
  HostTensor tensor = HostTensor::Allocate(DType::kF64, {8, 8}).value();
  std::memcpy(tensor.data(), values.data(), 64 * 8);
  auto source = TensorSource::FromHostTensor(std::move(tensor), "doubles");

  auto data = TransferToDevice({source}, device);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ((*data)[0]->device_dtype(), DType::kF32);
  EXPECT_EQ((*data)[0]->logical_dtype(), DType::kF64);
  EXPECT_EQ(GetCounter("SourceDowncasts")->Value(), 1);
  EXPECT_EQ(GetCounter("ConvertedTransfers")->Value(), 1);

  auto back = TransferFromDevice(*data);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ((*back)[0].dtype(), DType::kF64);
  EXPECT_EQ(0, std::memcmp((*back)[0].data(), values.data(), 64 * 8));

  TransferFromDeviceOptions in_device;
  in_device.in_device_dtype = true;
  auto raw = TransferFromDevice(*data, in_device);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ((*raw)[0].dtype(), DType::kF32);
  EXPECT_EQ(reinterpret_cast<const float*>((*raw)[0].data())[63], 53.0f);
}

TEST(TransferTest, ADeviceDTypeTheDeviceCannotHoldNamesTheDevice) {
  // Before: "device dtype float64 was requested but the device cannot hold it", which on a mesh
  // mixing backends did not say which device lacks it.
  ClientOptions options;
  options.capabilities = DeviceCapabilities::No64BitFloats();
  auto client = MakeHostClient(options);
  Device* device = client->devices()[0];
  auto source = TensorSource::FromHostTensor(HostTensor::Allocate(DType::kF32, {4}).value(), "w");
  TransferToDeviceOptions asked;
  asked.device_dtypes = {DType::kF64};
  auto data = TransferToDevice({source}, device, asked);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("tensor 'w': device dtype float64 was requested"));
  EXPECT_THAT(data.status().message(), HasSubstr("(" + device->name() + ")"));
}

TEST(TransferTest, BorrowRefusesADTypeOutsideTheEnumNamingTheValue) {
  // Before: Borrow accepted static_cast<DType>(99), and the transfer failed later with "the
  // device holds neither invalid nor ...".
  std::vector<float> values(4, 1.0f);
  const HostView view(values.data(), static_cast<DType>(99), {4}, {4});
  auto source = TensorSource::Borrow(view, values.data(), 16, nullptr, "w");
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(source.status().message(), HasSubstr("tensor 'w' has no valid dtype: value 99"));
  const HostView last(values.data(), static_cast<DType>(kNumDTypes), {4}, {4});
  EXPECT_FALSE(TensorSource::Borrow(last, values.data(), 16, nullptr, "w").ok());
  const HostView valid(values.data(), DType::kF8E5M2, {4}, {1});
  EXPECT_TRUE(TensorSource::Borrow(valid, values.data(), 16, nullptr, "w").ok());
}

TEST(TransferTest, AsyncTransferReleasesBorrowedSourceExactlyOnceAfterReading) {
  auto client = MakeHostClient();
  Device* device = client->devices()[0];
  std::atomic<int> destroyed{0};
  for (int round = 0; round < 20; ++round) {
    const int64_t count = 1 << 18;  // 1 MiB: goes through the engine
    auto tracked = std::make_shared<Tracked>();
    tracked->values.resize(count);
    std::iota(tracked->values.begin(), tracked->values.end(), static_cast<float>(round));
    tracked->destroyed = &destroyed;
    const float* begin = tracked->values.data();
    auto source = TensorSource::Borrow(HostView::Dense(begin, DType::kF32, {count}), begin,
                                       count * 4, tracked, "tracked")
                      .value();
    tracked.reset();
    TransferToDeviceOptions options;
    options.semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
    auto data = TransferToDevice({std::move(source)}, device, options);
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_TRUE(AwaitReady(*data).ok());
    // Ready means the source has been released.
    EXPECT_EQ(destroyed.load(), round + 1);
    auto back = TransferFromDevice(*data).value();
    const float* out = reinterpret_cast<const float*>(back[0].data());
    EXPECT_EQ(out[0], static_cast<float>(round));
    EXPECT_EQ(out[count - 1], static_cast<float>(round + count - 1));
  }
}

// kImmutableOnlyDuringCall batches start their large sources asynchronously, all before waiting:
// still, no source may be held (or read) once the call has returned, on success or on error.
TEST(TransferTest, OnlyDuringCallBatchHasReadEverySourceWhenItReturns) {
  auto client = MakeHostClient();
  Device* device = client->devices()[0];
  for (const bool fail : {false, true}) {
    SCOPED_TRACE(fail ? "a source fails to start" : "all succeed");
    std::atomic<int> destroyed{0};
    std::vector<std::shared_ptr<const TensorSource>> batch;
    constexpr int kLarge = 6;
    const int64_t count = (int64_t{4} << 20) / 4;  // 4 MiB each: started asynchronously
    for (int i = 0; i < kLarge; ++i) {
      auto tracked = std::make_shared<Tracked>();
      tracked->values.assign(count, static_cast<float>(i));
      tracked->destroyed = &destroyed;
      const float* begin = tracked->values.data();
      batch.push_back(TensorSource::Borrow(HostView::Dense(begin, DType::kF32, {count}), begin,
                                           count * 4, std::move(tracked),
                                           "large" + std::to_string(i))
                          .value());
    }
    batch.push_back(MakeSource(DType::kF32, {16}, "small"));
    // A complex source cannot be stored as f32: the batch fails on its last source.
    if (fail) batch.push_back(MakeSource(DType::kC64, {16}, "complex"));
    TransferToDeviceOptions options;
    options.semantics = HostBufferSemantics::kImmutableOnlyDuringCall;
    options.device_dtypes.assign(batch.size(), DType::kF32);
    StatusOr<std::vector<DataPtr>> data = TransferToDevice(batch, device, options);
    EXPECT_EQ(data.ok(), !fail) << data.status();
    batch.clear();
    // Nothing of the call holds a source any more: dropping ours destroys them all at once.
    EXPECT_EQ(destroyed.load(), kLarge);
    if (data.ok()) {
      auto back = TransferFromDevice(*data).value();
      for (int i = 0; i < kLarge; ++i) {
        const float* out = reinterpret_cast<const float*>(back[i].data());
        EXPECT_EQ(out[0], static_cast<float>(i));
        EXPECT_EQ(out[count - 1], static_cast<float>(i));
      }
    }
  }
}

TEST(TransferTest, BatchIsAllOrNothingAndKeepsEarlierData) {
  ClientOptions options;
  options.capabilities = DeviceCapabilities::All();
  options.capabilities->memory_limit_bytes = 10 * 4096;
  auto client = MakeHostClient(options);
  Device* device = client->devices()[0];
  auto earlier = TransferToDevice({MakeSource(DType::kF32, {1024}, "earlier")}, device).value();
  std::vector<std::shared_ptr<const TensorSource>> batch;
  for (int i = 0; i < 12; ++i)
    batch.push_back(MakeSource(DType::kF32, {1024}, "b" + std::to_string(i)));
  auto failed = TransferToDevice(batch, device);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(failed.status().message()), HasSubstr("'b9'"));
  // The handles the failed call made were released; the earlier one is intact.
  EXPECT_EQ(device->bytes_in_use(), 4096);
  auto back = TransferFromDevice(earlier).value();
  EXPECT_EQ(0, std::memcmp(back[0].data(), batch[0]->view().data, 4096));  // same fill pattern
}

// All or nothing on every backend: a batch whose large sources were started asynchronously (one
// written directly, one converted through staging chunks on OpenCL) before a later source failed
// has given back every device byte by the time the call returns.
TEST(TransferTest, FailedBatchHasGivenBackEveryDeviceByteOnReturnOnEveryBackend) {
  for (const char* backend : {"host", "opencl"}) {
    SCOPED_TRACE(backend);
    StatusOr<std::unique_ptr<Client>> client = CreateClient(backend);
    if (!client.ok()) {
      // Only OpenCL may be missing here (no library, platform or device).
      ASSERT_EQ(std::string(backend), "opencl") << client.status();
      GTEST_LOG_(INFO) << "skipping opencl: " << client.status();
      continue;
    }
    Device* device = (*client)->devices()[0];
    const int64_t bytes_before = device->bytes_in_use();
    std::vector<std::shared_ptr<const TensorSource>> batch = {
        MakeSource(DType::kF32, {1 << 20}, "large_direct"),
        MakeSource(DType::kF32, {1 << 20}, "large_converted")};
    for (int i = 0; i < 8; ++i) batch.push_back(MakeSource(DType::kF32, {256}, "small"));
    batch.push_back(MakeSource(DType::kC64, {8}, "bad"));  // complex cannot be stored as f32
    TransferToDeviceOptions options;
    options.device_dtypes.assign(batch.size(), DType::kF32);
    options.device_dtypes[1] = DType::kBF16;
    for (int attempt = 0; attempt < 20; ++attempt) {
      StatusOr<std::vector<DataPtr>> data = TransferToDevice(batch, device, options);
      ASSERT_FALSE(data.ok());
      EXPECT_THAT(std::string(data.status().message()), HasSubstr("'bad'"));
      ASSERT_EQ(device->bytes_in_use(), bytes_before) << "attempt " << attempt;
    }
  }
}

// The same for asynchronous semantics, where the call does not otherwise wait for what it
// started: a put refused for want of memory leaves the memory free, so the same put of the first
// source alone goes through at once (before: the host engine's abandoned copy still held the
// first source's 64 MiB, and the retry failed with ResourceExhausted 20 times in 20).
TEST(TransferTest, AFailedAsynchronousBatchLeavesItsMemoryFreeForARetry) {
  ClientOptions options;
  options.capabilities = DeviceCapabilities::All();
  options.capabilities->memory_limit_bytes = 96 << 20;
  auto client = MakeHostClient(options);
  Device* device = client->devices()[0];
  const std::vector<std::shared_ptr<const TensorSource>> both = {
      MakeSource(DType::kF32, {16 << 20}, "a"), MakeSource(DType::kF32, {16 << 20}, "b")};
  TransferToDeviceOptions asynchronous;
  asynchronous.semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  for (int attempt = 0; attempt < 5; ++attempt) {
    SCOPED_TRACE(attempt);
    StatusOr<std::vector<DataPtr>> failed = TransferToDevice(both, device, asynchronous);
    ASSERT_EQ(failed.status().code(), absl::StatusCode::kResourceExhausted) << failed.status();
    EXPECT_EQ(device->bytes_in_use(), 0);
    StatusOr<std::vector<DataPtr>> retry = TransferToDevice({both[0]}, device, asynchronous);
    ASSERT_TRUE(retry.ok()) << retry.status();
    ASSERT_TRUE((*retry)[0]->Ready().Await().ok());
  }
}

// ... but never by waiting on a runtime thread: a put chained on another put's Ready() (which
// runs on the host engine's only worker here) that fails returns at once, although what it
// started is queued behind that very worker (waiting there for it would never end).
TEST(TransferTest, AFailedBatchStartedFromAContinuationDoesNotWaitForItsOwnWork) {
  ClientOptions options;
  options.capabilities = DeviceCapabilities::All();
  options.capabilities->memory_limit_bytes = 96 << 20;
  options.num_worker_threads = 1;
  auto client = MakeHostClient(options);
  Device* device = client->devices()[0];
  TransferToDeviceOptions asynchronous;
  asynchronous.semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  const std::vector<std::shared_ptr<const TensorSource>> both = {
      MakeSource(DType::kF32, {12 << 20}, "a"), MakeSource(DType::kF32, {12 << 20}, "b")};
  auto first =
      TransferToDevice({MakeSource(DType::kF32, {4 << 20}, "first")}, device, asynchronous);
  ASSERT_TRUE(first.ok()) << first.status();
  Promise<> chained;
  std::atomic<bool> on_runtime_thread{false};
  // `chained` by value: the worker holds the promise's state while it sets it (the test's copy
  // goes as soon as the wait below returns).
  (*first)[0]->Ready().OnReady([&, chained](const Status&) {
    on_runtime_thread = OnRuntimeThread();
    chained.Set(TransferToDevice(both, device, asynchronous).status());
  });
  const Status* result = chained.future().AwaitFor(std::chrono::seconds(30));
  ASSERT_NE(result, nullptr) << "the failed put waited, on the engine's worker, for its own work";
  EXPECT_EQ(result->code(), absl::StatusCode::kResourceExhausted) << *result;
  EXPECT_TRUE(on_runtime_thread);
}

// A batch of many small sources is started on every core (transfer_internal.h,
// kParallelMinTransfers): every tensor must still land in its own handle, in order, and a failure
// must name the first failing source in order and leave nothing on the device.
TEST(TransferTest, LargeBatchesOfSmallSourcesStartInParallelInOrder) {
  auto client = MakeHostClient();
  Device* device = client->devices()[0];
  constexpr int kCount = 1000;
  for (const bool fail : {false, true}) {
    SCOPED_TRACE(fail ? "two sources fail" : "all succeed");
    std::vector<std::shared_ptr<const TensorSource>> batch;
    for (int i = 0; i < kCount; ++i) {
      HostTensor tensor = HostTensor::Allocate(DType::kS32, {64 + i % 7}).value();
      int32_t* values = reinterpret_cast<int32_t*>(tensor.data());
      for (int64_t j = 0; j < tensor.size_bytes() / 4; ++j) values[j] = i * 1000 + j;
      batch.push_back(TensorSource::FromHostTensor(std::move(tensor), "s" + std::to_string(i)));
    }
    batch.insert(batch.begin() + 500, MakeSource(DType::kF32, {4 << 20}, "large"));
    if (fail) {  // complex cannot be stored as s32: the first of the two in order is reported
      batch[700] = MakeSource(DType::kC64, {8}, "first_bad");
      batch[900] = MakeSource(DType::kC64, {8}, "second_bad");
    }
    TransferToDeviceOptions options;
    options.device_dtypes.assign(batch.size(), DType::kS32);
    options.device_dtypes[500] = DType::kF32;
    StatusOr<std::vector<DataPtr>> data = TransferToDevice(batch, device, options);
    if (fail) {
      ASSERT_FALSE(data.ok());
      EXPECT_THAT(std::string(data.status().message()), HasSubstr("'first_bad'"));
      // The large source was started asynchronously: the call has waited until it was read, and
      // the job let go of its device memory before saying so (host_client.cc), so the handles
      // the failed call dropped have given every byte back by the time it returns.
      EXPECT_EQ(device->bytes_in_use(), 0);
      continue;
    }
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_EQ(data->size(), batch.size());
    std::vector<HostTensor> back = TransferFromDevice(*data).value();
    for (size_t k = 0; k < batch.size(); ++k) {
      ASSERT_EQ((*data)[k]->name(), batch[k]->name());
      ASSERT_EQ(back[k].size_bytes(), batch[k]->view().dense_size_bytes());
      ASSERT_EQ(0, std::memcmp(back[k].data(), batch[k]->view().data,
                               static_cast<size_t>(back[k].size_bytes())))
          << batch[k]->name();
    }
  }
}

TEST(TransferTest, DeviceDtypesMustMatchSourceCount) {
  auto client = MakeHostClient();
  TransferToDeviceOptions options;
  options.device_dtypes = {DType::kF32, DType::kF32};
  auto data = TransferToDevice({MakeSource(DType::kF32, {4})}, client->devices()[0], options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TransferTest, DestroyingTheLastHandleFreesDeviceMemory) {
  ResetMetrics();
  auto client = MakeHostClient();
  Device* device = client->devices()[0];
  {
    auto data = TransferToDevice({MakeSource(DType::kS16, {100, 10})}, device).value();
    EXPECT_EQ(device->bytes_in_use(), 2000);
    EXPECT_EQ(GetCounter("CreateDataHandles")->Value(), 1);
  }
  EXPECT_EQ(device->bytes_in_use(), 0);
  EXPECT_EQ(GetCounter("DestroyDataHandles")->Value(), 1);
}

TEST(TransferTest, MetricsRecordTimesAndBytes) {
  ResetMetrics();
  auto client = MakeHostClient();
  auto data = TransferToDevice({MakeSource(DType::kF32, {256}), MakeSource(DType::kU8, {100})},
                               client->devices()[0])
                  .value();
  ASSERT_TRUE(TransferFromDevice(data).ok());
  auto snapshot = MetricsSnapshot();
  EXPECT_EQ(snapshot["TransferToDeviceTime.count"], 1);
  EXPECT_EQ(snapshot["TransferFromDeviceTime.count"], 1);
  EXPECT_EQ(snapshot["OutboundData.sum"], 1124);
  EXPECT_EQ(snapshot["InboundData.sum"], 1124);
  EXPECT_EQ(snapshot["DirectTransfers"], 2);
  const std::string report = MetricsReport();
  EXPECT_THAT(report, HasSubstr("Metric: TransferToDeviceTime"));
  EXPECT_THAT(report, HasSubstr("Counter: DirectTransfers"));
}

// Also what the parallel start of a large batch does (transfer_internal.h: small sources started
// from every core at once, onto one device), which a ThreadSanitizer build runs in order
// (src/runtime/parallel_for.h): here the same calls race for real, under TSan too.
TEST(TransferTest, ConcurrentCallersFromManyThreads) {
  auto client = MakeHostClient(ClientOptions{.num_devices = 2});
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 20; ++i) {
        std::vector<std::shared_ptr<const TensorSource>> sources;
        for (int k = 0; k < (t < 2 ? 1 : 8); ++k)
          sources.push_back(MakeSource(DType::kF32, {64, 65}));
        TransferToDeviceOptions options;
        options.semantics = t < 2 ? HostBufferSemantics::kImmutableUntilTransferCompletes
                                  : HostBufferSemantics::kImmutableOnlyDuringCall;
        auto data = TransferToDevice(sources, client->devices()[t % 2], options);
        if (!data.ok()) {
          failures++;
          continue;
        }
        auto back = TransferFromDevice(*data);
        for (size_t k = 0; k < sources.size(); ++k) {
          if (!back.ok() ||
              std::memcmp((*back)[k].data(), sources[k]->view().data, 64 * 65 * 4) != 0) {
            failures++;
          }
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace ferry
