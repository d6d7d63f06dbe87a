// Lifetimes across the device API and the runtime on top of it: no memory is freed, and no
// `on_done` runs, while a transfer still uses it; a buffer (or a runtime `Data` handle) that
// outlives its client fails every call cleanly instead of reaching into the dead client. Each
// case was a use-after-free once (issue 14); under AddressSanitizer a regression is a report,
// and in every build the test also checks what it can see without one.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "conformance_suite.h"
#include "ferry/runtime/transfer.h"

namespace ferry::conformance {
namespace {

class ConformanceLifetime : public ConformanceTest {};

// Forwards to a backend's buffer, but starts each ToHost only `delay` later, on a thread of its
// own: a read that is certainly still running when the caller moves on.
class SlowToHostBuffer final : public Buffer {
 public:
  SlowToHostBuffer(std::unique_ptr<Buffer> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  ~SlowToHostBuffer() override {
    for (std::thread& read : reads_) read.join();
  }

  Device* device() const override { return inner_->device(); }
  DType device_dtype() const override { return inner_->device_dtype(); }
  const Dims& dims() const override { return inner_->dims(); }
  int64_t size_bytes() const override { return inner_->size_bytes(); }
  Future<> Ready() const override { return inner_->Ready(); }
  Future<> ToHost(const MutableHostView& dst) override {
    Promise<> done;
    reads_.emplace_back([this, dst, done]() mutable {
      std::this_thread::sleep_for(delay_);
      done.Set(inner_->ToHost(dst).Await());
    });
    return done.future();
  }

 private:
  std::unique_ptr<Buffer> inner_;
  const std::chrono::milliseconds delay_;
  std::vector<std::thread> reads_;  // ToHost is called from one thread in these tests
};

// TransferFromDevice returns an error found after it has started reads (a null handle later in
// the batch) only once those reads are over: they write into the host tensors it frees on return.
TEST_P(ConformanceLifetime, TransferFromDeviceReturnsAnErrorOnlyAfterTheReadsItStarted) {
  const Dims dims = {256, 1024};  // 1 MiB of f32
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, dims);
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      client().BufferFromHostBuffer(HostView::Dense(source.data(), DType::kF32, dims), DType::kF32,
                                    device(), HostBufferSemantics::kImmutableOnlyDuringCall,
                                    nullptr, "slow_read"));
  CT_ASSERT_READY_OK(buffer->Ready());
  auto slow = std::make_unique<SlowToHostBuffer>(std::move(buffer), std::chrono::milliseconds(200));
  std::vector<DataPtr> batch = {std::make_shared<Data>(std::move(slow), DType::kF32, "slow_read"),
                                nullptr};

  const auto start = std::chrono::steady_clock::now();
  StatusOr<std::vector<HostTensor>> read = TransferFromDevice(batch);
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(read.status())) << read.status();
  EXPECT_NE(read.status().message().find("handle 1 is null"), std::string::npos) << read.status();
  // The started read could only have finished after its 200 ms delay: returning sooner means it
  // went on writing into a freed tensor.
  EXPECT_GE(waited, std::chrono::milliseconds(200))
      << "TransferFromDevice returned while a read it started was still running";
}

// A buffer, and a runtime Data handle, that outlive their client: every call answers without
// touching the dead client or its devices. Ready() keeps its result; reads and host views are
// FailedPrecondition (a host view may instead be Unimplemented where the backend has none); the
// runtime names the tensor and its device in the error.
TEST_P(ConformanceLifetime, EveryCallOnABufferWhoseClientIsGoneFailsCleanly) {
  const Dims dims = {64, 48};
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, dims);
  const HostView view = HostView::Dense(source.data(), DType::kF32, dims);
  struct Case {
    std::string name;
    std::unique_ptr<Buffer> buffer;
    DataPtr data;  // the same kind of buffer, in a runtime handle
  };
  std::vector<Case> cases;
  const std::string device_name = device()->name();
  for (HostBufferSemantics semantics : {HostBufferSemantics::kImmutableOnlyDuringCall,
                                        HostBufferSemantics::kImmutableUntilTransferCompletes,
                                        HostBufferSemantics::kImmutableZeroCopy}) {
    Case added;
    added.name = std::string(HostBufferSemanticsName(semantics));
    CT_ASSERT_OK_AND_ASSIGN(
        added.buffer,
        client().BufferFromHostBuffer(view, DType::kF32, device(), semantics, nullptr, added.name));
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> for_data,
        client().BufferFromHostBuffer(view, DType::kF32, device(), semantics, nullptr, added.name));
    CT_ASSERT_READY_OK(added.buffer->Ready());
    CT_ASSERT_READY_OK(for_data->Ready());
    added.data = std::make_shared<Data>(std::move(for_data), DType::kF32, added.name);
    cases.push_back(std::move(added));
  }
  DestroyClient();

  for (Case& each : cases) {
    SCOPED_TRACE(each.name + (each.buffer->is_alias() ? " (an alias)" : ""));
    Buffer& buffer = *each.buffer;
    EXPECT_EQ(buffer.device_dtype(), DType::kF32);
    EXPECT_EQ(buffer.dims(), dims);
    EXPECT_EQ(buffer.size_bytes(), NumElements(dims) * 4);
    const std::optional<Status> ready = AwaitFor(buffer.Ready());
    ASSERT_TRUE(ready.has_value());
    EXPECT_TRUE(ready->ok()) << *ready;

    std::vector<std::byte> dst(static_cast<size_t>(buffer.size_bytes()));
    const std::optional<Status> read =
        AwaitFor(buffer.ToHost(MutableHostView::Dense(dst.data(), DType::kF32, dims)));
    ASSERT_TRUE(read.has_value()) << "ToHost after the client is gone never completed";
    EXPECT_TRUE(absl::IsFailedPrecondition(*read)) << *read;

    const StatusOr<HostView> host_view = buffer.HostAccessibleView();
    EXPECT_TRUE(absl::IsFailedPrecondition(host_view.status()) ||
                absl::IsUnimplemented(host_view.status()))
        << host_view.status();

    // The runtime on the same kind of buffer.
    EXPECT_EQ(each.data->device_name(), device_name);
    EXPECT_EQ(each.data->dims(), dims);
    CT_EXPECT_OK(AwaitReady({each.data}));
    const StatusOr<std::vector<HostTensor>> tensors = TransferFromDevice({each.data});
    ASSERT_FALSE(tensors.ok());
    EXPECT_TRUE(absl::IsFailedPrecondition(tensors.status())) << tensors.status();
    const std::string message(tensors.status().message());
    EXPECT_NE(message.find("'" + each.name + "'"), std::string::npos) << message;
    EXPECT_NE(message.find(device_name), std::string::npos) << message;
  }
}

// A buffer destroyed while a ToHost still reads it: the read completes with the right bytes, and
// where the buffer aliases the caller's memory, that memory is released (on_done) only after the
// read, however early the buffer goes. The on_done here poisons the source and then frees it.
TEST_P(ConformanceLifetime, BufferDestroyedWhileItIsReadReleasesItsSourceOnlyAfterTheRead) {
  const Dims dims = {1024, 1024};  // 4 MiB of f32: read by the engine, not inline
  auto source = std::make_shared<HostBytes>(RandomDenseTensor(rng(), DType::kF32, dims));
  const std::vector<std::byte> expected = source->ToVector();
  const HostView view = HostView::Dense(source->data(), DType::kF32, dims);
  auto record = std::make_shared<OnDoneRecord>();
  std::weak_ptr<HostBytes> source_watch = source;
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      client().BufferFromHostBuffer(
          view, DType::kF32, device(), HostBufferSemantics::kImmutableZeroCopy,
          MakeRecordingOnDone(record, {.poison = source->span(), .keep_alive = source}),
          "read_while_destroyed"));
  source.reset();  // from here the on_done callback owns the source memory
  record->CallReturned();
  CT_ASSERT_READY_OK(buffer->Ready());
  const bool alias = buffer->is_alias();

  // Work queued ahead of the read, so that the read is still to run when the buffer goes.
  const Dims blocker_dims = {4096, 4096};  // 64 MiB of f32
  HostBytes blocker_source(NumElements(blocker_dims) * 4);
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> blocker,
      client().BufferFromHostBuffer(
          HostView::Dense(blocker_source.data(), DType::kF32, blocker_dims), DType::kF32, device(),
          HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr, "blocker"));

  std::vector<std::byte> dst(expected.size());
  Future<> read = buffer->ToHost(MutableHostView::Dense(dst.data(), DType::kF32, dims));
  buffer.reset();
  if (alias) {
    // Nothing may release the source while the read still has it to do.
    // on_done first, then the read: a read that finishes between the two looks (rightly) done;
    // the other order would see a read still running and then on_done of its completion.
    const bool on_done_ran = record->Calls() > 0;
    EXPECT_TRUE(!on_done_ran || read.IsReady())
        << "on_done ran when the buffer was destroyed, before its running read had finished";
  }
  CT_ASSERT_READY_OK(read);
  EXPECT_TRUE(BytesEqual(expected, dst)) << "the read saw the source after on_done released it";
  EXPECT_EQ(record->WaitForCalls(1), 1);
  EXPECT_TRUE(source_watch.expired()) << "the source was never released";
  CT_ASSERT_READY_OK(blocker->Ready());
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceLifetime);

}  // namespace
}  // namespace ferry::conformance
