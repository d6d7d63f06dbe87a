#include "ferry/device/client.h"

#include <algorithm>
#include <cstring>

#include "ferry/core/convert.h"
#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/device/buffer_writer.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/core/background_executor.h"

namespace ferry {

std::string_view HostBufferSemanticsName(HostBufferSemantics semantics) {
  switch (semantics) {
    case HostBufferSemantics::kImmutableOnlyDuringCall:
      return "ImmutableOnlyDuringCall";
    case HostBufferSemantics::kImmutableUntilTransferCompletes:
      return "ImmutableUntilTransferCompletes";
    case HostBufferSemantics::kImmutableZeroCopy:
      return "ImmutableZeroCopy";
  }
  return "unknown";
}

std::string_view DeviceMemoryStatsSourceName(DeviceMemoryStats::Source source) {
  switch (source) {
    case DeviceMemoryStats::Source::kFerry:
      return "ferry";
    case DeviceMemoryStats::Source::kPlugin:
      return "plugin";
  }
  return "unknown";
}

DeviceCapabilities DeviceCapabilities::All() {
  DeviceCapabilities capabilities;
  capabilities.dtypes.set();
  return capabilities;
}

DeviceCapabilities DeviceCapabilities::No64BitFloats() {
  DeviceCapabilities capabilities = All();
  capabilities.dtypes.reset(static_cast<size_t>(DType::kF64));
  capabilities.dtypes.reset(static_cast<size_t>(DType::kC128));
  return capabilities;
}

std::vector<DType> DeviceCapabilities::HeldDTypes() const {
  std::vector<DType> held;
  for (DType dtype : AllDTypes()) {
    if (Holds(dtype)) held.push_back(dtype);
  }
  return held;
}

StatusOr<HostView> Buffer::HostAccessibleView() const {
  // Names nothing reached through device(): the buffer may have outlived its client.
  return UnimplementedError(
      "HostAccessibleView is not supported on this backend (its device memory is not host "
      "memory)");
}

StatusOr<BufferAddress> Buffer::DataAddress() const {
  FERRY_ASSIGN_OR_RETURN(HostView view, HostAccessibleView());
  return BufferAddress{AddressSpace::kHost, 0, const_cast<void*>(view.data)};
}

StatusOr<NativeBufferHandle> Buffer::NativeHandle() const {
  return UnimplementedError(
      "NativeHandle: this backend has no runtime object behind its buffers (DataAddress() gives "
      "their memory)");
}

StatusOr<NativeDeviceHandles> Device::NativeHandles() const {
  return UnimplementedError(fmt::format(
      "NativeHandles: {} has no runtime objects to hand out (its buffers' memory is given by "
      "Buffer::DataAddress())",
      name()));
}

Future<> Buffer::CopyRawToHost(int64_t offset_bytes, int64_t size_bytes, void* dst) {
  if (Status status = CheckRawRange(this->size_bytes(), offset_bytes, size_bytes, dst);
      !status.ok()) {
    return Future<>::Ready(std::move(status));
  }
  if (Status ready = Ready().Await(); !ready.ok()) return Future<>::Ready(std::move(ready));
  StatusOr<HostView> view = HostAccessibleView();
  if (!view.ok()) return Future<>::Ready(view.status());
  if (size_bytes > 0) {
    std::memcpy(dst, static_cast<const std::byte*>(view->data) + offset_bytes,
                static_cast<size_t>(size_bytes));
  }
  return Future<>::Ready(OkStatus());
}

namespace {

// The old way, for a target that cannot create a buffer to fill later: waits for the source, reads
// it into a dense host tensor and puts that on `target` (returning once the put is on its way).
StatusOr<std::unique_ptr<Buffer>> CopyThroughHostAndWait(Buffer& source, Device* target) {
  FERRY_RETURN_IF_ERROR(source.Ready().Await());
  FERRY_ASSIGN_OR_RETURN(HostTensor staged,
                         HostTensor::Allocate(source.device_dtype(), source.dims()));
  FERRY_RETURN_IF_ERROR(source.ToHost(staged.mutable_view()).Await());
  return target->client()->BufferFromHostBuffer(staged.view(), source.device_dtype(), target,
                                                HostBufferSemantics::kImmutableOnlyDuringCall,
                                                nullptr, "copy");
}

// Ends a copy's fill with the read's error, saying which copy it was.
void AbortCopy(BufferWriter& writer, const Status& status, const std::string& what) {
  writer.Abort(Status(status.code(), fmt::format("{}: {}", what, std::string(status.message()))));
}

}  // namespace

StatusOr<std::unique_ptr<Buffer>> Buffer::CopyToDevice(Device* target) {
  if (target == nullptr) return InvalidArgumentError("CopyToDevice: no target device");
  if (Ready().IsReady() && Ready().Await().ok()) {
    if (std::shared_ptr<const void> hold = HoldHostAccessibleMemory()) {
      FERRY_ASSIGN_OR_RETURN(HostView memory, HostAccessibleView());
      return target->client()->BufferFromHostBuffer(
          memory, device_dtype(), target, HostBufferSemantics::kImmutableUntilTransferCompletes,
          [hold = std::move(hold)]() mutable { hold.reset(); }, "copy");
    }
  }
  StatusOr<std::unique_ptr<BufferWriter>> created =
      target->client()->CreateBufferWriter(device_dtype(), dims(), target, {}, "copy");
  if (created.status().code() == absl::StatusCode::kUnimplemented) {
    return CopyThroughHostAndWait(*this, target);
  }
  FERRY_RETURN_IF_ERROR(created.status());
  std::shared_ptr<BufferWriter> writer = *std::move(created);
  if (writer->size_bytes() != size_bytes()) {
    return InternalError(fmt::format("CopyToDevice: {} holds the copy in {} bytes, the source {}",
                                     target->name(), writer->size_bytes(), size_bytes()));
  }
  FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> copy, writer->TakeBuffer());
  if (size_bytes() == 0) return copy;  // complete already: nothing to carry
  std::string what = fmt::format("copy to {}", target->name());

  // Where the host may write the copy's memory (the host backend), the read lands there: one copy
  // of the bytes, and reporting it is cheap enough for whichever thread completes the read.
  if (auto* in_place = static_cast<std::byte*>(writer->HostWritableBytes())) {
    Future<> read = CopyRawToHost(0, size_bytes(), in_place);
    if (read.IsReady() && !read.Await().ok()) return read.Await();  // refused at once
    read.OnReady([writer, size = size_bytes(), what = std::move(what)](const Status& status) {
      Status done = status.ok() ? writer->Written(0, size) : status;
      if (!done.ok()) AbortCopy(*writer, done, what);
    });
    return copy;
  }
  // Else through a host tensor, written on the background executor: a write may block (OpenCL's
  // is synchronous) and must hold up neither a copy worker nor a plugin's event thread.
  FERRY_ASSIGN_OR_RETURN(HostTensor staged, HostTensor::Allocate(DType::kU8, {size_bytes()}));
  auto staging = std::make_shared<HostTensor>(std::move(staged));
  Future<> read = CopyRawToHost(0, size_bytes(), staging->data());
  if (read.IsReady() && !read.Await().ok()) return read.Await();
  read.OnReady(BackgroundExecutor(),
               [writer, staging, what = std::move(what)](const Status& status) mutable {
                 if (!status.ok()) {
                   AbortCopy(*writer, status, what);
                   return;
                 }
                 Future<> written = writer->Write(0, staging->data(), writer->size_bytes());
                 // The write holds the staging tensor until the device has taken its bytes. Its
                 // completion (a plugin's event thread) hands the last reference to the writer
                 // over to the background executor: a writer is never destroyed on a plugin's
                 // thread (a PJRT transfer manager destroyed inside its own callback, or the last
                 // reference to a PJRT client let go there).
                 written.OnReady(BackgroundExecutor(),
                                 [writer, staging, what = std::move(what)](const Status& status) {
                                   if (!status.ok()) AbortCopy(*writer, status, what);
                                 });
               });
  return copy;
}

Status CheckRawRange(int64_t buffer_bytes, int64_t offset_bytes, int64_t size_bytes,
                     const void* dst) {
  if (offset_bytes < 0 || size_bytes < 0 || offset_bytes > buffer_bytes ||
      size_bytes > buffer_bytes - offset_bytes) {
    return InvalidArgumentError(
        fmt::format("CopyRawToHost: bytes [{}, {}+{}) are not inside the buffer's {} bytes",
                    offset_bytes, offset_bytes, size_bytes, buffer_bytes));
  }
  if (dst == nullptr && size_bytes > 0) {
    return InvalidArgumentError("CopyRawToHost: null destination");
  }
  return OkStatus();
}

Status CheckToHostArgs(const Dims& buffer_dims, DType device_dtype, const MutableHostView& dst) {
  if (dst.dims != buffer_dims) {
    return InvalidArgumentError(
        fmt::format("ToHost: destination dims [{}] differ from the buffer's [{}]",
                    fmt::join(dst.dims, ","), fmt::join(buffer_dims, ",")));
  }
  FERRY_RETURN_IF_ERROR(dst.ComputeAddressedBytes("destination").status());
  if (dst.data == nullptr && dst.num_elements() > 0) {
    return InvalidArgumentError(
        fmt::format("ToHost: null destination pointer for {} elements", dst.num_elements()));
  }
  if (!dst.ElementsAreDistinct()) {
    return InvalidArgumentError(fmt::format(
        "ToHost: the destination's byte strides [{}] give two of its elements the same bytes "
        "(or interleave its dims); a read writes elements in parallel and needs each at bytes of "
        "its own",
        fmt::join(dst.byte_strides, ",")));
  }
  return CopyConvertPlan::Create(HostView::Dense(nullptr, device_dtype, buffer_dims), dst).status();
}

namespace {

// `device` is one of `client`'s and holds `device_dtype` (false for a value outside the enum).
Status CheckDeviceHolds(const Client& client, const Device* device, DType device_dtype,
                        std::string_view tensor_name) {
  if (device == nullptr) {
    return InvalidArgumentError(fmt::format("tensor '{}': no device given", tensor_name));
  }
  const auto devices = client.devices();
  if (device->client() != &client ||
      std::find(devices.begin(), devices.end(), device) == devices.end()) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': device {} does not belong to this {} client", tensor_name,
                    device->name(), client.backend()));
  }
  if (!device->capabilities().Holds(device_dtype)) {
    return InvalidArgumentError(fmt::format("tensor '{}': device {} cannot hold {}", tensor_name,
                                            device->name(), DTypeName(device_dtype)));
  }
  return OkStatus();
}

}  // namespace

Status CheckBufferFromHostBufferArgs(const Client& client, const HostView& src, DType device_dtype,
                                     const Device* device, std::string_view tensor_name) {
  FERRY_RETURN_IF_ERROR(CheckDeviceHolds(client, device, device_dtype, tensor_name));
  if (Status convertible = CheckConvertible(src.dtype, device_dtype); !convertible.ok()) {
    return Status(convertible.code(),
                  fmt::format("tensor '{}': {}", tensor_name, std::string(convertible.message())));
  }
  FERRY_RETURN_IF_ERROR(src.ComputeAddressedBytes(tensor_name).status());
  if (src.data == nullptr && src.num_elements() > 0) {
    return InvalidArgumentError(fmt::format("tensor '{}': null data pointer for {} elements",
                                            tensor_name, src.num_elements()));
  }
  return OkStatus();
}

StatusOr<MemorySpace> FindMemorySpace(const Device& device, std::string_view kind) {
  const std::vector<MemorySpace>& spaces = device.memory_spaces();
  std::vector<std::string_view> kinds;
  for (const MemorySpace& space : spaces) {
    if (kind.empty() ? space.is_default : space.kind == kind) return space;
    kinds.push_back(space.kind);
  }
  return InvalidArgumentError(fmt::format("device {} has no memory space '{}' (it has: {})",
                                          device.name(), kind, fmt::join(kinds, ", ")));
}

StatusOr<WriterPlacement> CheckCreateBufferWriterArgs(const Client& client, DType device_dtype,
                                                      const Dims& dims, const Device* device,
                                                      std::string_view memory_kind,
                                                      std::string_view tensor_name) {
  FERRY_RETURN_IF_ERROR(CheckDeviceHolds(client, device, device_dtype, tensor_name));
  StatusOr<int64_t> count = CheckedNumElements(dims);
  if (!count.ok()) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': {}", tensor_name, std::string(count.status().message())));
  }
  int64_t size_bytes = 0;
  if (__builtin_mul_overflow(*count, DTypeSize(device_dtype), &size_bytes)) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': its device size in bytes overflows int64", tensor_name));
  }
  WriterPlacement placement;
  // The same size limits as a put of the buffer's dense bytes.
  FERRY_ASSIGN_OR_RETURN(placement.size_bytes,
                         DeviceBytesFor(HostView::Dense(nullptr, device_dtype, dims), device_dtype,
                                        *device, tensor_name));
  StatusOr<MemorySpace> memory = FindMemorySpace(*device, memory_kind);
  if (!memory.ok()) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': {}", tensor_name, std::string(memory.status().message())));
  }
  placement.memory = *std::move(memory);
  return placement;
}

StatusOr<int64_t> DeviceBytesFor(const HostView& src, DType device_dtype, const Device& device,
                                 std::string_view tensor_name, std::string_view limit_name) {
  int64_t device_bytes = 0;
  if (__builtin_mul_overflow(src.num_elements(), DTypeSize(device_dtype), &device_bytes)) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': its device size in bytes overflows int64", tensor_name));
  }
  if (const auto& max = device.capabilities().max_buffer_bytes;
      max.has_value() && device_bytes > *max) {
    return ResourceExhaustedError(
        fmt::format("tensor '{}' needs {} bytes; device {} allows at most {} per buffer{}",
                    tensor_name, device_bytes, device.name(), *max,
                    limit_name.empty() ? "" : fmt::format(" ({})", limit_name)));
  }
  return device_bytes;
}

}  // namespace ferry
