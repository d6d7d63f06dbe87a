// The opencl backend against the host backend (the oracle), byte for byte: random shapes,
// strides (transposed, stepped, padded, negative, broadcast, unaligned), dtypes and semantics,
// into the device and back out into random strided destinations of random dtypes. Every run
// prints its seed; FERRY_CROSS_CHECK_SEED=<n> replays it. Skips, with the reason, where OpenCL
// is unavailable.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "ferry/core/convert.h"
#include "ferry/core/metrics.h"
#include "ferry/device/registry.h"
#include "gtest/gtest.h"
#include "src/device/opencl/opencl_client.h"
#include "src/device/opencl/opencl_status.h"
#include "src/device/opencl/opencl_transfer.h"
#include "tests/required_backends.h"

namespace ferry {
namespace {

constexpr std::chrono::seconds kTimeout{120};

uint64_t RunSeed() {
  static const uint64_t seed = [] {
    if (const char* text = std::getenv("FERRY_CROSS_CHECK_SEED"); text != nullptr && *text) {
      return static_cast<uint64_t>(std::strtoull(text, nullptr, 10));
    }
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }();
  return seed;
}

// Waits (bounded) for `future`; nullopt on timeout.
std::optional<Status> AwaitFor(const Future<>& future) {
  struct Waiter {
    std::mutex mutex;
    std::condition_variable ready;
    bool done = false;
  };
  auto waiter = std::make_shared<Waiter>();
  future.OnReady([waiter](const Status&) {
    std::lock_guard<std::mutex> lock(waiter->mutex);
    waiter->done = true;
    waiter->ready.notify_all();
  });
  std::unique_lock<std::mutex> lock(waiter->mutex);
  if (!waiter->ready.wait_for(lock, kTimeout, [&] { return waiter->done; })) return std::nullopt;
  return future.Await();
}

void FillRandom(std::mt19937_64& rng, DType dtype, std::byte* data, size_t size) {
  for (size_t i = 0; i < size; ++i) {
    data[i] = static_cast<std::byte>(dtype == DType::kBool ? rng() & 1 : rng() & 0xff);
  }
}

// Memory with a view into it: `dims` seen through random byte strides.
struct Layout {
  std::vector<std::byte> storage;
  std::byte* data = nullptr;
  Dims dims;
  Dims byte_strides;
  std::string description;
};

struct LayoutOptions {
  bool allow_broadcast = false;  // destinations never broadcast (two elements, one address)
  bool allow_unaligned = true;
};

// A random layout: physical axes permuted (transposes), logical steps (slices), padding
// between rows, sometimes an odd element pitch or data pointer (unaligned), sometimes negative
// strides, and (for sources) sometimes a broadcast dim. The storage is filled with random bytes
// valid for `dtype`.
Layout MakeRandomLayout(std::mt19937_64& rng, absl::Span<const int64_t> dims, DType dtype,
                        const LayoutOptions& options) {
  const int64_t rank = static_cast<int64_t>(dims.size());
  const int64_t element_size = DTypeSize(dtype);
  Layout layout;
  layout.dims = Dims(dims.begin(), dims.end());
  std::vector<int64_t> order(rank);
  std::iota(order.begin(), order.end(), 0);
  if (rng() % 3 == 0) std::shuffle(order.begin(), order.end(), rng);
  std::vector<int64_t> steps(rank, 1);
  for (int64_t& step : steps) step = rng() % 4 == 0 ? 1 + int64_t(rng() % 3) : 1;
  const bool odd_pitch = options.allow_unaligned && rng() % 6 == 0;
  int64_t pitch = element_size + (odd_pitch ? 1 + int64_t(rng() % 3) : 0);
  // Physical strides, innermost physical axis first.
  std::vector<int64_t> physical_strides(rank, 0);
  for (int64_t position = rank - 1; position >= 0; --position) {
    const int64_t axis = order[position];
    physical_strides[axis] = pitch;
    const int64_t padding = rng() % 4 == 0 ? int64_t(rng() % 3) : 0;
    pitch *= std::max<int64_t>(dims[axis], 1) * steps[axis] + padding;
  }
  int64_t low = 0;
  int64_t high = 0;
  std::vector<std::string> notes;
  for (int64_t axis = 0; axis < rank; ++axis) {
    int64_t stride = physical_strides[axis] * steps[axis];
    if (options.allow_broadcast && rng() % 10 == 0) {
      stride = 0;
      notes.push_back(absl::StrFormat("broadcast dim %d", axis));
    } else if (rng() % 5 == 0) {
      stride = -stride;
      notes.push_back(absl::StrFormat("negative dim %d", axis));
    }
    layout.byte_strides.push_back(stride);
    if (dims[axis] > 0) {
      (stride < 0 ? low : high) += stride * (dims[axis] - 1);
    }
  }
  const int64_t misalignment = options.allow_unaligned && rng() % 5 == 0 ? 1 + rng() % 7 : 0;
  layout.storage.resize(static_cast<size_t>(high - low + element_size + 64 + misalignment));
  FillRandom(rng, dtype, layout.storage.data(), layout.storage.size());
  auto address = reinterpret_cast<uintptr_t>(layout.storage.data());
  const uintptr_t aligned = (address + 63) & ~uintptr_t{63};
  layout.data = layout.storage.data() + (aligned - address) + misalignment - low;
  layout.description = absl::StrFormat(
      "dims [%s] strides [%s]%s%s%s", absl::StrJoin(layout.dims, ","),
      absl::StrJoin(layout.byte_strides, ","), misalignment ? " misaligned" : "",
      odd_pitch ? " odd-pitch" : "", notes.empty() ? "" : " " + absl::StrJoin(notes, " "));
  return layout;
}

DType RandomConvertibleDType(std::mt19937_64& rng, DType from, bool to_it,
                             const DeviceCapabilities* held) {
  std::vector<DType> candidates;
  for (DType dtype : AllDTypes()) {
    if (held != nullptr && !held->Holds(dtype)) continue;
    const Status convertible =
        to_it ? CheckConvertible(dtype, from) : CheckConvertible(from, dtype);
    if (convertible.ok()) candidates.push_back(dtype);
  }
  // Same dtype half of the time: the direct and rectangular paths.
  if (rng() % 2 == 0 && std::find(candidates.begin(), candidates.end(), from) != candidates.end()) {
    return from;
  }
  return candidates[rng() % candidates.size()];
}

class OpenClCrossCheckTest : public testing::Test {
 protected:
  void SetUp() override {
    seed_ = RunSeed();
    rng_.seed(seed_);
    std::cout << "[     SEED ] FERRY_CROSS_CHECK_SEED=" << seed_ << "\n";
    trace_.emplace(__FILE__, __LINE__, absl::StrFormat("FERRY_CROSS_CHECK_SEED=%d", seed_));
    StatusOr<std::unique_ptr<Client>> opencl = CreateClient("opencl");
    if (absl::IsUnavailable(opencl.status())) {
      FERRY_SKIP_OR_FAIL_UNAVAILABLE("the opencl backend is unavailable on this machine: " +
                                     std::string(opencl.status().message()));
    }
    ASSERT_TRUE(opencl.ok()) << opencl.status();
    opencl_ = *std::move(opencl);
    ClientOptions host_options;
    host_options.num_worker_threads = 2;
    StatusOr<std::unique_ptr<Client>> host = CreateClient("host", host_options);
    ASSERT_TRUE(host.ok()) << host.status();
    host_ = *std::move(host);
    static bool printed = false;
    if (!printed) {
      printed = true;
      for (Device* device : opencl_->devices()) {
        std::cout << "[     INFO ] " << device->name() << ": "
                  << static_cast<opencl::OpenClDevice*>(device)->info().description << "\n";
      }
    }
  }

  Device* opencl_device() { return opencl_->devices()[0]; }
  Device* host_device() { return host_->devices()[0]; }

  // Puts `src` as `device_dtype` on both backends, reads each back densely and into a random
  // strided destination of a random dtype (without waiting for Ready first), and expects the
  // same bytes everywhere.
  void CrossCheck(const HostView& src, DType device_dtype, HostBufferSemantics semantics,
                  const std::string& description) {
    SCOPED_TRACE(description);
    StatusOr<std::unique_ptr<Buffer>> on_host = host_->BufferFromHostBuffer(
        src, device_dtype, host_device(), HostBufferSemantics::kImmutableOnlyDuringCall, nullptr,
        "oracle");
    ASSERT_TRUE(on_host.ok()) << on_host.status();
    auto on_done_calls = std::make_shared<std::atomic<int>>(0);
    StatusOr<std::unique_ptr<Buffer>> on_device = opencl_->BufferFromHostBuffer(
        src, device_dtype, opencl_device(), semantics, [on_done_calls] { ++*on_done_calls; },
        "cross_checked");
    ASSERT_TRUE(on_device.ok()) << on_device.status();
    const Buffer& device_buffer = **on_device;
    EXPECT_EQ(device_buffer.size_bytes(), (*on_host)->size_bytes());

    // A strided destination in a random dtype the device dtype converts to, read at once.
    const DType dst_dtype = RandomConvertibleDType(rng_, device_dtype, false, nullptr);
    Layout dst_device = MakeRandomLayout(rng_, src.dims, dst_dtype, {});
    Layout dst_host = dst_device;  // same random bytes, own storage
    dst_host.data = dst_host.storage.data() + (dst_device.data - dst_device.storage.data());
    SCOPED_TRACE("read into " + std::string(DTypeName(dst_dtype)) + " " + dst_device.description);
    const Future<> strided_read =
        (*on_device)
            ->ToHost(MutableHostView(dst_device.data, dst_dtype, dst_device.dims,
                                     dst_device.byte_strides));
    const std::optional<Status> ready = AwaitFor(device_buffer.Ready());
    ASSERT_TRUE(ready.has_value()) << "Ready() did not complete";
    ASSERT_TRUE(ready->ok()) << *ready;
    EXPECT_EQ(on_done_calls->load(), 1) << "on_done must have run exactly once before Ready()";
    const std::optional<Status> strided = AwaitFor(strided_read);
    ASSERT_TRUE(strided.has_value()) << "the strided ToHost did not complete";
    ASSERT_TRUE(strided->ok()) << *strided;
    const std::optional<Status> oracle_strided = AwaitFor((*on_host)->ToHost(
        MutableHostView(dst_host.data, dst_dtype, dst_host.dims, dst_host.byte_strides)));
    ASSERT_TRUE(oracle_strided.has_value() && oracle_strided->ok());
    ExpectSameBytes(dst_host.storage, dst_device.storage, "strided read-back");

    // Dense, in the device dtype: the device's bytes themselves.
    const size_t device_bytes = static_cast<size_t>(device_buffer.size_bytes());
    std::vector<std::byte> from_device(device_bytes, std::byte{0x5a});
    std::vector<std::byte> from_host(device_bytes, std::byte{0xa5});
    const std::optional<Status> dense = AwaitFor(
        (*on_device)->ToHost(MutableHostView::Dense(from_device.data(), device_dtype, src.dims)));
    ASSERT_TRUE(dense.has_value() && dense->ok()) << (dense ? dense->ToString() : "timeout");
    const std::optional<Status> oracle_dense = AwaitFor(
        (*on_host)->ToHost(MutableHostView::Dense(from_host.data(), device_dtype, src.dims)));
    ASSERT_TRUE(oracle_dense.has_value() && oracle_dense->ok());
    ExpectSameBytes(from_host, from_device, "dense read-back");
  }

  static void ExpectSameBytes(const std::vector<std::byte>& oracle,
                              const std::vector<std::byte>& actual, std::string_view what) {
    ASSERT_EQ(oracle.size(), actual.size()) << what;
    const auto mismatch = std::mismatch(oracle.begin(), oracle.end(), actual.begin());
    if (mismatch.first == oracle.end()) return;
    const size_t offset = static_cast<size_t>(mismatch.first - oracle.begin());
    const size_t count = static_cast<size_t>(std::inner_product(
        oracle.begin(), oracle.end(), actual.begin(), size_t{0}, std::plus<>(),
        [](std::byte a, std::byte b) { return a != b ? size_t{1} : size_t{0}; }));
    ADD_FAILURE() << what << ": opencl differs from the host oracle at byte " << offset << " of "
                  << oracle.size() << " (" << count << " bytes differ): expected 0x" << std::hex
                  << int(oracle[offset]) << ", got 0x" << int(actual[offset]) << std::dec;
  }

  HostBufferSemantics RandomSemantics() {
    constexpr HostBufferSemantics kAll[] = {HostBufferSemantics::kImmutableOnlyDuringCall,
                                            HostBufferSemantics::kImmutableUntilTransferCompletes,
                                            HostBufferSemantics::kImmutableZeroCopy};
    return kAll[rng_() % 3];
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::optional<testing::ScopedTrace> trace_;
  std::unique_ptr<Client> opencl_;
  std::unique_ptr<Client> host_;
};

TEST_F(OpenClCrossCheckTest, RandomSmallViewsMatchTheHostBackendByteForByte) {
  constexpr int kCases = 300;
  for (int n = 0; n < kCases && !HasFatalFailure(); ++n) {
    const int64_t rank = rng_() % 5;
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < rank; ++d) {
      const uint64_t pick = rng_() % 12;
      dims.push_back(pick == 0 ? 0 : pick == 1 ? 1 : 1 + int64_t(rng_() % 9));
    }
    const DType device_dtype = [&] {
      const std::vector<DType> held = opencl_device()->capabilities().HeldDTypes();
      return held[rng_() % held.size()];
    }();
    const DType src_dtype = RandomConvertibleDType(rng_, device_dtype, true, nullptr);
    Layout src = MakeRandomLayout(rng_, dims, src_dtype, {.allow_broadcast = true});
    const HostBufferSemantics semantics = RandomSemantics();
    CrossCheck(HostView(src.data, src_dtype, src.dims, src.byte_strides), device_dtype, semantics,
               absl::StrFormat("case %d: %s %s -> %s, %s", n, DTypeName(src_dtype), src.description,
                               DTypeName(device_dtype), HostBufferSemanticsName(semantics)));
  }
}

// Views of a few MiB: past the inline-copy size, so that the direct, rectangular and staged
// (ring, worker) paths all run, in both directions.
TEST_F(OpenClCrossCheckTest, RandomMediumViewsMatchTheHostBackendByteForByte) {
  constexpr int kCases = 24;
  for (int n = 0; n < kCases && !HasFatalFailure(); ++n) {
    const int64_t rank = 2 + rng_() % 2;
    std::vector<int64_t> dims;
    for (int64_t d = 0; d < rank; ++d) {
      dims.push_back(rank == 2 ? 200 + int64_t(rng_() % 500) : 20 + int64_t(rng_() % 60));
    }
    constexpr DType kDTypes[] = {DType::kF32, DType::kU8,   DType::kS16,
                                 DType::kF64, DType::kBF16, DType::kC64};
    DType device_dtype = kDTypes[rng_() % std::size(kDTypes)];
    if (!opencl_device()->capabilities().Holds(device_dtype)) device_dtype = DType::kF32;
    const DType src_dtype = RandomConvertibleDType(rng_, device_dtype, true, nullptr);
    Layout src = MakeRandomLayout(rng_, dims, src_dtype, {.allow_broadcast = true});
    const HostBufferSemantics semantics = RandomSemantics();
    CrossCheck(
        HostView(src.data, src_dtype, src.dims, src.byte_strides), device_dtype, semantics,
        absl::StrFormat("medium case %d: %s %s -> %s, %s", n, DTypeName(src_dtype), src.description,
                        DTypeName(device_dtype), HostBufferSemanticsName(semantics)));
  }
}

// Tens of MiB: several staging chunks per transfer, both directions, each path.
TEST_F(OpenClCrossCheckTest, LargeTransfersSpanningSeveralStagingChunksMatch) {
  struct Case {
    std::string name;
    DType src_dtype;
    DType device_dtype;
    std::vector<int64_t> dims;
    bool transposed;
    int64_t row_padding;  // elements between rows of the source (rectangular path)
  };
  const std::vector<Case> cases = {
      {"dense f32", DType::kF32, DType::kF32, {2100, 2049}, false, 0},
      {"rectangular f32 (padded rows)", DType::kF32, DType::kF32, {1500, 2049}, false, 7},
      {"transposed u16", DType::kU16, DType::kU16, {3001, 2000}, true, 0},
      {"converted f32 -> bf16", DType::kF32, DType::kBF16, {2100, 2049}, false, 0},
      {"converted transposed f64 -> f32", DType::kF64, DType::kF32, {1100, 2300}, true, 0},
  };
  for (const Case& test_case : cases) {
    for (HostBufferSemantics semantics : {HostBufferSemantics::kImmutableOnlyDuringCall,
                                          HostBufferSemantics::kImmutableUntilTransferCompletes}) {
      const int64_t rows = test_case.dims[0];
      const int64_t cols = test_case.dims[1];
      const int64_t element_size = DTypeSize(test_case.src_dtype);
      // Physical memory: rows x (cols + padding), or its transpose.
      const int64_t physical_rows = test_case.transposed ? cols : rows;
      const int64_t physical_cols = (test_case.transposed ? rows : cols) + test_case.row_padding;
      std::vector<std::byte> memory(
          static_cast<size_t>(physical_rows * physical_cols * element_size));
      FillRandom(rng_, test_case.src_dtype, memory.data(), memory.size());
      const Dims strides = test_case.transposed ? Dims{element_size, physical_cols * element_size}
                                                : Dims{physical_cols * element_size, element_size};
      CrossCheck(HostView(memory.data(), test_case.src_dtype, {rows, cols}, strides),
                 test_case.device_dtype, semantics,
                 absl::StrFormat("%s, %s", test_case.name, HostBufferSemanticsName(semantics)));
      if (HasFatalFailure()) return;
    }
  }
}

// A 3-D source with padded rows and slices goes through clEnqueueWriteBufferRect; the read into
// a padded 3-D destination through clEnqueueReadBufferRect.
TEST_F(OpenClCrossCheckTest, ThreeDimensionalRectangularViewsMatch) {
  const Dims dims = {37, 129, 65};
  const int64_t row_pitch = (65 + 3) * 4;
  const int64_t slice_pitch = (129 + 2) * row_pitch;
  std::vector<std::byte> memory(static_cast<size_t>(37 * slice_pitch));
  FillRandom(rng_, DType::kS32, memory.data(), memory.size());
  CrossCheck(HostView(memory.data(), DType::kS32, dims, {slice_pitch, row_pitch, 4}), DType::kS32,
             HostBufferSemantics::kImmutableUntilTransferCompletes, "3-D padded s32");
}

TEST_F(OpenClCrossCheckTest, CapabilitiesComeFromTheDevice) {
  const DeviceCapabilities& capabilities = opencl_device()->capabilities();
  const auto& info = static_cast<opencl::OpenClDevice*>(opencl_device())->info();
  EXPECT_EQ(capabilities.Holds(DType::kF64), info.has_fp64);
  EXPECT_EQ(capabilities.Holds(DType::kC128), info.has_fp64);
  EXPECT_EQ(capabilities.Holds(DType::kF16), info.has_fp16);
  EXPECT_TRUE(capabilities.Holds(DType::kF32));
  EXPECT_TRUE(capabilities.Holds(DType::kBF16));
  ASSERT_TRUE(capabilities.max_buffer_bytes.has_value());
  ASSERT_TRUE(capabilities.memory_limit_bytes.has_value());
  EXPECT_EQ(*capabilities.max_buffer_bytes, info.max_allocation_bytes);
  EXPECT_EQ(*capabilities.memory_limit_bytes, info.global_memory_bytes);
  EXPECT_GT(*capabilities.max_buffer_bytes, 0);

  // One byte more than the largest allocation: refused before anything is allocated or read
  // (the broadcast source addresses a single byte).
  std::byte one{1};
  const int64_t too_many = *capabilities.max_buffer_bytes + 1;
  bool on_done_ran = false;
  StatusOr<std::unique_ptr<Buffer>> buffer = opencl_->BufferFromHostBuffer(
      HostView(&one, DType::kU8, {too_many}, {0}), DType::kU8, opencl_device(),
      HostBufferSemantics::kImmutableUntilTransferCompletes, [&] { on_done_ran = true; },
      "too.large");
  EXPECT_TRUE(absl::IsResourceExhausted(buffer.status())) << buffer.status();
  EXPECT_NE(buffer.status().message().find("too.large"), std::string_view::npos);
  EXPECT_NE(buffer.status().message().find("CL_DEVICE_MAX_MEM_ALLOC_SIZE"), std::string_view::npos);
  EXPECT_FALSE(on_done_ran);
  EXPECT_EQ(opencl_device()->bytes_in_use(), 0);
}

TEST_F(OpenClCrossCheckTest, ZeroCopyNeverAliasesAndCountsAFallback) {
  alignas(64) float source[256];
  for (int i = 0; i < 256; ++i) source[i] = static_cast<float>(rng_() % 1000);
  const int64_t fallbacks = metrics::ZeroCopyFallbacks()->Value();
  const int64_t aliases = metrics::ZeroCopyAliases()->Value();
  StatusOr<std::unique_ptr<Buffer>> buffer = opencl_->BufferFromHostBuffer(
      HostView::Dense(source, DType::kF32, {16, 16}), DType::kF32, opencl_device(),
      HostBufferSemantics::kImmutableZeroCopy, nullptr, "zero_copy");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_FALSE((*buffer)->is_alias());
  EXPECT_EQ(metrics::ZeroCopyFallbacks()->Value(), fallbacks + 1);
  EXPECT_EQ(metrics::ZeroCopyAliases()->Value(), aliases);
  EXPECT_TRUE(absl::IsUnimplemented((*buffer)->HostAccessibleView().status()));
  const std::optional<Status> ready = AwaitFor((*buffer)->Ready());
  ASSERT_TRUE(ready.has_value() && ready->ok());
}

// The handles the device hands out are OpenCL's own: a read enqueued by hand on its queue from the
// buffer's cl_mem returns the buffer's bytes, and a write through them is what ferry reads back.
TEST_F(OpenClCrossCheckTest, NativeHandlesAreTheQueueAndMemoryFerryUses) {
  StatusOr<NativeDeviceHandles> handles = opencl_device()->NativeHandles();
  ASSERT_TRUE(handles.ok()) << handles.status();
  EXPECT_EQ(handles->backend, "opencl");
  StatusOr<const opencl::OpenClLibrary*> cl = opencl::LoadOpenClLibrary(handles->library);
  ASSERT_TRUE(cl.ok()) << cl.status();
  std::vector<float> source(300);
  for (float& value : source) value = static_cast<float>(rng_() % 1000);
  StatusOr<std::unique_ptr<Buffer>> buffer = opencl_->BufferFromHostBuffer(
      HostView::Dense(source.data(), DType::kF32, {20, 15}), DType::kF32, opencl_device(),
      HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "native");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const std::optional<Status> ready = AwaitFor((*buffer)->Ready());
  ASSERT_TRUE(ready.has_value() && ready->ok());
  StatusOr<NativeBufferHandle> mem = (*buffer)->NativeHandle();
  ASSERT_TRUE(mem.ok()) << mem.status();
  auto* queue = static_cast<cl_command_queue>(handles->queue);
  auto* memory = static_cast<cl_mem>(mem->object);
  cl_device_type type = 0;
  ASSERT_EQ((*cl)->clGetDeviceInfo(static_cast<cl_device_id>(handles->device), CL_DEVICE_TYPE,
                                   sizeof(type), &type, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(handles->memory_on_host, (type & CL_DEVICE_TYPE_CPU) != 0);
  std::vector<float> read(source.size(), -1.0f);
  ASSERT_EQ((*cl)->clEnqueueReadBuffer(queue, memory, CL_TRUE, 0, read.size() * sizeof(float),
                                       read.data(), 0, nullptr, nullptr),
            CL_SUCCESS);
  EXPECT_EQ(read, source);
  const float written = 12345.0f;
  ASSERT_EQ((*cl)->clEnqueueWriteBuffer(queue, memory, CL_TRUE, 7 * sizeof(float), sizeof(float),
                                        &written, 0, nullptr, nullptr),
            CL_SUCCESS);
  float back = 0;
  const std::optional<Status> raw = AwaitFor((*buffer)->CopyRawToHost(7 * 4, 4, &back));
  ASSERT_TRUE(raw.has_value() && raw->ok());
  EXPECT_EQ(back, written);
  EXPECT_TRUE(absl::IsUnimplemented((*buffer)->DataAddress().status()));
}

TEST_F(OpenClCrossCheckTest, ConvertedTransfersCountTheirStagingBytes) {
  const int64_t staged = metrics::StagingBytes()->Value();
  std::vector<double> source(100 * 1000);
  for (double& value : source) value = static_cast<double>(rng_() % 100000) / 7;
  StatusOr<std::unique_ptr<Buffer>> buffer = opencl_->BufferFromHostBuffer(
      HostView::Dense(source.data(), DType::kF64, {100, 1000}), DType::kF32, opencl_device(),
      HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr, "staged");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const std::optional<Status> ready = AwaitFor((*buffer)->Ready());
  ASSERT_TRUE(ready.has_value() && ready->ok()) << *ready;
  EXPECT_EQ(metrics::StagingBytes()->Value() - staged, 100 * 1000 * 4);
}

TEST_F(OpenClCrossCheckTest, FreedMemoryIsReusedAfterPendingReadsOfItsLastOwner) {
  // Two tensors of the same size: the second takes the first's cl_mem from the cache while a read
  // of the first is still pending on it. The in-order queue must finish that read first.
  constexpr int64_t kElements = 1 << 20;
  std::vector<float> first(kElements), second(kElements), first_back(kElements, -1);
  for (int64_t i = 0; i < kElements; ++i) {
    first[i] = static_cast<float>(i);
    second[i] = static_cast<float>(-i - 7);
  }
  const opencl::DeviceQueue* queue = opencl::DeviceQueueOf(opencl_device());
  ASSERT_NE(queue, nullptr);
  const int64_t cached_before = queue->cached_bytes();
  const int64_t gauge_before = metrics::DeviceMemoryCacheBytes()->Value();
  StatusOr<std::unique_ptr<Buffer>> buffer = opencl_->BufferFromHostBuffer(
      HostView::Dense(first.data(), DType::kF32, {kElements}), DType::kF32, opencl_device(),
      HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr, "first");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  Future<> read =
      (*buffer)->ToHost(MutableHostView::Dense(first_back.data(), DType::kF32, {kElements}));
  buffer->reset();  // its memory goes to the cache with the read still pending
  EXPECT_EQ(queue->cached_bytes(), cached_before + kElements * 4);
  EXPECT_EQ(metrics::DeviceMemoryCacheBytes()->Value(), gauge_before + kElements * 4);
  EXPECT_EQ(opencl_device()->bytes_in_use(), 0);

  StatusOr<std::unique_ptr<Buffer>> reuse = opencl_->BufferFromHostBuffer(
      HostView::Dense(second.data(), DType::kF32, {kElements}), DType::kF32, opencl_device(),
      HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr, "second");
  ASSERT_TRUE(reuse.ok()) << reuse.status();
  EXPECT_EQ(queue->cached_bytes(), cached_before);  // taken from the cache
  EXPECT_EQ(metrics::DeviceMemoryCacheBytes()->Value(), gauge_before);
  EXPECT_EQ(opencl_device()->bytes_in_use(), kElements * 4);
  const std::optional<Status> read_status = AwaitFor(read);
  ASSERT_TRUE(read_status.has_value() && read_status->ok()) << *read_status;
  EXPECT_EQ(first_back, first);

  std::vector<float> second_back(kElements, -1);
  const std::optional<Status> second_read = AwaitFor(
      (*reuse)->ToHost(MutableHostView::Dense(second_back.data(), DType::kF32, {kElements})));
  ASSERT_TRUE(second_read.has_value() && second_read->ok()) << *second_read;
  EXPECT_EQ(second_back, second);
}

// Each device's cache shows in the metrics while its client lives: its limit (a quarter of the
// device's memory, at most 2 GiB) joins DeviceMemoryCacheLimitBytes, and what it holds joins
// DeviceMemoryCacheBytes; both leave with the client.
TEST_F(OpenClCrossCheckTest, DeviceMemoryCacheGaugesFollowEachClient) {
  const int64_t limit_before = metrics::DeviceMemoryCacheLimitBytes()->Value();
  const int64_t cached_before = metrics::DeviceMemoryCacheBytes()->Value();
  StatusOr<std::unique_ptr<Client>> extra = CreateClient("opencl");
  ASSERT_TRUE(extra.ok()) << extra.status();
  Device* device = (*extra)->devices()[0];
  const int64_t added_limit = metrics::DeviceMemoryCacheLimitBytes()->Value() - limit_before;
  EXPECT_GT(added_limit, 0);
  EXPECT_LE(added_limit, static_cast<int64_t>((*extra)->devices().size()) * (int64_t{2} << 30));
  std::vector<float> values(4096, 1.5f);
  StatusOr<std::unique_ptr<Buffer>> buffer = (*extra)->BufferFromHostBuffer(
      HostView::Dense(values.data(), DType::kF32, {4096}), DType::kF32, device,
      HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "cached");
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ASSERT_TRUE((*buffer)->Ready().Await().ok());
  buffer->reset();
  EXPECT_EQ(metrics::DeviceMemoryCacheBytes()->Value(), cached_before + 4096 * 4);
  extra->reset();
  EXPECT_EQ(metrics::DeviceMemoryCacheBytes()->Value(), cached_before);
  EXPECT_EQ(metrics::DeviceMemoryCacheLimitBytes()->Value(), limit_before);
}

// Needs no OpenCL: a library that cannot be opened makes the backend Unavailable, naming it.
TEST(OpenClUnavailableTest, MissingLibraryIsUnavailableNamingIt) {
  const char* previous = std::getenv("FERRY_OPENCL_LIBRARY");
  const std::string saved = previous != nullptr ? previous : "";
  setenv("FERRY_OPENCL_LIBRARY", "libferry-no-such-opencl.so.1", 1);
  StatusOr<std::unique_ptr<Client>> client = CreateClient("opencl");
  if (previous != nullptr) {
    setenv("FERRY_OPENCL_LIBRARY", saved.c_str(), 1);
  } else {
    unsetenv("FERRY_OPENCL_LIBRARY");
  }
  EXPECT_TRUE(absl::IsUnavailable(client.status())) << client.status();
  EXPECT_NE(client.status().message().find("libferry-no-such-opencl.so.1"), std::string_view::npos)
      << client.status();
  // The rest of ferry is unaffected.
  EXPECT_TRUE(CreateClient("host").ok());
}

TEST(OpenClStatusTest, ErrorsAreNamedAndMappedToStatusCodes) {
  EXPECT_EQ(opencl::OpenClErrorName(CL_OUT_OF_RESOURCES), "CL_OUT_OF_RESOURCES");
  EXPECT_EQ(opencl::OpenClErrorName(CL_INVALID_VALUE), "CL_INVALID_VALUE");
  EXPECT_EQ(opencl::OpenClErrorName(-1001), "CL_PLATFORM_NOT_FOUND_KHR");
  EXPECT_EQ(opencl::OpenClErrorName(-12345), "unknown OpenCL error");
  EXPECT_TRUE(FERRY_OPENCL_STATUS(CL_SUCCESS, "clFinish", "x").ok());
  const Status exhausted =
      FERRY_OPENCL_STATUS(CL_MEM_OBJECT_ALLOCATION_FAILURE, "clCreateBuffer", "tensor 'w'");
  EXPECT_TRUE(absl::IsResourceExhausted(exhausted));
  EXPECT_NE(exhausted.message().find("clCreateBuffer failed with "
                                     "CL_MEM_OBJECT_ALLOCATION_FAILURE (-4) for tensor 'w'"),
            std::string_view::npos)
      << exhausted;
  EXPECT_NE(exhausted.message().find("opencl_cross_check_test.cc:"), std::string_view::npos)
      << exhausted;
  EXPECT_TRUE(absl::IsInternal(FERRY_OPENCL_STATUS(CL_INVALID_VALUE, "clEnqueueReadBuffer", "x")));
  EXPECT_TRUE(absl::IsUnavailable(FERRY_OPENCL_STATUS(CL_DEVICE_NOT_FOUND, "clGetDeviceIDs", "x")));
}

TEST(OpenClTransferPathTest, PathsAreChosenFromTheCollapsedLayout) {
  using opencl::ChooseTransferPath;
  using opencl::PathKind;
  std::byte memory[64];
  const auto path = [&](DType dtype, Dims dims, Dims strides, DType device_dtype) {
    return ChooseTransferPath(HostView(memory, dtype, std::move(dims), std::move(strides)),
                              device_dtype);
  };
  // Dense, also with a size-1 dim of any stride, and a scalar.
  EXPECT_EQ(path(DType::kF32, {4, 5}, {20, 4}, DType::kF32).kind, PathKind::kDense);
  EXPECT_EQ(path(DType::kF32, {4, 1, 5}, {20, -999, 4}, DType::kF32).kind, PathKind::kDense);
  EXPECT_EQ(path(DType::kU8, {}, {}, DType::kU8).kind, PathKind::kDense);
  // A conversion is always staged.
  EXPECT_EQ(path(DType::kF32, {4, 5}, {20, 4}, DType::kF64).kind, PathKind::kStaged);
  // Padded rows: rectangular, with the host pitch.
  const opencl::TransferPath padded = path(DType::kF32, {4, 5}, {32, 4}, DType::kF32);
  ASSERT_EQ(padded.kind, PathKind::kRect);
  EXPECT_EQ(padded.rect.region[0], 20u);
  EXPECT_EQ(padded.rect.region[1], 4u);
  EXPECT_EQ(padded.rect.region[2], 1u);
  EXPECT_EQ(padded.rect.host_row_pitch, 32u);
  // 3-D with padded rows and slices; inner dims that merge leave a 2-D rectangle.
  const opencl::TransferPath cube = path(DType::kU16, {3, 4, 5}, {120, 12, 2}, DType::kU16);
  ASSERT_EQ(cube.kind, PathKind::kRect);
  EXPECT_EQ(cube.rect.region[0], 10u);
  EXPECT_EQ(cube.rect.region[1], 4u);
  EXPECT_EQ(cube.rect.region[2], 3u);
  EXPECT_EQ(cube.rect.host_row_pitch, 12u);
  EXPECT_EQ(cube.rect.host_slice_pitch, 120u);
  EXPECT_EQ(path(DType::kU16, {3, 4, 5}, {48, 12, 2}, DType::kU16).kind, PathKind::kRect);
  // Transposed, negative, broadcast, overlapping rows, a slice pitch that is not a multiple of
  // the row pitch, strided elements, more than three dims: staged.
  EXPECT_EQ(path(DType::kF32, {5, 4}, {4, 20}, DType::kF32).kind, PathKind::kStaged);
  EXPECT_EQ(path(DType::kF32, {4, 5}, {-20, 4}, DType::kF32).kind, PathKind::kStaged);
  EXPECT_EQ(path(DType::kF32, {4, 5}, {0, 4}, DType::kF32).kind, PathKind::kStaged);
  EXPECT_EQ(path(DType::kF32, {4, 5}, {12, 4}, DType::kF32).kind, PathKind::kStaged);
  EXPECT_EQ(path(DType::kU16, {3, 4, 5}, {122, 12, 2}, DType::kU16).kind, PathKind::kStaged);
  EXPECT_EQ(path(DType::kF32, {4, 5}, {40, 8}, DType::kF32).kind, PathKind::kStaged);
  EXPECT_EQ(path(DType::kU8, {2, 3, 4, 5}, {200, 64, 8, 1}, DType::kU8).kind, PathKind::kStaged);
}

TEST(OpenClRegistrationTest, OpenClIsRegisteredWhetherOrNotItIsAvailable) {
  const std::vector<std::string> backends = RegisteredBackends();
  EXPECT_NE(std::find(backends.begin(), backends.end(), "opencl"), backends.end());
  StatusOr<std::unique_ptr<Client>> client = CreateClient("opencl");
  EXPECT_TRUE(client.ok() || absl::IsUnavailable(client.status())) << client.status();
}

}  // namespace
}  // namespace ferry
