// A client destroyed with work in flight: no crash, no hang, no leak; every on_done runs exactly
// once; every future completes (OK, or Cancelled for work that never started); buffers that
// outlive their client fail cleanly with FailedPrecondition.
#include <chrono>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "conformance_suite.h"
#include "ferry/device/buffer_writer.h"
#include "tests/call_on_its_own_thread.h"

namespace ferry::conformance {
namespace {

class ConformanceShutdown : public ConformanceTest {};

struct InFlight {
  std::string name;
  HostBytes source;
  HostView view;
  std::unique_ptr<Buffer> buffer;
  std::shared_ptr<OnDoneRecord> record;
  std::weak_ptr<int> keep_alive_watch;
  bool alias = false;
};

// Starts `count` few-MiB transfers down every path (dense, converting, strided, zero-copy).
void StartTransfers(std::mt19937_64& rng, Client& client, int count,
                    std::vector<InFlight>* in_flight) {
  Device* device = client.devices()[0];
  const std::vector<int64_t> dims = {512, 1024};  // 2 MiB of f32
  // Sources first, then every put back to back, so that work is still queued at the end.
  const size_t first = in_flight->size();
  for (int i = 0; i < count; ++i) {
    InFlight transfer;
    transfer.name = absl::StrFormat("in_flight.%d", i);
    transfer.source = RandomDenseTensor(rng, DType::kF32, dims);
    transfer.view = HostView::Dense(transfer.source.data(), DType::kF32, dims);
    if (i % 4 == 2) {  // transposed
      transfer.view =
          HostView(transfer.source.data(), DType::kF32, {dims[1], dims[0]}, {4, dims[1] * 4});
    }
    transfer.record = std::make_shared<OnDoneRecord>();
    in_flight->push_back(std::move(transfer));
  }
  for (int i = 0; i < count; ++i) {
    InFlight& transfer = (*in_flight)[first + i];
    const DType narrow = device->capabilities().Holds(DType::kBF16) ? DType::kBF16 : DType::kS32;
    const DType device_dtype = i % 4 == 1 ? narrow : DType::kF32;
    const HostBufferSemantics semantics =
        i % 4 == 3 ? HostBufferSemantics::kImmutableZeroCopy
                   : HostBufferSemantics::kImmutableUntilTransferCompletes;
    auto keep_alive = std::make_shared<int>(i);
    transfer.keep_alive_watch = keep_alive;
    StatusOr<std::unique_ptr<Buffer>> buffer = client.BufferFromHostBuffer(
        transfer.view, device_dtype, device, semantics,
        MakeRecordingOnDone(transfer.record, {.keep_alive = std::move(keep_alive)}), transfer.name);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    transfer.record->CallReturned();
    transfer.buffer = std::move(buffer).value();
    transfer.alias = transfer.buffer->is_alias();
  }
}

TEST_P(ConformanceShutdown, ClientDestroyedWithTransfersInFlightFinishesOrCancelsEach) {
  // Three timings: at once, after the first transfer finished, after a short while.
  for (int round = 0; round < 3; ++round) {
    SCOPED_TRACE(absl::StrFormat("round %d", round));
    // One worker in round 0, so that most transfers are still queued when the client goes.
    ClientOptions options;
    if (round == 0) options.num_worker_threads = 1;
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> doomed, MakeClient(options));
    std::vector<InFlight> in_flight;
    ASSERT_NO_FATAL_FAILURE(StartTransfers(rng(), *doomed, 12, &in_flight));
    if (round == 1) CT_ASSERT_READY_OK(in_flight[0].buffer->Ready());
    if (round == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    doomed.reset();

    int finished = 0;
    int cancelled = 0;
    for (InFlight& transfer : in_flight) {
      SCOPED_TRACE(transfer.name);
      // No thread is left behind: every copying transfer has run its on_done by now, and every
      // Ready() has completed.
      if (!transfer.alias) {
        EXPECT_EQ(transfer.record->Calls(), 1) << "on_done has not run when the client is gone";
        EXPECT_TRUE(transfer.record->returned);
      }
      EXPECT_TRUE(transfer.buffer->Ready().IsReady()) << "Ready() still pending after shutdown";
      const std::optional<Status> ready = AwaitFor(transfer.buffer->Ready());
      ASSERT_TRUE(ready.has_value()) << "Ready() never completed";
      if (ready->ok()) {
        ++finished;
      } else {
        EXPECT_TRUE(absl::IsCancelled(*ready)) << *ready;
        ++cancelled;
      }
      // The buffer outlives its client: reading it is an error, not a crash or a hang.
      std::vector<std::byte> dst(static_cast<size_t>(transfer.buffer->size_bytes()));
      const std::optional<Status> read = AwaitFor(transfer.buffer->ToHost(MutableHostView::Dense(
          dst.data(), transfer.buffer->device_dtype(), transfer.buffer->dims())));
      ASSERT_TRUE(read.has_value()) << "ToHost after shutdown never completed";
      if (ready->ok()) {
        EXPECT_TRUE(absl::IsFailedPrecondition(*read))
            << *read << (transfer.alias ? " (an alias buffer)" : "");
      } else {
        EXPECT_FALSE(read->ok()) << "a cancelled buffer was read";
      }
    }
    std::cout << "[     INFO ] round " << round << ": " << finished << " finished, " << cancelled
              << " cancelled\n";
    for (InFlight& transfer : in_flight) transfer.buffer.reset();
    for (InFlight& transfer : in_flight) {
      SCOPED_TRACE(transfer.name);
      EXPECT_EQ(transfer.record->Calls(), 1) << "on_done must run exactly once";
      EXPECT_TRUE(transfer.keep_alive_watch.expired()) << "the on_done callback was leaked";
    }
  }
}

// Reads in flight when the client goes complete (OK with the right bytes, or an error).
TEST_P(ConformanceShutdown, ReadsInFlightWhenTheClientIsDestroyedComplete) {
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> doomed, MakeClient({}));
  std::vector<InFlight> in_flight;
  ASSERT_NO_FATAL_FAILURE(StartTransfers(rng(), *doomed, 8, &in_flight));
  std::vector<std::vector<std::byte>> reads;
  std::vector<Future<>> futures;
  for (InFlight& transfer : in_flight) {
    reads.emplace_back(transfer.source.size());
    futures.push_back(transfer.buffer->ToHost(
        MutableHostView::Dense(reads.back().data(), DType::kF32, transfer.buffer->dims())));
  }
  doomed.reset();
  for (size_t i = 0; i < in_flight.size(); ++i) {
    SCOPED_TRACE(in_flight[i].name);
    const std::optional<Status> read = AwaitFor(futures[i]);
    ASSERT_TRUE(read.has_value()) << "a read in flight never completed";
    if (!read->ok()) continue;  // cancelled or refused: fine, as long as it completed
    // An OK read holds the source, through the device dtype.
    const DType device_dtype = in_flight[i].buffer->device_dtype();
    const std::vector<std::byte> device_bytes =
        ReferenceDeviceBytes(in_flight[i].view, device_dtype);
    std::vector<std::byte> expected(reads[i].size());
    const ConvertKernel to_f32 = ReferenceKernel(device_dtype, DType::kF32);
    to_f32(device_bytes.data(), DTypeSize(device_dtype), expected.data(), 4,
           static_cast<int64_t>(expected.size() / 4));
    EXPECT_TRUE(BytesEqual(expected, reads[i]));
  }
  for (InFlight& transfer : in_flight) transfer.buffer.reset();
  for (InFlight& transfer : in_flight) EXPECT_EQ(transfer.record->Calls(), 1);
}

// A client destroyed before the BufferWriter of a buffer with reads waiting for its fill (a
// loader holding client and writers in one object, the client declared last): the destructor
// returns, and the reads fail once the writer goes (before: opencl's destructor waited for those
// reads, which waited for the writer destroyed after it: a hang). On a thread of its own, so a
// hang fails the test instead of stalling it.
TEST_P(ConformanceShutdown, ClientDestroyedBeforeAWriterWhoseBufferIsBeingReadReturns) {
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> doomed, MakeClient({}));
  StatusOr<std::unique_ptr<BufferWriter>> made =
      doomed->CreateBufferWriter(DType::kF32, {1024}, doomed->devices()[0], {}, "never filled");
  if (absl::IsUnimplemented(made.status())) {
    GTEST_SKIP() << "this backend has no create-then-fill into its default memory: "
                 << made.status().message();
  }
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<BufferWriter> writer = *std::move(made);
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer, writer->TakeBuffer());
  std::vector<float> whole(1024), part(256);
  const Future<> whole_read =
      buffer->ToHost(MutableHostView::Dense(whole.data(), DType::kF32, {1024}));
  const Future<> part_read = buffer->CopyRawToHost(1024, 1024, part.data());
  test_support::CallOnItsOwnThread destroyer([&] { doomed.reset(); });
  const bool returned = destroyer.ReturnedWithin(std::chrono::seconds(30));
  EXPECT_TRUE(returned) << "the client's destructor waited for reads of an unfilled buffer";
  writer.reset();  // lets a waiting destructor go, so the test ends either way
  destroyer.Join();
  for (const Future<>& read : {whole_read, part_read}) {
    const std::optional<Status> done = AwaitFor(read);
    ASSERT_TRUE(done.has_value()) << "a read of the abandoned buffer never completed";
    EXPECT_FALSE(done->ok());
  }
  buffer.reset();
}

// A ready buffer that outlives its client keeps its Ready() result and fails every read with
// FailedPrecondition, without touching the destination.
TEST_P(ConformanceShutdown, BufferOutlivingItsClientFailsWithFailedPrecondition) {
  HostBytes source = RandomDenseTensor(rng(), DType::kU16, {40, 40});
  auto record = std::make_shared<OnDoneRecord>();
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      client().BufferFromHostBuffer(
          HostView::Dense(source.data(), DType::kU16, {40, 40}), DType::kU16, device(),
          HostBufferSemantics::kImmutableUntilTransferCompletes, MakeRecordingOnDone(record)));
  CT_ASSERT_READY_OK(buffer->Ready());
  DestroyClient();
  EXPECT_EQ(record->Calls(), 1);
  const std::optional<Status> ready = AwaitFor(buffer->Ready());
  ASSERT_TRUE(ready.has_value());
  EXPECT_TRUE(ready->ok()) << "a completed transfer changed its result: " << *ready;
  EXPECT_EQ(buffer->dims(), Dims({40, 40}));
  EXPECT_EQ(buffer->device_dtype(), DType::kU16);
  HostBytes dst(40 * 40 * 2);
  FillRandom(rng(), DType::kU8, dst.span());
  const std::vector<std::byte> before = dst.ToVector();
  for (DType dtype : {DType::kU16, DType::kF32}) {
    const std::optional<Status> read =
        AwaitFor(buffer->ToHost(MutableHostView::Dense(dst.data(), dtype, {40, 10})));
    ASSERT_TRUE(read.has_value()) << "ToHost after shutdown never completed";
    EXPECT_FALSE(read->ok());
    const std::optional<Status> proper =
        AwaitFor(buffer->ToHost(MutableHostView::Dense(dst.data(), DType::kU16, {40, 40})));
    ASSERT_TRUE(proper.has_value());
    EXPECT_TRUE(absl::IsFailedPrecondition(*proper)) << *proper;
  }
  EXPECT_TRUE(BytesEqual(before, dst.span()));
  buffer.reset();
  EXPECT_EQ(record->Calls(), 1);
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceShutdown);

}  // namespace
}  // namespace ferry::conformance
