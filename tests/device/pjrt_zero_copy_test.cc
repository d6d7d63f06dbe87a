// kImmutableZeroCopy on the pjrt backend holds device memory exactly when the plugin copied:
// a copy is reserved in the device's memory account (and refused over its limit) and counted as
// a ZeroCopyFallbacks, an alias holds nothing and counts ZeroCopyAliases. The plugin is made to
// copy a source that passes ferry's own aliasing checks (as every GPU plugin does) by a patched
// function table (pjrt_patched_api.h) that asks the real plugin for kImmutableOnlyDuringCall.
#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "ferry/core/metrics.h"
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

// How the patched plugin treats a zero-copy put.
enum class PluginKind {
  kCopiesOnHost,  // copies into buffers on the CPU: ferry can see that it copied
  kCopiesOnGpu,   // copies, and says its buffers are not on the CPU: ferry cannot look
};

std::string PluginKindName(PluginKind kind) {
  return kind == PluginKind::kCopiesOnHost ? "copies on host" : "copies off host";
}

// The real plugin's table, where BufferFromHostBuffer copies every zero-copy source and (for
// kCopiesOnGpu) Buffer_IsOnCpu answers false.
class CopyingPlugin {
 public:
  CopyingPlugin(const pjrt::PjrtLibrary* library, PluginKind kind) : patched_(library) {
    patched_.api().PJRT_Client_BufferFromHostBuffer =
        [](PJRT_Client_BufferFromHostBuffer_Args* args) {
          if (args->host_buffer_semantics == PJRT_HostBufferSemantics_kImmutableZeroCopy) {
            args->host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
          }
          return PatchedPjrtApi::real().PJRT_Client_BufferFromHostBuffer(args);
        };
    if (kind == PluginKind::kCopiesOnGpu) {
      patched_.api().PJRT_Buffer_IsOnCpu = [](PJRT_Buffer_IsOnCpu_Args* args) {
        PJRT_Error* error = PatchedPjrtApi::real().PJRT_Buffer_IsOnCpu(args);
        args->is_on_cpu = false;
        return error;
      };
    }
  }

 private:
  PatchedPjrtApi patched_;
};

// A 64-byte-aligned dense f32 tensor of random values: ferry's checks let it alias.
struct AlignedSource {
  explicit AlignedSource(std::mt19937_64& rng, int64_t count) : values(count + 16) {
    auto address = reinterpret_cast<uintptr_t>(values.data());
    data = values.data() + ((64 - address % 64) % 64) / sizeof(float);
    for (int64_t i = 0; i < count; ++i) data[i] = static_cast<float>(rng() % 1000) / 8.0f;
    dims = {count};
  }
  HostView view() const { return HostView::Dense(data, DType::kF32, dims); }
  int64_t size_bytes() const { return dims[0] * static_cast<int64_t>(sizeof(float)); }

  std::vector<float> values;
  float* data = nullptr;
  Dims dims;
};

StatusOr<const pjrt::PjrtLibrary*> FindPlugin() {
  FERRY_ASSIGN_OR_RETURN(const std::string path, pjrt::FindPjrtPlugin(""));
  return pjrt::LoadPjrtLibrary(path);
}

ClientOptions LimitedOptions(bool direct, int64_t limit_bytes) {
  ClientOptions options;
  options.pjrt_direct_host_access = direct;
  options.capabilities = DeviceCapabilities::All();
  options.capabilities->memory_limit_bytes = limit_bytes;
  return options;
}

#define LIBRARY_OR_SKIP(var)                                             \
  StatusOr<const pjrt::PjrtLibrary*> var = FindPlugin();                 \
  if (!var.ok()) {                                                       \
    FERRY_SKIP_OR_FAIL_UNAVAILABLE(std::string(var.status().message())); \
  }

// A zero-copy put the plugin copies holds the buffer's bytes in the account while it lives, is
// refused over the limit before anything is held, and counts as a fallback, not an alias.
TEST(PjrtZeroCopyTest, PutThePluginCopiesHoldsDeviceMemoryAndCountsAFallback) {
  LIBRARY_OR_SKIP(library);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (PluginKind kind : {PluginKind::kCopiesOnHost, PluginKind::kCopiesOnGpu}) {
    for (bool direct : {true, false}) {
      SCOPED_TRACE(PluginKindName(kind) + (direct ? ", direct host access" : ", plugin puts"));
      CopyingPlugin plugin(*library, kind);
      AlignedSource first(rng, 1024);
      AlignedSource second(rng, 1024);
      // Room for one of the two.
      StatusOr<std::unique_ptr<Client>> client =
          CreateClient("pjrt", LimitedOptions(direct, first.size_bytes() * 3 / 2));
      ASSERT_TRUE(client.ok()) << client.status();
      Device* device = (*client)->devices()[0];
      const int64_t fallbacks_before = metrics::ZeroCopyFallbacks()->Value();
      const int64_t aliases_before = metrics::ZeroCopyAliases()->Value();
      auto first_done = std::make_shared<std::atomic<int>>(0);
      StatusOr<std::unique_ptr<Buffer>> buffer = (*client)->BufferFromHostBuffer(
          first.view(), DType::kF32, device, HostBufferSemantics::kImmutableZeroCopy,
          [first_done] { ++*first_done; }, "first");
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      EXPECT_FALSE((*buffer)->is_alias());
      EXPECT_EQ(device->bytes_in_use(), first.size_bytes());
      EXPECT_EQ(metrics::ZeroCopyFallbacks()->Value(), fallbacks_before + 1);
      EXPECT_EQ(metrics::ZeroCopyAliases()->Value(), aliases_before);
      ASSERT_TRUE((*buffer)->Ready().Await().ok());
      EXPECT_EQ(first_done->load(), 1) << "a copy lets go of its source once it is read";
      std::vector<float> back(first.dims[0]);
      ASSERT_TRUE((*buffer)
                      ->ToHost(MutableHostView::Dense(back.data(), DType::kF32, first.dims))
                      .Await()
                      .ok());
      EXPECT_TRUE(std::equal(back.begin(), back.end(), first.data));

      auto second_done = std::make_shared<std::atomic<int>>(0);
      StatusOr<std::unique_ptr<Buffer>> refused = (*client)->BufferFromHostBuffer(
          second.view(), DType::kF32, device, HostBufferSemantics::kImmutableZeroCopy,
          [second_done] { ++*second_done; }, "second");
      EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
      EXPECT_THAT(std::string(refused.status().message()), HasSubstr("second"));
      EXPECT_EQ(device->bytes_in_use(), first.size_bytes()) << "a refused put holds nothing";
      EXPECT_EQ(second_done->load(), 0) << "on_done never runs for a failed call";

      buffer->reset();
      EXPECT_EQ(device->bytes_in_use(), 0) << "destroying the copy gives its bytes back";
    }
  }
}

// A zero-copy put the plugin aliases holds no device memory: it fits a device whose limit is
// smaller than the tensor, and counts as an alias.
TEST(PjrtZeroCopyTest, PutThePluginAliasesHoldsNoDeviceMemory) {
  LIBRARY_OR_SKIP(library);
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (bool direct : {true, false}) {
    SCOPED_TRACE(direct ? "direct host access" : "plugin puts");
    AlignedSource source(rng, 1024);
    StatusOr<std::unique_ptr<Client>> client =
        CreateClient("pjrt", LimitedOptions(direct, source.size_bytes() / 4));
    ASSERT_TRUE(client.ok()) << client.status();
    Device* device = (*client)->devices()[0];
    const int64_t fallbacks_before = metrics::ZeroCopyFallbacks()->Value();
    const int64_t aliases_before = metrics::ZeroCopyAliases()->Value();
    auto done = std::make_shared<std::atomic<int>>(0);
    StatusOr<std::unique_ptr<Buffer>> buffer = (*client)->BufferFromHostBuffer(
        source.view(), DType::kF32, device, HostBufferSemantics::kImmutableZeroCopy,
        [done] { ++*done; }, "aliased");
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    ASSERT_TRUE((*buffer)->Ready().Await().ok());
    EXPECT_TRUE((*buffer)->is_alias());
    EXPECT_EQ(device->bytes_in_use(), 0);
    EXPECT_EQ(metrics::ZeroCopyAliases()->Value(), aliases_before + 1);
    EXPECT_EQ(metrics::ZeroCopyFallbacks()->Value(), fallbacks_before);
    EXPECT_EQ(done->load(), 0) << "an alias keeps its source until it is destroyed";
    buffer->reset();
    EXPECT_EQ(done->load(), 1);
    EXPECT_EQ(device->bytes_in_use(), 0);
  }
}
#endif  // FERRY_HAVE_PJRT

}  // namespace
}  // namespace ferry
