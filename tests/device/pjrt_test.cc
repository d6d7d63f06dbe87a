// The pjrt backend beyond the shared conformance suite: the inputs that crash the XLA CPU plugins
// when they reach them unchecked (REFERENCE.md lists them) must come back as errors; plugin
// discovery must say what it tried; and transfers larger than one staging chunk must match the
// host backend byte for byte on both the direct and the plugin's own paths.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/transfer.h"
#include "fmt/format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#if FERRY_HAVE_PJRT
#include "pjrt_c_api.h"
#include "src/device/pjrt/pjrt_client.h"
#include "tests/call_on_its_own_thread.h"
#include "tests/device/pjrt_patched_api.h"
#include "tests/required_backends.h"
#endif

namespace ferry {
namespace {

using ::testing::HasSubstr;

// A pjrt client, or a skip with the reason (no plugin installed, or ferry built without the
// header).
#define PJRT_CLIENT_OR_SKIP(var, options)                                     \
  auto var##_or = CreateClient("pjrt", options);                              \
  if (absl::IsUnavailable(var##_or.status())) {                               \
    FERRY_SKIP_OR_FAIL_UNAVAILABLE("no pjrt backend here: " +                 \
                                   std::string(var##_or.status().message())); \
  }                                                                           \
  ASSERT_TRUE(var##_or.ok()) << var##_or.status();                            \
  std::unique_ptr<Client> var = std::move(var##_or).value()

// The path choices to test: direct host access, and the plugin's own entries (as on a GPU). Under
// ThreadSanitizer only the first (tests/conformance/pjrt_conformance.cc says why).
std::vector<bool> DirectChoices() {
#if defined(__SANITIZE_THREAD__)
  return {true};
#else
  return {true, false};
#endif
}

std::vector<std::byte> RandomBytes(std::mt19937_64& rng, int64_t size) {
  std::vector<std::byte> bytes(static_cast<size_t>(size));
  for (auto& byte : bytes) byte = static_cast<std::byte>(rng());
  return bytes;
}

TEST(PjrtTest, DevicesDescribeThePluginAndItsPlatform) {
  PJRT_CLIENT_OR_SKIP(client, ClientOptions{});
  EXPECT_EQ(client->backend(), "pjrt");
  ASSERT_FALSE(client->devices().empty());
  const std::string description = client->devices()[0]->description();
  EXPECT_THAT(description, HasSubstr("PJRT "));
  EXPECT_THAT(description, HasSubstr("API 0."));
  // Every plugin tried (CPU 0.81 and 0.115, CUDA) has these two memory kinds.
  EXPECT_THAT(description, HasSubstr("device"));
  EXPECT_THAT(description, HasSubstr("pinned_host"));
}

// The CPU plugins lay their buffers out row-major (the probe buffer's PJRT_Buffer_GetMemoryLayout
// says so), so ferry's raw paths run; told not to rely on it (a TPU's tiled layouts), ferry takes
// the plugin's layout-aware entries for every transfer, a converting put and a strided,
// converting read and a partial read included, with the same bytes as the oracle.
TEST(PjrtTest, LayoutsAreProbedAndTheLayoutAwarePathsGiveTheSameBytes) {
  {
    PJRT_CLIENT_OR_SKIP(probe, ClientOptions{});
    if (probe->devices()[0]->description().rfind("cpu ", 0) != 0) {
      GTEST_SKIP() << "the layouts checked here are the CPU plugins'";
    }
    EXPECT_THAT(probe->devices()[0]->description(), HasSubstr("row-major layouts"));
  }
  PJRT_CLIENT_OR_SKIP(client, ClientOptions{.pjrt_row_major_layouts = false});
  Device* device = client->devices()[0];
  EXPECT_THAT(device->description(), HasSubstr("layouts left to the plugin"));
  EXPECT_THAT(device->description(), HasSubstr("plugin transfers"));

  // float64 [6, 10], put as float32 from its transpose view (converting and strided).
  std::vector<double> values(60);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i) * 0.5 - 7.0;
  const HostView transposed(values.data(), DType::kF64, {10, 6}, {8, 80});
  const int64_t direct_before = metrics::DirectTransfers()->Value();
  const int64_t converted_before = metrics::ConvertedTransfers()->Value();
  StatusOr<std::unique_ptr<Buffer>> buffer = client->BufferFromHostBuffer(
      transposed, DType::kF32, device, HostBufferSemantics::kImmutableUntilTransferCompletes,
      nullptr, "transposed");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(metrics::ConvertedTransfers()->Value(), converted_before + 1);
  EXPECT_EQ(metrics::DirectTransfers()->Value(), direct_before) << "one put, counted once";
  ASSERT_TRUE((*buffer)->Ready().Await().ok());

  // A converting, strided read: back to float64, into a column-major destination.
  std::vector<double> back(60, -1.0);
  const MutableHostView column_major(back.data(), DType::kF64, {10, 6}, {8, 80});
  ASSERT_TRUE((*buffer)->ToHost(column_major).Await().ok());
  EXPECT_EQ(back, values) << "the transpose of the transpose is the source";

  // A dense read in the device dtype, and a partial read of the dense row-major bytes.
  std::vector<float> dense(60);
  ASSERT_TRUE(
      (*buffer)->ToHost(MutableHostView::Dense(dense.data(), DType::kF32, {10, 6})).Await().ok());
  for (int64_t row = 0; row < 10; ++row) {
    for (int64_t column = 0; column < 6; ++column) {
      EXPECT_EQ(dense[row * 6 + column], static_cast<float>(values[column * 10 + row]));
    }
  }
  std::vector<float> part(7);
  ASSERT_TRUE((*buffer)->CopyRawToHost(13 * 4, 7 * 4, part.data()).Await().ok());
  EXPECT_EQ(part, std::vector<float>(dense.begin() + 13, dense.begin() + 20));

  // Create-then-fill writes at byte offsets: refused with the reason.
  StatusOr<std::unique_ptr<BufferWriter>> writer =
      client->CreateBufferWriter(DType::kF32, {4, 4}, device, "", "filled");
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kUnimplemented) << writer.status();
  EXPECT_THAT(std::string(writer.status().message()), HasSubstr("row-major"));
}

TEST(PjrtTest, DeviceCountIsAPluginOption) {
  {
    PJRT_CLIENT_OR_SKIP(probe, ClientOptions{});
    if (probe->devices()[0]->description().rfind("cpu ", 0) != 0) {
      GTEST_SKIP() << "cpu_device_count is an option of the CPU plugins only";
    }
  }
  PJRT_CLIENT_OR_SKIP(two, (ClientOptions{.plugin_options = {{"cpu_device_count", int64_t{2}}}}));
  EXPECT_EQ(two->devices().size(), 2u);
  EXPECT_EQ(two->devices()[1]->name(), "pjrt:1");
  PJRT_CLIENT_OR_SKIP(three, ClientOptions{.num_devices = 3});
  EXPECT_EQ(three->devices().size(), 3u);
}

// The plugins abort on a negative or non-integer cpu_device_count: ferry refuses it first.
TEST(PjrtTest, BadDeviceCountOptionIsRefusedBeforeThePluginSeesIt) {
  PJRT_CLIENT_OR_SKIP(probe, ClientOptions{});
  for (const ClientOptions::PluginOptionValue& value :
       {ClientOptions::PluginOptionValue{int64_t{-1}}, ClientOptions::PluginOptionValue{0.5},
        ClientOptions::PluginOptionValue{std::string("4")}}) {
    auto client =
        CreateClient("pjrt", ClientOptions{.plugin_options = {{"cpu_device_count", value}}});
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << client.status();
    EXPECT_THAT(std::string(client.status().message()), HasSubstr("cpu_device_count"));
  }
}

TEST(PjrtTest, MissingPluginIsUnavailableAndSaysWhereItLooked) {
  auto by_path = CreateClient("pjrt", ClientOptions{.pjrt_plugin = "/nonexistent/plugin.so"});
  EXPECT_EQ(by_path.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(by_path.status().message()), HasSubstr("/nonexistent/plugin.so"));
  auto by_package = CreateClient("pjrt", ClientOptions{.pjrt_plugin = "no_such_plugin_package"});
  EXPECT_EQ(by_package.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(by_package.status().message()), HasSubstr("no_such_plugin_package"));
}

TEST(PjrtTest, ALibraryWithoutGetPjrtApiIsNotAPlugin) {
  // libz is certainly loadable and certainly not a PJRT plugin.
  for (const char* path :
       {"/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1"}) {
    if (std::FILE* file = std::fopen(path, "rb"); file != nullptr) {
      std::fclose(file);
      auto client = CreateClient("pjrt", ClientOptions{.pjrt_plugin = path});
      EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
      EXPECT_THAT(std::string(client.status().message()), HasSubstr("GetPjrtApi"));
      return;
    }
  }
  GTEST_SKIP() << "no libz.so.1 to try";
}

// Each case is a shape of input that crashes the CPU plugin when it reaches it (REFERENCE.md):
// through ferry's API it is an error with a message, for both path choices.
TEST(PjrtTest, InputsThatCrashThePluginAreErrors) {
  for (bool direct : DirectChoices()) {
    SCOPED_TRACE(direct ? "direct host access" : "plugin paths");
    PJRT_CLIENT_OR_SKIP(client, ClientOptions{.pjrt_direct_host_access = direct});
    Device* device = client->devices()[0];
    alignas(64) float data[16] = {};
    struct Case {
      const char* name;
      HostView view;
      DType device_dtype;
      Device* device;
    };
    PJRT_CLIENT_OR_SKIP(other, ClientOptions{});
    const std::vector<Case> cases = {
        {"null data with elements", HostView(nullptr, DType::kF32, {4}, {4}), DType::kF32, device},
        {"negative dim", HostView(data, DType::kF32, {-4}, {4}), DType::kF32, device},
        {"strides count differs from dims", HostView(data, DType::kF32, {2, 2}, {4}), DType::kF32,
         device},
        {"element type out of range", HostView(data, static_cast<DType>(200), {4}, {4}),
         DType::kF32, device},
        {"device type out of range", HostView(data, DType::kF32, {4}, {4}), static_cast<DType>(200),
         device},
        {"no device", HostView(data, DType::kF32, {4}, {4}), DType::kF32, nullptr},
        {"another client's device", HostView(data, DType::kF32, {4}, {4}), DType::kF32,
         other->devices()[0]},
        {"dims whose size overflows", HostView(data, DType::kF32, {int64_t{1} << 62, 8}, {0, 0}),
         DType::kF32, device},
    };
    for (const Case& test_case : cases) {
      SCOPED_TRACE(test_case.name);
      auto buffer = client->BufferFromHostBuffer(
          test_case.view, test_case.device_dtype, test_case.device,
          HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "bad");
      EXPECT_FALSE(buffer.ok());
      EXPECT_FALSE(buffer.status().message().empty());
    }
    // Strides that are not a whole number of elements are legal in ferry, and the plugin would
    // read them wrongly (unchecked): they must arrive exactly.
    alignas(64) std::byte bytes[64];
    for (int i = 0; i < 64; ++i) bytes[i] = static_cast<std::byte>(i);
    HostView odd(bytes + 1, DType::kF32, {5}, {9});
    auto buffer = client->BufferFromHostBuffer(
        odd, DType::kF32, device, HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "odd");
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    std::vector<std::byte> back(20);
    ASSERT_TRUE(
        (*buffer)->ToHost(MutableHostView::Dense(back.data(), DType::kF32, {5})).Await().ok());
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(std::memcmp(back.data() + 4 * i, bytes + 1 + 9 * i, 4), 0) << "element " << i;
    }
    // A read with the wrong dims or into a null destination is refused, not passed on.
    std::vector<std::byte> small(8);
    EXPECT_FALSE(
        (*buffer)->ToHost(MutableHostView::Dense(small.data(), DType::kF32, {2})).Await().ok());
    EXPECT_FALSE((*buffer)->ToHost(MutableHostView(nullptr, DType::kF32, {5}, {4})).Await().ok());
  }
}

// Several staging chunks (8 MiB each) each way, converting and transposed, on both paths, checked
// against the host backend (the oracle) byte for byte.
TEST(PjrtTest, MultiChunkTransfersMatchTheHostBackend) {
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  auto host_or = CreateClient("host");
  ASSERT_TRUE(host_or.ok());
  std::unique_ptr<Client> host = std::move(host_or).value();
  const int64_t rows = 2048 + static_cast<int64_t>(rng() % 64);
  const int64_t cols = 1536 + static_cast<int64_t>(rng() % 64);
  std::vector<std::byte> source = RandomBytes(rng, rows * cols * 8);
  // A float64 matrix seen transposed: 8 MiB chunks hold fewer elements than it has.
  const HostView transposed(source.data(), DType::kF64, {cols, rows}, {8, cols * 8});
  for (bool direct : DirectChoices()) {
    SCOPED_TRACE(direct ? "direct host access" : "plugin paths");
    PJRT_CLIENT_OR_SKIP(client, ClientOptions{.pjrt_direct_host_access = direct});
    for (DType device_dtype : {DType::kF64, DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(DTypeName(device_dtype));
      for (HostBufferSemantics semantics :
           {HostBufferSemantics::kImmutableOnlyDuringCall,
            HostBufferSemantics::kImmutableUntilTransferCompletes}) {
        auto expected = host->BufferFromHostBuffer(transposed, device_dtype, host->devices()[0],
                                                   semantics, nullptr, "w");
        auto actual = client->BufferFromHostBuffer(transposed, device_dtype, client->devices()[0],
                                                   semantics, nullptr, "w");
        ASSERT_TRUE(expected.ok()) << expected.status();
        ASSERT_TRUE(actual.ok()) << actual.status();
        const int64_t device_bytes = rows * cols * DTypeSize(device_dtype);
        std::vector<std::byte> want(device_bytes), got(device_bytes, std::byte{0x5a});
        ASSERT_TRUE((*expected)
                        ->ToHost(MutableHostView::Dense(want.data(), device_dtype, {cols, rows}))
                        .Await()
                        .ok());
        ASSERT_TRUE((*actual)
                        ->ToHost(MutableHostView::Dense(got.data(), device_dtype, {cols, rows}))
                        .Await()
                        .ok());
        EXPECT_TRUE(want == got) << "device bytes differ";
        // Read back converted to float64 into a transposed destination (partial reads into
        // staging on the plugin path).
        std::vector<std::byte> want_back(rows * cols * 8), got_back(rows * cols * 8);
        const MutableHostView want_view(want_back.data(), DType::kF64, {cols, rows}, {8, cols * 8});
        const MutableHostView got_view(got_back.data(), DType::kF64, {cols, rows}, {8, cols * 8});
        ASSERT_TRUE((*expected)->ToHost(want_view).Await().ok());
        ASSERT_TRUE((*actual)->ToHost(got_view).Await().ok());
        EXPECT_TRUE(want_back == got_back) << "read back differs";
      }
    }
  }
}

// Puts into another memory space (TransferToDeviceOptions::memory_kind) land there, exact: a dense
// source as it is, a transposed one and a converting one through bounded chunks (the 20 MiB one
// takes three 8 MiB chunks, so a chunk is refilled after its first write); the sharded put too.
TEST(PjrtTest, PutsLandInTheMemorySpaceAskedFor) {
  for (bool direct : DirectChoices()) {
    SCOPED_TRACE(direct ? "direct host access" : "plugin paths");
    PJRT_CLIENT_OR_SKIP(client, ClientOptions{.pjrt_direct_host_access = direct});
    Device* device = client->devices()[0];
    ASSERT_TRUE(FindMemorySpace(*device, "pinned_host").ok());
    // Stored as [1024, 5000] and put as its transpose, [5000, 1024] (20 MiB of f32).
    auto stored = std::make_shared<std::vector<float>>(1024 * 5000);
    for (size_t i = 0; i < stored->size(); ++i) (*stored)[i] = static_cast<float>(i % 65521);
    const HostView transposed(stored->data(), DType::kF32, {5000, 1024}, {4, 5000 * 4});
    auto source = TensorSource::Borrow(transposed, stored->data(), 1024 * 5000 * 4, stored, "t");
    ASSERT_TRUE(source.ok()) << source.status();
    auto dense_values = std::make_shared<std::vector<float>>(300, 1.5f);
    auto dense = TensorSource::Borrow(HostView::Dense(dense_values->data(), DType::kF32, {300}),
                                      dense_values->data(), 1200, dense_values, "d");
    ASSERT_TRUE(dense.ok()) << dense.status();
    TransferToDeviceOptions options;
    options.memory_kind = "pinned_host";
    options.device_dtypes = {std::nullopt, DType::kBF16};
    auto data = TransferToDevice({*source, *dense}, device, options);
    ASSERT_TRUE(data.ok()) << data.status();
    for (const DataPtr& each : *data) EXPECT_EQ(each->buffer().memory_kind(), "pinned_host");
    auto back = TransferFromDevice(*data);
    ASSERT_TRUE(back.ok()) << back.status();
    const auto* values = reinterpret_cast<const float*>((*back)[0].data());
    for (int64_t row = 0; row < 5000; row += 499) {
      for (int64_t column = 0; column < 1024; column += 97) {
        ASSERT_EQ(values[row * 1024 + column], (*stored)[column * 5000 + row])
            << row << "," << column;
      }
    }
    EXPECT_EQ(std::memcmp((*back)[1].data(), dense_values->data(), 1200), 0);  // 1.5 is exact
    // An unknown space is an error naming the tensor and the spaces there are.
    options.memory_kind = "nowhere";
    options.device_dtypes.clear();
    auto refused = TransferToDevice({*dense}, device, options);
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
    EXPECT_THAT(refused.status().message(), HasSubstr("tensor 'd'"));
    EXPECT_THAT(refused.status().message(), HasSubstr("pinned_host"));
  }
}

// A sharding's replicas are copied device to device (PJRT_Buffer_CopyToDevice) where the plugin
// copies and ferry does not own the memory; on the direct path (ferry's own memory, where the
// plugin's copy would write fresh pages) every replica is uploaded from the source instead. Either
// way each replica holds the tensor exactly.
TEST(PjrtTest, ReplicasAreCopiedOnTheDeviceWhereThePluginCopies) {
  auto values = std::make_shared<std::vector<float>>(67 * 33);
  for (size_t i = 0; i < values->size(); ++i) (*values)[i] = static_cast<float>(i) * 0.25f - 7.0f;
  const HostView view = HostView::Dense(values->data(), DType::kF32, {67, 33});
  for (bool direct : DirectChoices()) {
    SCOPED_TRACE(direct ? "direct host access" : "plugin paths");
    const ClientOptions options{.num_devices = 4, .pjrt_direct_host_access = direct};
    PJRT_CLIENT_OR_SKIP(client, options);
    const std::vector<Device*> devices(client->devices().begin(), client->devices().end());
    ASSERT_EQ(devices.size(), 4u);
    // Two rows of two: the first dim split over "x", replicated over "y".
    auto mesh = Mesh::Create(devices, {2, 2}, {"x", "y"});
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto sharding = Sharding::Create(*mesh, {{"x"}, {}});
    ASSERT_TRUE(sharding.ok()) << sharding.status();
    auto source = TensorSource::Borrow(view, values->data(), 67 * 33 * 4, values, "w");
    ASSERT_TRUE(source.ok()) << source.status();
    const int64_t before = metrics::ReplicaDeviceCopies()->Value();
    auto sharded = TransferShardsToDevice(*source, *sharding, {});
    ASSERT_TRUE(sharded.ok()) << sharded.status();
    EXPECT_EQ(metrics::ReplicaDeviceCopies()->Value() - before, direct ? 0 : 2)
        << "each of the two replicas of a row block is a device copy exactly when the plugin "
           "copies";
    auto whole = AssembleShards(**sharded);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_EQ(std::memcmp(whole->data(), values->data(), values->size() * 4), 0);
    // Every shard on its own, the replicas included, holds its rows exactly.
    for (size_t i = 0; i < 4; ++i) {
      const DataPtr& shard = (*sharded)->shards()[i];
      ASSERT_NE(shard, nullptr);
      EXPECT_EQ(shard->device(), devices[i]);
      const int64_t first_row = i < 2 ? 0 : 34;
      const int64_t rows = i < 2 ? 34 : 33;
      std::vector<float> back(static_cast<size_t>(rows * 33));
      ASSERT_TRUE(shard->buffer()
                      .ToHost(MutableHostView::Dense(back.data(), DType::kF32, {rows, 33}))
                      .Await()
                      .ok());
      EXPECT_EQ(std::memcmp(back.data(), values->data() + first_row * 33, back.size() * 4), 0)
          << "shard " << i;
    }
  }
}

// A device copy of a buffer still being filled returns at once where the plugin copies (the
// plugin orders the copy after the fill): it arrives once the fill completes, and fails when the
// fill is abandoned. Run on its own thread, so a call that waits fails instead of hanging.
TEST(PjrtTest, ADeviceCopyOfABufferStillBeingFilledReturnsAtOnce) {
  PJRT_CLIENT_OR_SKIP(client, (ClientOptions{.num_devices = 2, .pjrt_direct_host_access = false}));
  Device* from = client->devices()[0];
  Device* to = client->devices()[1];
  ASSERT_TRUE(from->CopiesBuffersTo(to));
  constexpr int64_t kCount = 4096;
  std::vector<float> source(kCount);
  for (int64_t i = 0; i < kCount; ++i) source[i] = static_cast<float>(i) * 0.5f - 3.0f;
  for (const bool abandoned : {false, true}) {
    SCOPED_TRACE(abandoned ? "the fill abandoned" : "the fill completed");
    auto writer = client->CreateBufferWriter(DType::kF32, {kCount}, from, {}, "filled later");
    ASSERT_TRUE(writer.ok()) << writer.status();
    auto original = (*writer)->TakeBuffer();
    ASSERT_TRUE(original.ok()) << original.status();
    ASSERT_TRUE((*writer)->Write(0, source.data(), kCount * 2).Await().ok());

    std::optional<StatusOr<std::unique_ptr<Buffer>>> copy;
    test_support::CallOnItsOwnThread caller([&] { copy.emplace((*original)->CopyToDevice(to)); });
    const bool returned_at_once = caller.ReturnedWithin(std::chrono::seconds(30));
    EXPECT_TRUE(returned_at_once) << "CopyToDevice waited for the fill to finish";
    if (returned_at_once && copy->ok()) {  // (the thread is joined before any ASSERT)
      EXPECT_FALSE((**copy)->Ready().IsReady())
          << "the fill has not finished: the copy cannot have";
    }
    if (abandoned) {
      (*writer)->Abort(CancelledError("the producer gave up"));
    } else {
      ASSERT_TRUE(
          (*writer)->Write(kCount * 2, source.data() + kCount / 2, kCount * 2).Await().ok());
    }
    caller.Join();
    ASSERT_TRUE(copy.has_value() && copy->ok()) << (copy.has_value() ? copy->status() : Status());
    Buffer& arrived = ***copy;
    EXPECT_EQ(arrived.device(), to);
    const Status ready = arrived.Ready().Await();
    if (abandoned) {
      EXPECT_FALSE(ready.ok()) << "a copy of a buffer never filled cannot be ready";
      continue;
    }
    ASSERT_TRUE(ready.ok()) << ready;
    std::vector<float> back(kCount, -1.0f);
    ASSERT_TRUE(
        arrived.ToHost(MutableHostView::Dense(back.data(), DType::kF32, {kCount})).Await().ok());
    EXPECT_EQ(back, source);
  }
}

#if FERRY_HAVE_PJRT
// The handles a pjrt device hands out are the plugin's own: its function table, called by hand,
// reads a ferry buffer's PJRT_Buffer back exactly and names the device ferry put it on.
TEST(PjrtTest, NativeHandlesDriveThePluginDirectly) {
  for (bool direct : DirectChoices()) {
    SCOPED_TRACE(direct ? "direct host access" : "plugin paths");
    PJRT_CLIENT_OR_SKIP(client, ClientOptions{.pjrt_direct_host_access = direct});
    Device* device = client->devices()[0];
    StatusOr<NativeDeviceHandles> handles = device->NativeHandles();
    ASSERT_TRUE(handles.ok()) << handles.status();
    EXPECT_EQ(handles->backend, "pjrt");
    const auto* api = static_cast<const PJRT_Api*>(handles->api);
    ASSERT_NE(api, nullptr);
    EXPECT_EQ(api->pjrt_api_version.major_version, 0);
    EXPECT_THAT(device->description(),
                HasSubstr(fmt::format("API 0.{}", api->pjrt_api_version.minor_version)));
    EXPECT_TRUE(handles->memory_on_host);  // the CPU plugins

    std::mt19937_64 rng(7);
    const std::vector<std::byte> source = RandomBytes(rng, 64 * 33 * 4);
    StatusOr<std::unique_ptr<Buffer>> buffer = client->BufferFromHostBuffer(
        HostView::Dense(source.data(), DType::kF32, {64, 33}), DType::kF32, device,
        HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "native");
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_TRUE((*buffer)->Ready().Await().ok());
    StatusOr<NativeBufferHandle> object = (*buffer)->NativeHandle();
    ASSERT_TRUE(object.ok()) << object.status();
    auto* plugin_buffer = static_cast<PJRT_Buffer*>(object->object);

    PJRT_Buffer_Device_Args on_device{};
    on_device.struct_size = PJRT_Buffer_Device_Args_STRUCT_SIZE;
    on_device.buffer = plugin_buffer;
    ASSERT_EQ(api->PJRT_Buffer_Device(&on_device), nullptr);
    EXPECT_EQ(on_device.device, static_cast<PJRT_Device*>(handles->device));

    std::vector<std::byte> read(source.size());
    PJRT_Buffer_ToHostBuffer_Args to_host{};
    to_host.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
    to_host.src = plugin_buffer;
    to_host.dst = read.data();
    to_host.dst_size = read.size();
    ASSERT_EQ(api->PJRT_Buffer_ToHostBuffer(&to_host), nullptr);
    PJRT_Event_Await_Args await{};
    await.struct_size = PJRT_Event_Await_Args_STRUCT_SIZE;
    await.event = to_host.event;
    ASSERT_EQ(api->PJRT_Event_Await(&await), nullptr);
    PJRT_Event_Destroy_Args destroy{};
    destroy.struct_size = PJRT_Event_Destroy_Args_STRUCT_SIZE;
    destroy.event = to_host.event;
    ASSERT_EQ(api->PJRT_Event_Destroy(&destroy), nullptr);
    EXPECT_EQ(read, source);

    // A CPU plugin's memory has an address ferry hands out only where it reads it itself.
    StatusOr<BufferAddress> address = (*buffer)->DataAddress();
    if (direct) {
      ASSERT_TRUE(address.ok()) << address.status();
      EXPECT_EQ(address->space, AddressSpace::kHost);
      EXPECT_EQ(std::memcmp(address->data, source.data(), source.size()), 0);
    } else {
      EXPECT_TRUE(absl::IsUnimplemented(address.status())) << address.status();
    }
  }
}

// The threads of this process now (/proc/self/status), or -1 where it cannot be read.
int ThreadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  }
  return -1;
}

// A client whose options ferry rejects costs nothing: the options are checked before
// PJRT_Client_Create, and a client made before a later failure is destroyed. Each leaked XLA CPU
// client keeps its threads (8 here) for the life of the process, so the thread count tells.
TEST(PjrtTest, RejectedClientOptionsLeaveNoPluginClientBehind) {
  {
    PJRT_CLIENT_OR_SKIP(probe, ClientOptions{});  // the plugin loaded, its process-wide threads up
  }
  const int before = ThreadCount();
  ASSERT_GT(before, 0);
  for (int i = 0; i < 5; ++i) {
    auto no_workers = CreateClient("pjrt", ClientOptions{.num_worker_threads = 0});
    EXPECT_EQ(no_workers.status().code(), absl::StatusCode::kInvalidArgument)
        << no_workers.status();
    // Refused after PJRT_Client_Create: the plugin's option asks for a device ferry then drops.
    auto no_devices = CreateClient(
        "pjrt",
        ClientOptions{.num_devices = 0, .plugin_options = {{"cpu_device_count", int64_t{1}}}});
    EXPECT_FALSE(no_devices.ok());
  }
  EXPECT_LE(ThreadCount(), before);
}

// The plugin's function table with a PJRT_Buffer_ReadyEvent that fails (PatchedPjrtApi);
// everything else is the real plugin. Its error is a sentinel the wrapped error functions know.
class FailingReadyEvent {
 public:
  explicit FailingReadyEvent(const pjrt::PjrtLibrary* library) : patched_(library) {
    patched_.api().PJRT_Buffer_ReadyEvent = [](PJRT_Buffer_ReadyEvent_Args*) {
      return PatchedPjrtApi::SentinelError();
    };
    patched_.AnswerSentinelError(kMessage, PJRT_Error_Code_RESOURCE_EXHAUSTED);
  }

  static constexpr const char* kMessage = "no ready event (test)";

 private:
  PatchedPjrtApi patched_;
};

// A buffer whose ready event the plugin cannot give is not ready: its error comes back from the
// put (kImmutableOnlyDuringCall waits for readiness) or from Ready(), never an OK.
TEST(PjrtTest, FailedReadyEventIsTheBuffersError) {
  StatusOr<std::string> path = pjrt::FindPjrtPlugin("");
  if (!path.ok()) GTEST_SKIP() << path.status();
  StatusOr<const pjrt::PjrtLibrary*> library = pjrt::LoadPjrtLibrary(*path);
  ASSERT_TRUE(library.ok()) << library.status();
  FailingReadyEvent failing(*library);
  // The plugin's own put (as on a GPU), where ferry asks for the ready event.
  PJRT_CLIENT_OR_SKIP(client, ClientOptions{.pjrt_direct_host_access = false});
  alignas(64) static float source[64] = {};
  for (HostBufferSemantics semantics : {HostBufferSemantics::kImmutableOnlyDuringCall,
                                        HostBufferSemantics::kImmutableUntilTransferCompletes,
                                        HostBufferSemantics::kImmutableZeroCopy}) {
    SCOPED_TRACE(HostBufferSemanticsName(semantics));
    auto on_done_calls = std::make_shared<std::atomic<int>>(0);
    StatusOr<std::unique_ptr<Buffer>> buffer = client->BufferFromHostBuffer(
        HostView::Dense(source, DType::kF32, {64}), DType::kF32, client->devices()[0], semantics,
        [on_done_calls] { on_done_calls->fetch_add(1); }, "unready");
    const Status status = buffer.ok() ? (*buffer)->Ready().Await() : buffer.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(FailingReadyEvent::kMessage));
    EXPECT_THAT(std::string(status.message()), HasSubstr("unready"));
    if (!buffer.ok()) {
      // client.h: a call that fails does not call on_done (the source is the caller's again).
      EXPECT_EQ(on_done_calls->load(), 0) << "on_done ran for a call that failed";
    } else {
      buffer->reset();  // an asynchronous put returned: on_done runs exactly once, whatever the end
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (on_done_calls->load() == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_EQ(on_done_calls->load(), 1);
    }
  }
}

// The platforms whose buffers DLPack reaches by a device pointer, numbered as DLPack numbers them.
TEST(PjrtTest, DeviceAddressSpacesFollowThePlatform) {
  EXPECT_EQ(pjrt::DeviceAddressSpaceOf("cuda"), AddressSpace::kCuda);
  EXPECT_EQ(pjrt::DeviceAddressSpaceOf("rocm"), AddressSpace::kRocm);
  EXPECT_EQ(pjrt::DeviceAddressSpaceOf("cpu"), std::nullopt);
  EXPECT_EQ(pjrt::DeviceAddressSpaceOf("tpu"), std::nullopt);
  EXPECT_EQ(static_cast<int>(AddressSpace::kHost), 1);   // kDLCPU
  EXPECT_EQ(static_cast<int>(AddressSpace::kCuda), 2);   // kDLCUDA
  EXPECT_EQ(static_cast<int>(AddressSpace::kRocm), 10);  // kDLROCM
}
#endif  // FERRY_HAVE_PJRT

#if defined(__SANITIZE_THREAD__)
// Not a test of ferry: a probe of tests/tsan_suppressions.txt, run only by the ctest
// pjrt_tsan_reports_ferry_race_on_plugin_thread (tests/CMakeLists.txt), which passes only when
// ThreadSanitizer reports the race below. A continuation of a buffer's Ready() runs on a plugin
// thread (its stack has plugin frames under ferry's) and writes memory that the test thread then
// writes too, ordered only by a relaxed atomic (no happens-before): a race in instrumented code
// that a suppression matching a plugin frame anywhere in either stack would hide.
int racy_value = 0;

TEST(PjrtTsanProbe, DISABLED_RaceOnFerryMemoryFromAPluginThread) {
  PJRT_CLIENT_OR_SKIP(client, ClientOptions{.pjrt_direct_host_access = false});
  std::vector<float> source(size_t{8} << 20, 1.0f);  // 32 MiB: the plugin copies for a while
  const std::thread::id test_thread = std::this_thread::get_id();
  for (int attempt = 0; attempt < 20; ++attempt) {
    auto buffer = client->BufferFromHostBuffer(
        HostView::Dense(source.data(), DType::kF32, {static_cast<int64_t>(source.size())}),
        DType::kF32, client->devices()[0], HostBufferSemantics::kImmutableUntilTransferCompletes,
        nullptr, "probe");
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    auto ran_on = std::make_shared<std::atomic<std::thread::id>>();
    (*buffer)->Ready().OnReady([ran_on](const Status&) {
      racy_value = racy_value + 1;
      ran_on->store(std::this_thread::get_id(), std::memory_order_relaxed);
    });
    while (ran_on->load(std::memory_order_relaxed) == std::thread::id()) std::this_thread::yield();
    if (ran_on->load(std::memory_order_relaxed) == test_thread) continue;  // ran inline: again
    racy_value = racy_value + 1;
    ASSERT_TRUE((*buffer)->Ready().Await().ok());
    return;
  }
  GTEST_SKIP() << "every continuation ran inline: no race to report";
}
#endif

}  // namespace
}  // namespace ferry
