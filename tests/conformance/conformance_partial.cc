// Partial reads (Buffer::CopyRawToHost) and device-to-device copies (Buffer::CopyToDevice): what
// accelerators need beyond whole-buffer transfers, held to the same contract on every backend.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "conformance_suite.h"
#include "ferry/device/buffer_writer.h"
#include "ferry/runtime/transfer.h"
#include "tests/call_on_its_own_thread.h"

namespace ferry::conformance {
namespace {

class ConformancePartial : public ConformanceTest {
 protected:
  // Where the copy tests copy to: the backend's last device (of a client made with two devices
  // where the backend honours that) and the host backend's device, a copy through the host.
  struct CopyTargets {
    std::unique_ptr<Client> two_devices;
    std::unique_ptr<Client> host;
    Client* owner = nullptr;  // the client the originals are put on
    std::vector<Device*> targets;
  };
  void MakeCopyTargets(CopyTargets& made) {
    if (backend().honours_num_devices_option) {
      CT_ASSERT_OK_AND_ASSIGN(made.two_devices, MakeClient(ClientOptions{.num_devices = 2}));
    }
    made.owner = made.two_devices != nullptr ? made.two_devices.get() : &client();
    CT_ASSERT_OK_AND_ASSIGN(made.host, CreateClient("host"));
    made.targets = {made.owner->devices().back(), made.host->devices()[0]};
  }
};

// Random byte ranges of a buffer (empty, whole, unaligned, the last byte) read back exactly the
// bytes a whole read gives, and nothing outside the range is written.
TEST_P(ConformancePartial, PartialReadsReturnExactlyTheirRange) {
  const Dims dims = {300, 37};
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, dims);
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      client().BufferFromHostBuffer(HostView::Dense(source.data(), DType::kF32, dims), DType::kF32,
                                    device(), HostBufferSemantics::kImmutableUntilTransferCompletes,
                                    nullptr, "partial"));
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> whole, ReadBack(*buffer));
  const int64_t size = buffer->size_bytes();
  ASSERT_EQ(size, static_cast<int64_t>(whole.size()));
  std::vector<std::pair<int64_t, int64_t>> ranges = {{0, 0}, {0, size}, {size - 1, 1}, {3, 5}};
  for (int i = 0; i < 20; ++i) {
    const int64_t offset = static_cast<int64_t>(rng()() % static_cast<uint64_t>(size));
    ranges.emplace_back(offset,
                        static_cast<int64_t>(rng()() % static_cast<uint64_t>(size - offset)));
  }
  for (const auto& [offset, count] : ranges) {
    SCOPED_TRACE(testing::Message() << "bytes [" << offset << ", +" << count << ")");
    std::vector<std::byte> dst(static_cast<size_t>(count) + 16, std::byte{0xa5});
    CT_ASSERT_READY_OK(buffer->CopyRawToHost(offset, count, dst.data() + 8));
    EXPECT_TRUE(BytesEqual(absl::MakeConstSpan(whole).subspan(offset, count),
                           absl::MakeConstSpan(dst).subspan(8, count)));
    for (int guard = 0; guard < 8; ++guard) {
      EXPECT_EQ(dst[guard], std::byte{0xa5}) << "wrote before the destination";
      EXPECT_EQ(dst[8 + count + guard], std::byte{0xa5}) << "wrote past the destination";
    }
  }
}

TEST_P(ConformancePartial, PartialReadsOutsideTheBufferAreInvalidArgument) {
  alignas(64) float data[16] = {};
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer,
                          client().BufferFromHostBuffer(
                              HostView::Dense(data, DType::kF32, {16}), DType::kF32, device(),
                              HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "small"));
  std::vector<std::byte> dst(128);
  for (const auto& [offset, count] : std::vector<std::pair<int64_t, int64_t>>{
           {-1, 4}, {0, 65}, {64, 1}, {60, 8}, {0, -1}, {int64_t{1} << 62, int64_t{1} << 62}}) {
    SCOPED_TRACE(testing::Message() << "bytes [" << offset << ", +" << count << ")");
    const std::optional<Status> status = AwaitFor(buffer->CopyRawToHost(offset, count, dst.data()));
    ASSERT_TRUE(status.has_value());
    EXPECT_EQ(status->code(), absl::StatusCode::kInvalidArgument) << *status;
  }
  const std::optional<Status> null_dst = AwaitFor(buffer->CopyRawToHost(0, 4, nullptr));
  ASSERT_TRUE(null_dst.has_value());
  EXPECT_EQ(null_dst->code(), absl::StatusCode::kInvalidArgument) << *null_dst;
}

// The runtime's CopyToDevice (Python's device_put of an Array): each copy keeps its handle's dims,
// logical dtype, device dtype and name, reads back as the original did once the original is gone,
// and a target that cannot hold the device dtype is refused, naming the tensor, before any copy.
TEST_P(ConformancePartial, CopyDataToDeviceKeepsLogicalDTypeAndName) {
  if (!Holds({DType::kF32})) return;
  std::unique_ptr<Client> two_devices;
  if (backend().honours_num_devices_option) {
    CT_ASSERT_OK_AND_ASSIGN(two_devices, MakeClient(ClientOptions{.num_devices = 2}));
  }
  Client& owner = two_devices != nullptr ? *two_devices : client();
  Device* target = owner.devices().back();
  const Dims dims = {9, 7};
  HostBytes f64 = RandomDenseTensor(rng(), DType::kF64, dims);
  HostBytes s16 = RandomDenseTensor(rng(), DType::kS16, {5});
  auto borrow = [](const HostBytes& bytes, DType dtype, const Dims& shape, std::string name) {
    return TensorSource::Borrow(HostView::Dense(bytes.data(), dtype, shape), bytes.data(),
                                bytes.size(), nullptr, std::move(name))
        .value();
  };
  const std::vector<std::shared_ptr<const TensorSource>> sources = {
      borrow(f64, DType::kF64, dims, "weights"), borrow(s16, DType::kS16, {5}, "ids")};
  TransferToDeviceOptions options;
  options.device_dtypes = {DType::kF32, std::nullopt};
  CT_ASSERT_OK_AND_ASSIGN(std::vector<DataPtr> originals,
                          TransferToDevice(sources, owner.devices()[0], options));
  CT_ASSERT_OK_AND_ASSIGN(std::vector<HostTensor> expected, TransferFromDevice(originals));
  CT_ASSERT_OK_AND_ASSIGN(std::vector<DataPtr> copies, CopyToDevice(originals, target));
  ASSERT_EQ(copies.size(), 2u);
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_EQ(copies[i]->device(), target);
    EXPECT_EQ(copies[i]->dims(), originals[i]->dims());
    EXPECT_EQ(copies[i]->logical_dtype(), originals[i]->logical_dtype());
    EXPECT_EQ(copies[i]->device_dtype(), originals[i]->device_dtype());
    EXPECT_EQ(copies[i]->name(), originals[i]->name());
  }
  originals.clear();
  CT_ASSERT_OK_AND_ASSIGN(std::vector<HostTensor> actual, TransferFromDevice(copies));
  for (size_t i = 0; i < actual.size(); ++i) {
    EXPECT_EQ(actual[i].dtype(), expected[i].dtype());
    EXPECT_TRUE(
        BytesEqual(absl::MakeConstSpan(static_cast<const std::byte*>(expected[i].view().data),
                                       static_cast<size_t>(expected[i].size_bytes())),
                   absl::MakeConstSpan(static_cast<const std::byte*>(actual[i].view().data),
                                       static_cast<size_t>(actual[i].size_bytes()))));
  }
  // A device that cannot hold the stored dtype: refused, naming the tensor and the dtype.
  ClientOptions no_f64;
  no_f64.capabilities = DeviceCapabilities::No64BitFloats();
  auto narrow = CreateClient("host", no_f64);
  ASSERT_TRUE(narrow.ok()) << narrow.status();
  if (!Holds({DType::kF64})) return;
  HostBytes wide = RandomDenseTensor(rng(), DType::kF64, {4});
  CT_ASSERT_OK_AND_ASSIGN(std::vector<DataPtr> stored_f64,
                          TransferToDevice({borrow(wide, DType::kF64, {4}, "wide")}, device()));
  const StatusOr<std::vector<DataPtr>> refused = CopyToDevice(stored_f64, (*narrow)->devices()[0]);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("'wide'"), std::string_view::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("float64"), std::string_view::npos) << refused.status();
}

// A copy to another device (or the same one, where the backend has one device) has the same dims,
// dtype and bytes, and is independent of its source: destroying the source leaves it intact.
TEST_P(ConformancePartial, CopyToDeviceMakesAnIndependentExactCopy) {
  std::unique_ptr<Client> two_devices;
  Device* target = device();
  if (backend().honours_num_devices_option) {
    CT_ASSERT_OK_AND_ASSIGN(two_devices, MakeClient(ClientOptions{.num_devices = 2}));
  }
  Client& owner = two_devices != nullptr ? *two_devices : client();
  Device* source_device = owner.devices()[0];
  target = owner.devices().size() > 1 ? owner.devices()[1] : owner.devices()[0];
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kS8, DType::kC64}) {
    if (!Holds({dtype}, source_device)) continue;
    SCOPED_TRACE(DTypeName(dtype));
    const Dims dims = {17, 33};
    HostBytes source = RandomDenseTensor(rng(), dtype, dims);
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> original,
        owner.BufferFromHostBuffer(
            HostView::Dense(source.data(), dtype, dims), dtype, source_device,
            HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr, "original"));
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> copy, original->CopyToDevice(target));
    EXPECT_EQ(copy->device(), target);
    EXPECT_EQ(copy->dims(), dims);
    EXPECT_EQ(copy->device_dtype(), dtype);
    CT_ASSERT_READY_OK(copy->Ready());
    original.reset();
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*copy));
    EXPECT_TRUE(BytesEqual(source.span(), actual));
  }
  // To a device of another backend's client: through the host, whatever the backends.
  auto host = CreateClient("host");
  ASSERT_TRUE(host.ok()) << host.status();
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, {64});
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> original,
      owner.BufferFromHostBuffer(HostView::Dense(source.data(), DType::kF32, {64}), DType::kF32,
                                 source_device, HostBufferSemantics::kImmutableOnlyDuringCall,
                                 nullptr, "original"));
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> on_host,
                          original->CopyToDevice((*host)->devices()[0]));
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*on_host));
  EXPECT_TRUE(BytesEqual(source.span(), actual));
  EXPECT_EQ(original->CopyToDevice(nullptr).status().code(), absl::StatusCode::kInvalidArgument);
}

// CopyToDevice of a buffer still being filled returns at once with a copy that is not ready; the
// copy arrives exact once the fill completes (also when the original is destroyed right after the
// call, the copy being all the caller keeps), and fails with the fill's error when the fill is
// abandoned. To another device of the backend and to the host backend's device.
TEST_P(ConformancePartial, CopyToDeviceNeverWaitsForTheOriginal) {
  CopyTargets copy_to;
  ASSERT_NO_FATAL_FAILURE(MakeCopyTargets(copy_to));
  Client& owner = *copy_to.owner;
  constexpr int64_t kCount = 300'000;  // 1.2 MB: above every inline-copy threshold
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, {kCount});
  const int64_t half = kCount / 2 * 4;
  enum class Then { kFilled, kFilledAfterTheOriginalIsGone, kAbandoned };
  for (Device* target : copy_to.targets) {
    for (Then then : {Then::kFilled, Then::kFilledAfterTheOriginalIsGone, Then::kAbandoned}) {
      SCOPED_TRACE(testing::Message()
                   << "to " << target->name() << ", case " << static_cast<int>(then));
      CT_ASSERT_OK_AND_ASSIGN(
          std::unique_ptr<BufferWriter> writer,
          owner.CreateBufferWriter(DType::kF32, {kCount}, owner.devices()[0], {}, "filled later"));
      CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> original, writer->TakeBuffer());
      CT_ASSERT_READY_OK(writer->Write(0, source.data(), half));

      std::optional<StatusOr<std::unique_ptr<Buffer>>> copy;
      test_support::CallOnItsOwnThread caller(
          [&] { copy.emplace(original->CopyToDevice(target)); });
      const bool returned_at_once = caller.ReturnedWithin(std::chrono::seconds(30));
      EXPECT_TRUE(returned_at_once) << "CopyToDevice waited for the original's fill";
      if (returned_at_once && copy->ok()) {
        EXPECT_FALSE((**copy)->Ready().IsReady()) << "ready before the original was filled";
        if (then == Then::kFilledAfterTheOriginalIsGone) original.reset();
      }
      if (then == Then::kAbandoned) {
        writer->Abort(CancelledError("the producer gave up"));
      } else {
        CT_ASSERT_READY_OK(writer->Write(half, source.data() + half, source.size() - half));
      }
      caller.Join();
      ASSERT_TRUE(copy->ok()) << copy->status();
      Buffer& arrived = ***copy;
      EXPECT_EQ(arrived.device(), target);
      const std::optional<Status> ready = AwaitFor(arrived.Ready());
      ASSERT_TRUE(ready.has_value()) << "the copy never completed";
      if (then == Then::kAbandoned) {
        // (A plugin's own copy between its devices reports its own code for the failed fill.)
        EXPECT_FALSE(ready->ok()) << "a copy of a buffer never filled cannot be ready";
        continue;
      }
      ASSERT_TRUE(ready->ok()) << *ready;
      CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(arrived));
      EXPECT_TRUE(BytesEqual(source.span(), actual));
    }
  }
}

// A ready original destroyed as soon as CopyToDevice returns: the copy still arrives exact, and
// an original that aliases the caller's memory gives it back (on_done, which poisons it) only
// after the copy has read it, exactly once.
TEST_P(ConformancePartial, CopyToDeviceHoldsAReadyOriginalUntilItIsRead) {
  CopyTargets copy_to;
  ASSERT_NO_FATAL_FAILURE(MakeCopyTargets(copy_to));
  Client& owner = *copy_to.owner;
  const Dims dims = {1024, 1024};  // 4 MiB: copied by the engines, after the call
  for (Device* target : copy_to.targets) {
    SCOPED_TRACE(testing::Message() << "to " << target->name());
    auto source = std::make_shared<HostBytes>(RandomDenseTensor(rng(), DType::kF32, dims));
    const std::vector<std::byte> expected = source->ToVector();
    auto record = std::make_shared<OnDoneRecord>();
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> original,
        owner.BufferFromHostBuffer(
            HostView::Dense(source->data(), DType::kF32, dims), DType::kF32, owner.devices()[0],
            HostBufferSemantics::kImmutableZeroCopy,
            MakeRecordingOnDone(record, {.poison = source->span(), .keep_alive = source}),
            "original"));
    source.reset();  // the on_done callback owns the source memory now
    record->CallReturned();
    CT_ASSERT_READY_OK(original->Ready());
    CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> copy, original->CopyToDevice(target));
    original.reset();
    CT_ASSERT_READY_OK(copy->Ready());
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*copy));
    EXPECT_TRUE(BytesEqual(expected, actual)) << "the copy read the original after it was gone";
    EXPECT_EQ(record->WaitForCalls(1), 1);
  }
}

TEST_P(ConformancePartial, PartialReadsAndCopiesFailCleanlyOnceTheClientIsGone) {
  alignas(64) float data[16] = {1, 2, 3};
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer,
                          client().BufferFromHostBuffer(
                              HostView::Dense(data, DType::kF32, {16}), DType::kF32, device(),
                              HostBufferSemantics::kImmutableOnlyDuringCall, nullptr, "orphan"));
  DestroyClient();
  std::vector<std::byte> dst(64);
  const std::optional<Status> read = AwaitFor(buffer->CopyRawToHost(0, 64, dst.data()));
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->code(), absl::StatusCode::kFailedPrecondition) << *read;
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformancePartial);

}  // namespace
}  // namespace ferry::conformance
