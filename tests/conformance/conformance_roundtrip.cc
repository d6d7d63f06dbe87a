// Same-dtype round trips: every dtype comes back bit for bit, under every semantics, from any
// thread, however the read is started.
#include <algorithm>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "conformance_suite.h"
#include "src/core/byte_swap.h"

namespace ferry::conformance {
namespace {

class ConformanceRoundTrip : public ConformanceTest {};

constexpr HostBufferSemantics kAllSemantics[] = {
    HostBufferSemantics::kImmutableOnlyDuringCall,
    HostBufferSemantics::kImmutableUntilTransferCompletes,
    HostBufferSemantics::kImmutableZeroCopy,
};

// Shapes from empty to a few hundred KiB (enough for several chunks of an engine).
const std::vector<std::vector<int64_t>>& RoundTripShapes() {
  static const auto* shapes = new std::vector<std::vector<int64_t>>{
      {}, {0}, {1}, {7}, {3, 0, 5}, {33, 17}, {2, 3, 4, 5}, {48, 1024}};
  return *shapes;
}

std::string ShapeString(absl::Span<const int64_t> dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

// Random bytes (NaN payloads included) of every dtype the device holds come back bit-exact:
// a same-dtype transfer is a copy, never a conversion.
TEST_P(ConformanceRoundTrip, EveryDTypeRoundTripsBitExactUnderEverySemantics) {
  for (DType dtype : AllDTypes()) {
    if (!Holds({dtype})) continue;
    for (HostBufferSemantics semantics : kAllSemantics) {
      for (const std::vector<int64_t>& dims : RoundTripShapes()) {
        SCOPED_TRACE(absl::StrFormat("%s %s %s", DTypeName(dtype), ShapeString(dims),
                                     HostBufferSemanticsName(semantics)));
        HostBytes source = RandomDenseTensor(rng(), dtype, dims);
        const std::vector<std::byte> expected = source.ToVector();
        auto record = std::make_shared<OnDoneRecord>();
        CT_ASSERT_OK_AND_ASSIGN(
            std::unique_ptr<Buffer> buffer,
            client().BufferFromHostBuffer(HostView::Dense(source.data(), dtype, dims), dtype,
                                          device(), semantics, MakeRecordingOnDone(record)));
        record->CallReturned();
        EXPECT_EQ(buffer->device_dtype(), dtype);
        EXPECT_EQ(buffer->dims(), Dims(dims.begin(), dims.end()));
        EXPECT_EQ(buffer->device(), device());
        EXPECT_EQ(buffer->size_bytes(), NumElements(dims) * DTypeSize(dtype));
        CT_ASSERT_READY_OK(buffer->Ready());
        CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
        EXPECT_TRUE(BytesEqual(expected, actual));
        if (StatusOr<HostView> view = buffer->HostAccessibleView(); view.ok()) {
          ASSERT_EQ(view->dtype, dtype);
          ASSERT_EQ(view->dims, buffer->dims());
          ASSERT_TRUE(view->IsRowMajorDense() || NumElements(dims) <= 1);
          EXPECT_TRUE(BytesEqual(
              expected,
              absl::MakeConstSpan(static_cast<const std::byte*>(view->data), expected.size())));
        } else {
          EXPECT_TRUE(absl::IsUnimplemented(view.status())) << view.status();
        }
        buffer.reset();
        EXPECT_EQ(record->WaitForCalls(1), 1);
      }
    }
  }
}

// Buffers report what they hold; the device's bytes_in_use follows their creation and
// destruction (aliases excluded).
TEST_P(ConformanceRoundTrip, BufferReportsDimsDTypeSizeAndDeviceMemory) {
  const int64_t before = device()->bytes_in_use();
  const std::vector<int64_t> dims = {5, 6, 7};
  HostBytes source = RandomDenseTensor(rng(), DType::kS16, dims);
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer,
                          client().BufferFromHostBuffer(
                              HostView::Dense(source.data(), DType::kS16, dims), DType::kS32,
                              device(), HostBufferSemantics::kImmutableOnlyDuringCall, nullptr));
  CT_ASSERT_READY_OK(buffer->Ready());
  EXPECT_EQ(buffer->device_dtype(), DType::kS32);
  EXPECT_EQ(buffer->dims(), Dims(dims.begin(), dims.end()));
  EXPECT_EQ(buffer->size_bytes(), 5 * 6 * 7 * 4);
  EXPECT_FALSE(buffer->is_alias());
  EXPECT_EQ(device()->bytes_in_use(), before + buffer->size_bytes());
  buffer.reset();
  EXPECT_EQ(device()->bytes_in_use(), before);
}

// ToHost right after an asynchronous put (without awaiting Ready) waits for the data itself.
TEST_P(ConformanceRoundTrip, ToHostBeforeReadyWaitsForTheTransfer) {
  for (HostBufferSemantics semantics : {HostBufferSemantics::kImmutableUntilTransferCompletes,
                                        HostBufferSemantics::kImmutableZeroCopy}) {
    SCOPED_TRACE(HostBufferSemanticsName(semantics));
    const std::vector<int64_t> dims = {256, 1024};  // 1 MiB of f32
    HostBytes source = RandomDenseTensor(rng(), DType::kF32, dims);
    const std::vector<std::byte> expected = source.ToVector();
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> buffer,
        client().BufferFromHostBuffer(HostView::Dense(source.data(), DType::kF32, dims),
                                      DType::kF32, device(), semantics, nullptr));
    std::vector<std::byte> actual(expected.size());
    CT_ASSERT_READY_OK(buffer->ToHost(MutableHostView::Dense(actual.data(), DType::kF32, dims)));
    EXPECT_TRUE(buffer->Ready().IsReady()) << "ToHost completed before the buffer was Ready";
    EXPECT_TRUE(BytesEqual(expected, actual));
  }
}

// Several reads of one buffer at once, into different dtypes, all complete and agree.
TEST_P(ConformanceRoundTrip, ConcurrentReadsOfOneBufferAgree) {
  const std::vector<int64_t> dims = {64, 130};
  HostBytes source = RandomDenseTensor(rng(), DType::kS32, dims);
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      client().BufferFromHostBuffer(HostView::Dense(source.data(), DType::kS32, dims), DType::kS32,
                                    device(), HostBufferSemantics::kImmutableUntilTransferCompletes,
                                    nullptr));
  constexpr int kReads = 8;
  std::vector<std::vector<std::byte>> reads(kReads);
  std::vector<Future<>> futures;
  for (int i = 0; i < kReads; ++i) {
    const DType dtype = i % 2 ? DType::kS32 : DType::kS64;
    reads[i].resize(static_cast<size_t>(NumElements(dims) * DTypeSize(dtype)));
    futures.push_back(buffer->ToHost(MutableHostView::Dense(reads[i].data(), dtype, dims)));
  }
  for (const Future<>& future : futures) CT_ASSERT_READY_OK(future);
  const std::vector<std::byte> expected_s32 = source.ToVector();
  std::vector<std::byte> expected_s64(static_cast<size_t>(NumElements(dims) * 8));
  for (int64_t i = 0; i < NumElements(dims); ++i) {
    ConvertOneElement(DType::kS32, source.data() + 4 * i, DType::kS64, expected_s64.data() + 8 * i);
  }
  for (int i = 0; i < kReads; ++i) {
    EXPECT_TRUE(BytesEqual(i % 2 ? expected_s32 : expected_s64, reads[i])) << "read " << i;
  }
}

// Puts and reads from several threads at once on one client (run under TSan in CI).
TEST_P(ConformanceRoundTrip, ConcurrentPutsAndReadsFromManyThreads) {
  constexpr int kThreads = 4;
  constexpr int kPutsPerThread = 12;
  std::vector<uint64_t> thread_seeds;
  for (int t = 0; t < kThreads; ++t) thread_seeds.push_back(rng()());
  std::vector<std::string> failures(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 thread_rng(thread_seeds[t]);
      for (int i = 0; i < kPutsPerThread && failures[t].empty(); ++i) {
        const DType dtype = (i % 3 == 0) ? DType::kF32 : (i % 3 == 1) ? DType::kU8 : DType::kS64;
        const std::vector<int64_t> dims = {static_cast<int64_t>(thread_rng() % 300), 17};
        HostBytes source = RandomDenseTensor(thread_rng, dtype, dims);
        const std::vector<std::byte> expected = source.ToVector();
        const auto semantics = kAllSemantics[(t + i) % 3];
        StatusOr<std::unique_ptr<Buffer>> buffer = client().BufferFromHostBuffer(
            HostView::Dense(source.data(), dtype, dims), dtype, device(), semantics, nullptr);
        if (!buffer.ok()) {
          failures[t] = buffer.status().ToString();
          break;
        }
        StatusOr<std::vector<std::byte>> actual = ReadBack(**buffer);
        if (!actual.ok()) {
          failures[t] = actual.status().ToString();
        } else if (*actual != expected) {
          failures[t] =
              absl::StrFormat("put %d (%s) read back different bytes", i, DTypeName(dtype));
        }
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], "") << "thread " << t;
}

// Byte-swapped sources (big-endian file data) arrive in the host's byte order, under every
// semantics, dense or strided, small or spanning several transfer chunks, converted or not: the
// backend must never take a raw-memory path (memcpy, alias, direct device write) for them.
TEST_P(ConformanceRoundTrip, ByteSwappedSourcesArriveInHostByteOrder) {
  struct Case {
    DType from;
    DType to;
  };
  for (const Case c : {Case{DType::kF32, DType::kF32}, Case{DType::kS16, DType::kS16},
                       Case{DType::kF64, DType::kF32}, Case{DType::kF32, DType::kBF16},
                       Case{DType::kC64, DType::kC64}}) {
    if (!Holds({c.from, c.to})) continue;
    const int64_t unit = ByteSwapUnit(c.from);
    for (HostBufferSemantics semantics : kAllSemantics) {
      for (const std::vector<int64_t>& dims :
           {std::vector<int64_t>{7}, std::vector<int64_t>{64, 33},
            std::vector<int64_t>{1024, 640}}) {
        for (const bool transposed : {false, true}) {
          if (transposed && dims.size() != 2) continue;
          SCOPED_TRACE(absl::StrFormat("%s -> %s %s %s%s", DTypeName(c.from), DTypeName(c.to),
                                       ShapeString(dims), HostBufferSemanticsName(semantics),
                                       transposed ? " transposed" : ""));
          HostBytes native = RandomDenseTensor(rng(), c.from, dims);
          HostBytes stored(native.size());
          std::memcpy(stored.data(), native.data(), static_cast<size_t>(native.size()));
          for (int64_t i = 0; i < stored.size(); i += unit) {
            std::reverse(stored.data() + i, stored.data() + i + unit);
          }
          HostView native_view = HostView::Dense(native.data(), c.from, dims);
          HostView swapped = HostView::Dense(stored.data(), c.from, dims);
          if (transposed) {
            for (HostView* view : {&native_view, &swapped}) {
              std::swap(view->dims[0], view->dims[1]);
              std::swap(view->byte_strides[0], view->byte_strides[1]);
            }
          }
          swapped.byte_swapped = true;
          const std::vector<std::byte> expected = ReferenceDeviceBytes(native_view, c.to);
          CT_ASSERT_OK_AND_ASSIGN(
              std::unique_ptr<Buffer> buffer,
              client().BufferFromHostBuffer(swapped, c.to, device(), semantics, nullptr));
          EXPECT_FALSE(buffer->is_alias());
          CT_ASSERT_READY_OK(buffer->Ready());
          CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
          EXPECT_TRUE(BytesEqual(expected, actual));
        }
      }
    }
  }
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceRoundTrip);

}  // namespace
}  // namespace ferry::conformance
