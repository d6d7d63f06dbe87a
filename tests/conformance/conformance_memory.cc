// Device memory limits: running out in the middle of a batch fails that put and every later one
// that does not fit, with ResourceExhausted naming the tensor, while everything already on the
// device stays intact; freeing a buffer makes room again.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "conformance_suite.h"

namespace ferry::conformance {
namespace {

class ConformanceMemory : public ConformanceTest {
 protected:
  // A client whose one device holds every dtype in at most `limit` bytes.
  StatusOr<std::unique_ptr<Client>> MakeLimitedClient(int64_t limit) const {
    DeviceCapabilities capabilities = DeviceCapabilities::All();
    capabilities.memory_limit_bytes = limit;
    ClientOptions options;
    options.capabilities = capabilities;
    return MakeClient(options);
  }
};

constexpr int64_t kKiB = 1024;
// Each batch buffer: 64 KiB of f32.
const std::vector<int64_t> kBatchDims = {16, 1024};
constexpr int64_t kBatchBufferBytes = 16 * 1024 * 4;

struct Put {
  HostBytes source;
  std::unique_ptr<Buffer> buffer;
};

TEST_P(ConformanceMemory, LimitHitMidBatchFailsLaterPutsAndKeepsEarlierBuffers) {
  FERRY_CONFORMANCE_REQUIRE(honours_memory_limit_option);
  // Room for 10.5 batch buffers.
  const int64_t limit = kBatchBufferBytes * 21 / 2;
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> limited, MakeLimitedClient(limit));
  Device* target = limited->devices()[0];
  ASSERT_EQ(target->capabilities().memory_limit_bytes, limit);
  ASSERT_EQ(target->bytes_in_use(), 0);

  std::vector<Put> puts;
  int first_failure = -1;
  for (int i = 0; i < 14; ++i) {
    const std::string name = absl::StrFormat("batch.%d", i);
    SCOPED_TRACE(name);
    HostBytes source = RandomDenseTensor(rng(), DType::kF32, kBatchDims);
    auto record = std::make_shared<OnDoneRecord>();
    StatusOr<std::unique_ptr<Buffer>> buffer = limited->BufferFromHostBuffer(
        HostView::Dense(source.data(), DType::kF32, kBatchDims), DType::kF32, target,
        HostBufferSemantics::kImmutableUntilTransferCompletes, MakeRecordingOnDone(record), name);
    if (buffer.ok()) {
      EXPECT_EQ(first_failure, -1) << "a put succeeded after the device ran out of memory";
      puts.push_back({std::move(source), std::move(buffer).value()});
      continue;
    }
    if (first_failure == -1) first_failure = i;
    EXPECT_TRUE(absl::IsResourceExhausted(buffer.status())) << buffer.status();
    EXPECT_NE(buffer.status().message().find(name), std::string_view::npos)
        << "the message does not name the tensor: " << buffer.status();
    EXPECT_EQ(record->Calls(), 0) << "on_done ran for a failed put";
  }
  EXPECT_EQ(first_failure, 10) << "the device must take exactly 10 buffers of " << kBatchBufferBytes
                               << " bytes in " << limit;
  EXPECT_EQ(target->bytes_in_use(), 10 * kBatchBufferBytes);

  // Everything before the failure arrived whole.
  for (size_t i = 0; i < puts.size(); ++i) {
    SCOPED_TRACE(absl::StrFormat("batch.%d", i));
    CT_ASSERT_READY_OK(puts[i].buffer->Ready());
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*puts[i].buffer));
    EXPECT_TRUE(BytesEqual(puts[i].source.span(), actual));
  }

  // A smaller buffer that fits the remaining half still goes in: failures are not sticky.
  HostBytes small = RandomDenseTensor(rng(), DType::kU8, {16 * kKiB});
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> small_buffer,
                          limited->BufferFromHostBuffer(
                              HostView::Dense(small.data(), DType::kU8, {16 * kKiB}), DType::kU8,
                              target, HostBufferSemantics::kImmutableOnlyDuringCall, nullptr));
  EXPECT_EQ(target->bytes_in_use(), 10 * kBatchBufferBytes + 16 * kKiB);

  // Destroying a buffer frees its memory; a new put of the same size then succeeds.
  puts[3].buffer.reset();
  EXPECT_EQ(target->bytes_in_use(), 9 * kBatchBufferBytes + 16 * kKiB);
  HostBytes again = RandomDenseTensor(rng(), DType::kF32, kBatchDims);
  CT_ASSERT_OK_AND_ASSIGN(
      puts[3].buffer,
      limited->BufferFromHostBuffer(
          HostView::Dense(again.data(), DType::kF32, kBatchDims), DType::kF32, target,
          HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr, "batch.again"));
  puts[3].source = std::move(again);
  for (size_t i = 0; i < puts.size(); ++i) {
    SCOPED_TRACE(absl::StrFormat("batch.%d after the refill", i));
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*puts[i].buffer));
    EXPECT_TRUE(BytesEqual(puts[i].source.span(), actual));
  }
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> small_actual, ReadBack(*small_buffer));
  EXPECT_TRUE(BytesEqual(small.span(), small_actual));
}

// What counts against the limit is the buffer in its device dtype, not the source.
TEST_P(ConformanceMemory, LimitCountsTheDeviceDTypeNotTheSource) {
  FERRY_CONFORMANCE_REQUIRE(honours_memory_limit_option);
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> limited,
                          MakeLimitedClient(kBatchBufferBytes + 100));
  Device* target = limited->devices()[0];
  // 128 KiB of f64 source stored as 64 KiB of f32: fits.
  HostBytes f64 = RandomDenseTensor(rng(), DType::kF64, kBatchDims);
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> narrowed,
      limited->BufferFromHostBuffer(
          HostView::Dense(f64.data(), DType::kF64, kBatchDims), DType::kF32, target,
          HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr));
  EXPECT_EQ(narrowed->size_bytes(), kBatchBufferBytes);
  EXPECT_EQ(target->bytes_in_use(), kBatchBufferBytes);
  // 64 bytes of s8 stored as 512 bytes of s64: does not fit in the 100 bytes left.
  HostBytes s8 = RandomDenseTensor(rng(), DType::kS8, {64});
  StatusOr<std::unique_ptr<Buffer>> widened = limited->BufferFromHostBuffer(
      HostView::Dense(s8.data(), DType::kS8, {64}), DType::kS64, target,
      HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "widened");
  EXPECT_TRUE(absl::IsResourceExhausted(widened.status())) << widened.status();
  // ... while the same 64 bytes kept as s8 do.
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> kept,
                          limited->BufferFromHostBuffer(
                              HostView::Dense(s8.data(), DType::kS8, {64}), DType::kS8, target,
                              HostBufferSemantics::kImmutableOnlyDuringCall, nullptr));
  CT_ASSERT_READY_OK(narrowed->Ready());
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*kept));
  EXPECT_TRUE(BytesEqual(s8.span(), actual));
}

// A single buffer larger than the whole limit fails at once and takes nothing.
TEST_P(ConformanceMemory, BufferLargerThanTheLimitIsResourceExhausted) {
  FERRY_CONFORMANCE_REQUIRE(honours_memory_limit_option);
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> limited, MakeLimitedClient(4 * kKiB));
  Device* target = limited->devices()[0];
  HostBytes source = RandomDenseTensor(rng(), DType::kU8, {8 * kKiB});
  for (HostBufferSemantics semantics : {HostBufferSemantics::kImmutableOnlyDuringCall,
                                        HostBufferSemantics::kImmutableUntilTransferCompletes}) {
    auto record = std::make_shared<OnDoneRecord>();
    StatusOr<std::unique_ptr<Buffer>> buffer = limited->BufferFromHostBuffer(
        HostView::Dense(source.data(), DType::kU8, {8 * kKiB}), DType::kU8, target, semantics,
        MakeRecordingOnDone(record), "too.big");
    EXPECT_TRUE(absl::IsResourceExhausted(buffer.status())) << buffer.status();
    EXPECT_EQ(record->Calls(), 0);
    EXPECT_EQ(target->bytes_in_use(), 0);
  }
}

// A read holds the buffer's memory only until its future completes: once a read is done and the
// buffer destroyed, the bytes are out of bytes_in_use at once, on every read path (inline, on
// the engine, through the plugin, staged and converted, strided), and for a read issued before
// the data arrived.
TEST_P(ConformanceMemory, BytesLeaveTheDeviceOnceTheReadIsDoneAndTheBufferDestroyed) {
  struct ReadCase {
    std::string name;
    std::vector<int64_t> dims;
    DType read_dtype;
    bool transposed;
  };
  const std::vector<ReadCase> cases = {
      {"small dense", {16, 64}, DType::kF32, false},
      {"large dense", {256, 1024}, DType::kF32, false},
      {"large converted to f64", {256, 1024}, DType::kF64, false},
      {"transposed", {64, 96}, DType::kF32, true},
  };
  const int64_t before = device()->bytes_in_use();
  for (const ReadCase& read_case : cases) {
    for (bool read_before_ready : {false, true}) {
      SCOPED_TRACE(absl::StrFormat("%s, read %s Ready()", read_case.name,
                                   read_before_ready ? "before" : "after"));
      for (int round = 0; round < 8; ++round) {
        HostBytes source = RandomDenseTensor(rng(), DType::kF32, read_case.dims);
        CT_ASSERT_OK_AND_ASSIGN(
            std::unique_ptr<Buffer> buffer,
            client().BufferFromHostBuffer(
                HostView::Dense(source.data(), DType::kF32, read_case.dims), DType::kF32, device(),
                HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr));
        if (!read_before_ready) CT_ASSERT_READY_OK(buffer->Ready());
        const int64_t rows = read_case.dims[0];
        const int64_t cols = read_case.dims[1];
        const int64_t element = DTypeSize(read_case.read_dtype);
        HostBytes dst(rows * cols * element);
        const MutableHostView view =
            read_case.transposed
                ? MutableHostView(dst.data(), read_case.read_dtype, {rows, cols},
                                  {element, rows * element})
                : MutableHostView::Dense(dst.data(), read_case.read_dtype, read_case.dims);
        const std::optional<Status> read = AwaitFor(buffer->ToHost(view));
        ASSERT_TRUE(read.has_value()) << "ToHost did not complete in time";
        if (absl::IsUnimplemented(*read)) break;  // a backend without this read (stated there)
        CT_ASSERT_OK(*read);
        buffer.reset();
        ASSERT_EQ(device()->bytes_in_use(), before)
            << "the buffer's bytes outlived a finished read (round " << round << ")";
      }
    }
  }
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceMemory);

}  // namespace
}  // namespace ferry::conformance
