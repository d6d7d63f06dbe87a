// Memory spaces (Device::memory_spaces) and create-then-fill (Client::CreateBufferWriter): a
// buffer made first and written in pieces at any offsets, in any order, held to one contract on
// every backend.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <thread>
#include <vector>

#include "conformance_suite.h"
#include "ferry/device/buffer_writer.h"
#include "tests/call_on_its_own_thread.h"

namespace ferry::conformance {
namespace {

class ConformanceWriter : public ConformanceTest {};

TEST_P(ConformanceWriter, EveryDeviceHasOneDefaultMemorySpaceFirst) {
  for (Device* each : client().devices()) {
    const std::vector<MemorySpace> spaces = each->memory_spaces();
    ASSERT_FALSE(spaces.empty()) << each->name();
    EXPECT_TRUE(spaces.front().is_default) << each->name();
    EXPECT_EQ(std::count_if(spaces.begin(), spaces.end(),
                            [](const MemorySpace& space) { return space.is_default; }),
              1)
        << each->name();
    for (const MemorySpace& space : spaces) EXPECT_FALSE(space.kind.empty()) << each->name();
  }
}

// Pieces of random sizes written in random order, through every memory space of the device, read
// back exactly; the buffer becomes ready only with its last piece.
TEST_P(ConformanceWriter, PiecesInAnyOrderFillTheBufferExactly) {
  const Dims dims = {129, 33};
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, dims);
  const int64_t size = source.size();
  for (const MemorySpace& space : device()->memory_spaces()) {
    SCOPED_TRACE("memory space " + space.kind);
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<BufferWriter> writer,
        client().CreateBufferWriter(DType::kF32, dims, device(), space.kind, "filled"));
    EXPECT_EQ(writer->size_bytes(), size);
    EXPECT_EQ(writer->memory_kind(), space.kind);
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
    EXPECT_EQ(buffer->memory_kind(), space.kind);
    // Cut [0, size) at random points and write the pieces shuffled.
    std::vector<int64_t> cuts = {0, size};
    for (int i = 0; i < 9; ++i) cuts.push_back(static_cast<int64_t>(rng()() % (size + 1)));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    std::vector<std::pair<int64_t, int64_t>> pieces;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) pieces.emplace_back(cuts[i], cuts[i + 1]);
    std::shuffle(pieces.begin(), pieces.end(), rng());
    for (size_t i = 0; i < pieces.size(); ++i) {
      const auto [begin, end] = pieces[i];
      // Each piece goes through a temporary that is scribbled over once the write says so.
      std::vector<std::byte> piece(source.data() + begin, source.data() + end);
      CT_ASSERT_READY_OK(writer->Write(begin, piece.data(), end - begin));
      std::fill(piece.begin(), piece.end(), std::byte{0x5a});
      if (i + 1 < pieces.size()) {
        EXPECT_FALSE(AwaitFor(buffer->Ready(), std::chrono::milliseconds(0)).has_value())
            << "ready before its last piece";
      }
    }
    EXPECT_EQ(writer->bytes_written(), size);
    CT_ASSERT_READY_OK(buffer->Ready());
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, ReadBack(*buffer));
    EXPECT_TRUE(BytesEqual(absl::MakeConstSpan(source.data(), size), back));
  }
}

// In-place filling (HostWritableBytes + Written): where a backend hands out its buffer's host
// memory, ranges written there and reported complete the buffer exactly as Writes would, mixed
// with Writes, overlaps refused; where it does not, Written is FailedPrecondition and the fill
// goes on through Write.
TEST_P(ConformanceWriter, InPlaceRangesFillTheBufferWhereTheHostCanWriteIt) {
  const Dims dims = {64, 16};
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, dims);
  const int64_t size = source.size();
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<BufferWriter> writer,
                          client().CreateBufferWriter(DType::kF32, dims, device(), {}, "in place"));
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
  auto* bytes = static_cast<std::byte*>(writer->HostWritableBytes());
  if (bytes == nullptr) {
    const Status refused = writer->Written(0, size);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
    CT_ASSERT_READY_OK(writer->Write(0, source.data(), size));
  } else {
    const int64_t half = size / 2;
    std::memcpy(bytes + half, source.data() + half, static_cast<size_t>(size - half));
    CT_ASSERT_OK(writer->Written(half, size - half));
    EXPECT_FALSE(AwaitFor(buffer->Ready(), std::chrono::milliseconds(0)).has_value())
        << "ready before its first half";
    EXPECT_EQ(writer->Written(half - 4, 8).code(), absl::StatusCode::kInvalidArgument)
        << "an overlap is refused";
    EXPECT_EQ(writer->Written(0, size + 4).code(), absl::StatusCode::kInvalidArgument);
    CT_ASSERT_READY_OK(writer->Write(0, source.data(), half));
    EXPECT_EQ(writer->Written(0, 4).code(), absl::StatusCode::kFailedPrecondition)
        << "the fill has ended";
  }
  CT_ASSERT_READY_OK(buffer->Ready());
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, ReadBack(*buffer));
  EXPECT_TRUE(BytesEqual(absl::MakeConstSpan(source.data(), size), back));
}

TEST_P(ConformanceWriter, BadWritesAreRefusedAndLeaveTheFillGoing) {
  alignas(64) float data[64];
  std::iota(data, data + 64, 1.0f);
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<BufferWriter> writer,
                          client().CreateBufferWriter(DType::kF32, {64}, device(), {}, "w"));
  CT_ASSERT_READY_OK(writer->Write(0, data, 128));
  for (const auto& [offset, count] : std::vector<std::pair<int64_t, int64_t>>{
           {-4, 4}, {250, 8}, {0, 257}, {0, -1}, {124, 8}, {64, 4}, {0, 4}}) {
    SCOPED_TRACE(testing::Message() << "bytes [" << offset << ", +" << count << ")");
    const std::optional<Status> status = AwaitFor(writer->Write(offset, data, count));
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->code(), absl::StatusCode::kInvalidArgument) << *status;
  }
  const std::optional<Status> null_data = AwaitFor(writer->Write(128, nullptr, 4));
  ASSERT_TRUE(null_data.has_value());
  EXPECT_EQ(null_data->code(), absl::StatusCode::kInvalidArgument);
  // The good half still completes the buffer.
  CT_ASSERT_READY_OK(writer->Write(128, reinterpret_cast<std::byte*>(data) + 128, 128));
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> back, ReadBack(*buffer));
  EXPECT_TRUE(BytesEqual(absl::MakeConstSpan(reinterpret_cast<std::byte*>(data), 256), back));
  // After the last byte the fill has ended; the buffer can be taken once.
  const std::optional<Status> late = AwaitFor(writer->Write(0, data, 4));
  ASSERT_TRUE(late.has_value());
  EXPECT_EQ(late->code(), absl::StatusCode::kFailedPrecondition) << *late;
  EXPECT_EQ(writer->TakeBuffer().status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_P(ConformanceWriter, AnUnfinishedFillFailsTheBufferInsteadOfHanging) {
  alignas(64) float data[16] = {};
  std::unique_ptr<Buffer> aborted;
  std::unique_ptr<Buffer> dropped;
  {
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<BufferWriter> writer,
                            client().CreateBufferWriter(DType::kF32, {16}, device(), {}, "a"));
    CT_ASSERT_OK_AND_ASSIGN(aborted, writer->TakeBuffer());
    CT_ASSERT_READY_OK(writer->Write(0, data, 32));
    writer->Abort(CancelledError("the producer gave up"));
    const std::optional<Status> after = AwaitFor(writer->Write(32, data, 32));
    ASSERT_TRUE(after.has_value());
    EXPECT_EQ(after->code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<BufferWriter> writer,
                            client().CreateBufferWriter(DType::kF32, {16}, device(), {}, "d"));
    CT_ASSERT_OK_AND_ASSIGN(dropped, writer->TakeBuffer());
    CT_ASSERT_READY_OK(writer->Write(8, data, 16));
  }  // destroyed with 48 of 64 bytes missing
  const std::optional<Status> aborted_ready = AwaitFor(aborted->Ready());
  ASSERT_TRUE(aborted_ready.has_value()) << "an aborted fill never completed Ready()";
  EXPECT_FALSE(aborted_ready->ok());
  EXPECT_NE(aborted_ready->message().find("the producer gave up"), std::string_view::npos)
      << *aborted_ready;
  const std::optional<Status> dropped_ready = AwaitFor(dropped->Ready());
  ASSERT_TRUE(dropped_ready.has_value()) << "a dropped writer never completed Ready()";
  EXPECT_FALSE(dropped_ready->ok());
  EXPECT_NE(dropped_ready->message().find("48 of its 64 bytes"), std::string_view::npos)
      << *dropped_ready;
  // Reads of a failed buffer fail too, and never hang.
  std::vector<float> back(16);
  const std::optional<Status> read =
      AwaitFor(dropped->ToHost(MutableHostView::Dense(back.data(), DType::kF32, {16})));
  ASSERT_TRUE(read.has_value());
  EXPECT_FALSE(read->ok());
}

// Calls that return a future never wait before returning it: a whole and a partial read of a
// buffer whose fill has not finished come back pending at once, and complete with the bytes once
// the fill does. The calls run on a thread of their own, so one that waits for the fill fails the
// test instead of hanging it (the fill is finished all the same, which lets that call go).
TEST_P(ConformanceWriter, ReadsOfABufferStillBeingFilledReturnAtOnce) {
  constexpr int64_t kCount = 1024;
  std::vector<float> source(kCount);
  for (int64_t i = 0; i < kCount; ++i) source[i] = static_cast<float>(3 * i + 1);
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<BufferWriter> writer,
      client().CreateBufferWriter(DType::kF32, {kCount}, device(), {}, "filled later"));
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
  CT_ASSERT_READY_OK(writer->Write(0, source.data(), kCount * 2));

  std::vector<float> whole(kCount, -1.0f), part(kCount / 4, -1.0f);
  Future<> whole_read, part_read;
  test_support::CallOnItsOwnThread caller([&] {
    whole_read = buffer->ToHost(MutableHostView::Dense(whole.data(), DType::kF32, {kCount}));
    part_read = buffer->CopyRawToHost(kCount * 3, kCount, part.data());
  });
  const bool returned_at_once = caller.ReturnedWithin(std::chrono::seconds(30));
  EXPECT_TRUE(returned_at_once) << "ToHost or CopyRawToHost waited for the fill to finish";
  if (returned_at_once) {
    EXPECT_FALSE(whole_read.IsReady()) << "the fill has not finished: the read cannot have";
    EXPECT_FALSE(part_read.IsReady()) << "the fill has not finished: the read cannot have";
  }
  CT_ASSERT_READY_OK(writer->Write(kCount * 2, source.data() + kCount / 2, kCount * 2));
  caller.Join();
  const std::optional<Status> whole_done = AwaitFor(whole_read);
  const std::optional<Status> part_done = AwaitFor(part_read);
  ASSERT_TRUE(whole_done.has_value()) << "the read did not finish after the fill did";
  ASSERT_TRUE(part_done.has_value()) << "the partial read did not finish after the fill did";
  ASSERT_TRUE(whole_done->ok()) << *whole_done;
  ASSERT_TRUE(part_done->ok()) << *part_done;
  EXPECT_EQ(whole, source);
  EXPECT_EQ(part, std::vector<float>(source.end() - kCount / 4, source.end()));
}

// A continuation on Ready() may call back into the writer: the writer never completes a future
// while it holds its lock (before, host, opencl and pjrt completed Ready() from inside Write and
// Abort with the writer's mutex held, and a continuation asking bytes_written() never returned).
// Each case runs on a thread of its own, so a deadlock fails the test instead of hanging it.
TEST_P(ConformanceWriter, ContinuationsOnReadyMayCallBackIntoTheWriter) {
  for (const bool abort : {false, true}) {
    SCOPED_TRACE(abort ? "the fill aborted" : "the fill completed");
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<BufferWriter> writer,
                            client().CreateBufferWriter(DType::kF32, {16}, device(), {}, "c"));
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
    auto written_seen = std::make_shared<std::atomic<int64_t>>(-1);
    Promise<> continued;
    BufferWriter* raw_writer = writer.get();
    buffer->Ready().OnReady([raw_writer, written_seen, continued](const Status&) {
      // Every question a continuation may ask, and a late abort and write, which are refused.
      const int64_t written = raw_writer->bytes_written();
      raw_writer->Abort(CancelledError("from the continuation"));
      const bool late_refused =
          raw_writer->Write(0, nullptr, 0).Await().code() == absl::StatusCode::kFailedPrecondition;
      written_seen->store(late_refused ? written : -2);
      continued.Set(OkStatus());
    });
    alignas(64) static float data[16] = {};
    Promise<> filled;
    std::thread filler([raw_writer, filled, abort] {
      Status status = OkStatus();
      if (abort) {
        raw_writer->Abort(CancelledError("the producer gave up"));
      } else {
        const std::optional<Status> first = AwaitFor(raw_writer->Write(0, data, 32));
        const std::optional<Status> last = AwaitFor(raw_writer->Write(32, data, 32));
        if (!first.has_value() || !last.has_value())
          status = absl::DeadlineExceededError("a write hung");
      }
      filled.Set(status);
    });
    const std::optional<Status> fill = AwaitFor(filled.future(), std::chrono::seconds(30));
    if (!fill.has_value()) {
      filler.detach();   // deadlocked: leave it, and fail below
      writer.release();  // its lock is held for ever: destroying it would hang as well
      FAIL() << "the writer deadlocked with a continuation on Ready() calling back into it";
    }
    filler.join();
    EXPECT_TRUE(fill->ok()) << *fill;
    ASSERT_TRUE(AwaitFor(continued.future()).has_value()) << "the continuation never finished";
    EXPECT_EQ(written_seen->load(), abort ? 0 : 64);
  }
}

TEST_P(ConformanceWriter, AnEmptyBufferIsReadyAtOnce) {
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<BufferWriter> writer,
                          client().CreateBufferWriter(DType::kF32, {0, 5}, device(), {}, "e"));
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
  CT_ASSERT_READY_OK(buffer->Ready());
  EXPECT_EQ(buffer->size_bytes(), 0);
}

TEST_P(ConformanceWriter, BadArgumentsAreRefusedBeforeAnythingIsMade) {
  const std::pair<const char*, StatusOr<std::unique_ptr<BufferWriter>>> cases[] = {
      {"negative dim", client().CreateBufferWriter(DType::kF32, {4, -1}, device(), {}, "n")},
      {"no device", client().CreateBufferWriter(DType::kF32, {4}, nullptr, {}, "n")},
      {"invalid dtype",
       client().CreateBufferWriter(static_cast<DType>(200), {4}, device(), {}, "n")},
      {"unknown memory", client().CreateBufferWriter(DType::kF32, {4}, device(), "nowhere", "n")},
      {"overflow", client().CreateBufferWriter(DType::kF64, {int64_t{1} << 40, int64_t{1} << 30},
                                               device(), {}, "n")},
  };
  for (const auto& [what, result] : cases) {
    SCOPED_TRACE(what);
    ASSERT_FALSE(result.ok());
    EXPECT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
  }
  EXPECT_NE(cases[3].second.status().message().find("nowhere"), std::string_view::npos);
  EXPECT_EQ(device()->bytes_in_use(), 0);
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceWriter);

}  // namespace
}  // namespace ferry::conformance
