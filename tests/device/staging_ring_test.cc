// The device-level staging ring that OpenCL and PJRT both stream through: bounded memory, every
// element through the fused copy-convert in both directions, errors that stop the loop without
// losing a chunk, and a worker that cancels what it has not started.
#include "src/device/staging_ring.h"

#include <atomic>
#include <cstring>
#include <numeric>
#include <vector>

#include "ferry/core/convert.h"
#include "ferry/core/future.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

// Host chunks that count how many exist at once.
StagingChunkAllocator CountingChunks(std::atomic<int>* live, int* made) {
  StagingChunkAllocator allocator = StagingChunkAllocator::Host();
  auto allocate = std::move(allocator.allocate);
  auto free = std::move(allocator.free);
  allocator.allocate = [allocate = std::move(allocate), live,
                        made](int64_t bytes) mutable -> StatusOr<StagingChunk> {
    ++*live;
    ++*made;
    return allocate(bytes);
  };
  allocator.free = [free = std::move(free), live](const StagingChunk& chunk,
                                                  int64_t bytes) mutable {
    --*live;
    free(chunk, bytes);
  };
  return allocator;
}

// A fake device: a byte array that writes copy into and reads copy out of.
struct FakeDevice {
  std::vector<std::byte> bytes;
  std::vector<StagedPiece> pieces;
};

TEST(StagingRingTest, StagedWriteConvertsEveryElementThroughAFewSmallChunks) {
  std::atomic<int> live{0};
  int made = 0;
  {
    // 4 chunks of 4 KiB for a 1000 x 7 f64 tensor seen transposed: 28,000 source bytes, 14,000
    // device bytes of f32, so the loop must wrap around the ring several times.
    StagingRing ring("test", CountingChunks(&live, &made), 4, 4096);
    std::vector<double> source(7 * 1000);
    std::iota(source.begin(), source.end(), 0.5);
    const HostView transposed(source.data(), DType::kF64, {1000, 7}, {8, 8 * 1000});
    FakeDevice device;
    device.bytes.resize(1000 * 7 * sizeof(float));
    Promise<> finished;
    auto counter = std::make_shared<PieceCounter>([finished](Status s) { finished.Set(s); });
    Status status = StagedWrite(
        ring, transposed, DType::kF32,
        [&](const StagingChunk& chunk, const StagedPiece& piece, ChunkDone done) {
          EXPECT_LE(piece.size_bytes, ring.chunk_bytes());
          std::memcpy(device.bytes.data() + piece.offset_bytes, chunk.host,
                      static_cast<size_t>(piece.size_bytes));
          device.pieces.push_back(piece);
          std::move(done)(OkStatus());
          return OkStatus();
        },
        counter);
    ASSERT_TRUE(status.ok()) << status;
    counter->Done(OkStatus());
    ASSERT_TRUE(finished.future().Await().ok());
    EXPECT_EQ(made, 4);
    EXPECT_GE(device.pieces.size(), 4u);
    EXPECT_TRUE(device.pieces.back().last);
    for (size_t i = 0; i + 1 < device.pieces.size(); ++i) EXPECT_FALSE(device.pieces[i].last);
    for (int64_t row = 0; row < 1000; ++row) {
      for (int64_t col = 0; col < 7; ++col) {
        float value;
        std::memcpy(&value, device.bytes.data() + (row * 7 + col) * sizeof(float), sizeof(float));
        ASSERT_EQ(value, static_cast<float>(source[col * 1000 + row])) << row << "," << col;
      }
    }
  }
  EXPECT_EQ(live.load(), 0) << "the ring frees every chunk it made";
}

TEST(StagingRingTest, StagedReadConvertsIntoAStridedDestination) {
  std::atomic<int> live{0};
  int made = 0;
  StagingRing ring("test", CountingChunks(&live, &made), 2, 4096);
  // The device holds 1000 x 5 bf16 values (10,000 bytes: three chunks); read them into every other
  // column of a f32 array.
  std::vector<uint16_t> device(1000 * 5);
  for (size_t i = 0; i < device.size(); ++i) device[i] = F32ToBF16Bits(static_cast<float>(i));
  std::vector<float> destination(1000 * 10, -1.0f);
  const MutableHostView every_other(destination.data(), DType::kF32, {1000, 5}, {40, 8});
  Promise<> finished;
  auto counter = std::make_shared<PieceCounter>([finished](Status s) { finished.Set(s); });
  int reads = 0;
  Status status = StagedRead(
      ring, DType::kBF16, every_other,
      [&](const StagingChunk& chunk, const StagedPiece& piece, ChunkDone landed) {
        ++reads;
        std::memcpy(chunk.host, reinterpret_cast<std::byte*>(device.data()) + piece.offset_bytes,
                    static_cast<size_t>(piece.size_bytes));
        std::move(landed)(OkStatus());
        return OkStatus();
      },
      counter);
  ASSERT_TRUE(status.ok()) << status;
  counter->Done(OkStatus());
  ASSERT_TRUE(finished.future().Await().ok());
  EXPECT_GE(reads, 2);
  for (int64_t row = 0; row < 1000; ++row) {
    for (int64_t col = 0; col < 10; ++col) {
      const float got = destination[row * 10 + col];
      if (col % 2 == 1) {
        ASSERT_EQ(got, -1.0f) << "a byte between the strided elements was written";
      } else {
        ASSERT_EQ(got, BF16BitsToF32(device[row * 5 + col / 2])) << row << "," << col;
      }
    }
  }
}

TEST(StagingRingTest, AWriterErrorStopsTheLoopAndReturnsEveryChunk) {
  std::atomic<int> live{0};
  int made = 0;
  StagingRing ring("test", CountingChunks(&live, &made), 2, 4096);
  std::vector<float> source(10000, 1.0f);
  Promise<> finished;
  auto counter = std::make_shared<PieceCounter>([finished](Status s) { finished.Set(s); });
  int calls = 0;
  Status status = StagedWrite(
      ring, HostView::Dense(source.data(), DType::kF32, {10000}), DType::kF16,
      [&](const StagingChunk&, const StagedPiece&, ChunkDone done) -> Status {
        if (++calls == 3) return InternalError("the device refused chunk 3");
        std::move(done)(OkStatus());
        return OkStatus();
      },
      counter);
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(calls, 3);
  counter->Done(status);
  EXPECT_EQ(finished.future().Await().code(), absl::StatusCode::kInternal);
  // Both chunks are free again: two more acquisitions do not wait.
  StatusOr<StagingChunk*> first = ring.Acquire();
  StatusOr<StagingChunk*> second = ring.Acquire();
  ASSERT_TRUE(first.ok() && second.ok());
  ring.Release(*first);
  ring.Release(*second);
}

TEST(StagingRingTest, AnEmptyTensorIsOneEmptyLastPiece) {
  std::atomic<int> live{0};
  int made = 0;
  StagingRing ring("test", CountingChunks(&live, &made), 2, 4096);
  std::vector<StagedPiece> pieces;
  Promise<> finished;
  auto counter = std::make_shared<PieceCounter>([finished](Status s) { finished.Set(s); });
  float unused = 0;
  Status status = StagedWrite(
      ring, HostView::Dense(&unused, DType::kF32, {0, 3}), DType::kBF16,
      [&](const StagingChunk&, const StagedPiece& piece, ChunkDone done) {
        pieces.push_back(piece);
        std::move(done)(OkStatus());
        return OkStatus();
      },
      counter);
  ASSERT_TRUE(status.ok()) << status;
  counter->Done(OkStatus());
  EXPECT_TRUE(finished.future().Await().ok());
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_EQ(pieces[0].size_bytes, 0);
  EXPECT_TRUE(pieces[0].last);
}

TEST(StagingRingTest, AChunkThatCannotBeMadeIsAnErrorNamingTheRing) {
  StagingChunkAllocator failing;
  failing.allocate = [](int64_t) -> StatusOr<StagingChunk> {
    return ResourceExhaustedError("no pinned memory left");
  };
  failing.free = [](const StagingChunk&, int64_t) { FAIL() << "nothing was made"; };
  StagingRing ring("opencl:9", std::move(failing), 2, 4096);
  StatusOr<StagingChunk*> chunk = ring.Acquire();
  ASSERT_EQ(chunk.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(chunk.status().message().find("opencl:9"), std::string_view::npos);
  EXPECT_NE(chunk.status().message().find("no pinned memory left"), std::string_view::npos);
}

TEST(StagingRingTest, ShutdownCancelsQueuedJobsAndRefusesNewOnes) {
  std::atomic<int> live{0};
  int made = 0;
  StagingRing ring("the test client", CountingChunks(&live, &made));
  Promise<> release_first;
  Promise<> first_started;
  std::vector<Status> results(3);
  ASSERT_TRUE(ring.Submit([&](Status status) {
                    first_started.Set(OkStatus());
                    results[0] = status;
                    release_first.future().Await().IgnoreError();
                  })
                  .ok());
  ASSERT_TRUE(first_started.future().Await().ok());
  // Shutdown runs the queued job (cancelled) on its own thread before it joins the worker; only
  // then may the running job finish.
  ASSERT_TRUE(ring.Submit([&](Status status) {
                    results[1] = status;
                    release_first.Set(OkStatus());
                  })
                  .ok());
  ring.Shutdown();
  EXPECT_TRUE(results[0].ok());
  EXPECT_EQ(results[1].code(), absl::StatusCode::kCancelled);
  EXPECT_NE(results[1].message().find("the test client"), std::string_view::npos);
  Status refused = ring.Submit([&](Status status) { results[2] = status; });
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(results[2].ok()) << "a refused job is never called";
}

}  // namespace
}  // namespace ferry
