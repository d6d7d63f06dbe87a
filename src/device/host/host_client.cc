#include "src/device/host/host_client.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/core/settings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry::host {

HostDevice::HostDevice(HostClient* client, int index, DeviceCapabilities capabilities)
    : client_(client),
      index_(index),
      name_(fmt::format("host:{}", index)),
      capabilities_(std::move(capabilities)),
      memory_(std::make_shared<MemoryAccount>(capabilities_.memory_limit_bytes)) {}

Client* HostDevice::client() const { return client_; }

StatusOr<std::unique_ptr<Client>> HostClient::Create(const ClientOptions& options) {
  int num_devices = 0;
  if (options.num_devices.has_value()) {
    num_devices = *options.num_devices;
  } else {
    FERRY_ASSIGN_OR_RETURN(num_devices, settings::HostDevices());
  }
  if (num_devices < 1 || num_devices > 1024) {
    return InvalidArgumentError(
        fmt::format("the host backend needs 1 to 1024 devices, got {}", num_devices));
  }
  DeviceCapabilities capabilities = options.capabilities.value_or(DeviceCapabilities::All());
  if (!options.capabilities.has_value()) {
    FERRY_ASSIGN_OR_RETURN(const std::optional<int64_t> limit, settings::HostMemoryLimit());
    if (limit.has_value()) capabilities.memory_limit_bytes = *limit;
  }
  const int num_workers = options.num_worker_threads.value_or(
      std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  if (num_workers < 1) {
    return InvalidArgumentError("the host backend needs at least one worker thread");
  }
  return std::unique_ptr<Client>(new HostClient(num_devices, capabilities, num_workers));
}

HostClient::HostClient(int num_devices, const DeviceCapabilities& capabilities, int num_workers)
    : engine_(std::make_shared<TransferEngine>(num_workers)) {
  for (int i = 0; i < num_devices; ++i) {
    devices_.push_back(std::make_unique<HostDevice>(this, i, capabilities));
    device_pointers_.push_back(devices_.back().get());
  }
}

HostClient::~HostClient() {
  // Cancels queued chunks and waits for running ones; every pending on_done and Ready() completes
  // here. Buffers that outlive the client hold only a weak reference to the engine.
  engine_->Shutdown();
}

StatusOr<std::unique_ptr<Buffer>> HostClient::BufferFromHostBuffer(
    const HostView& src, DType device_dtype, Device* device, HostBufferSemantics semantics,
    OnDoneWithHostBuffer on_done, std::string_view tensor_name) {
  FERRY_RETURN_IF_ERROR(
      CheckBufferFromHostBufferArgs(*this, src, device_dtype, device, tensor_name));
  auto* host_device = static_cast<HostDevice*>(device);

  if (semantics == HostBufferSemantics::kImmutableZeroCopy) {
    const bool aliasable = src.dtype == device_dtype && src.IsRowMajorDense() &&
                           src.IsNativeByteOrder() &&
                           reinterpret_cast<uintptr_t>(src.data) % kHostAlignment == 0;
    if (aliasable) {
      metrics::ZeroCopyAliases()->Add();
      return std::unique_ptr<Buffer>(
          new HostBuffer(host_device, device_dtype, src.dims,
                         DeviceAllocation::Alias(src.data, std::move(on_done)), engine_));
    }
    metrics::ZeroCopyFallbacks()->Add();
    semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  }

  FERRY_ASSIGN_OR_RETURN(const int64_t device_bytes,
                         DeviceBytesFor(src, device_dtype, *device, tensor_name));
  FERRY_ASSIGN_OR_RETURN(
      auto allocation,
      DeviceAllocation::Create(host_device->memory(), device_bytes, tensor_name, device->name()));
  FERRY_ASSIGN_OR_RETURN(
      CopyConvertPlan plan,
      CopyConvertPlan::Create(
          src, MutableHostView::Dense(allocation->mutable_data(), device_dtype, src.dims)));
  (src.dtype == device_dtype ? metrics::DirectTransfers() : metrics::ConvertedTransfers())->Add();

  FERRY_ASSIGN_OR_RETURN(Future<> ready, WriteThroughEngine(*engine_, std::move(plan), semantics,
                                                            std::move(on_done), allocation));
  return std::unique_ptr<Buffer>(
      new HostBuffer(host_device, device_dtype, src.dims, allocation, std::move(ready), engine_));
}

namespace {

class HostBufferWriter final : public BufferWriter {
 public:
  HostBufferWriter(HostDevice* device, DType device_dtype, const Dims& dims,
                   const WriterPlacement& placement, std::string_view tensor_name,
                   std::shared_ptr<DeviceAllocation> allocation,
                   std::weak_ptr<TransferEngine> engine)
      : BufferWriter(device_dtype, dims, placement.size_bytes, placement.memory.kind,
                     std::string(tensor_name)),
        device_(device),
        allocation_(std::move(allocation)),
        engine_(std::move(engine)) {}
  ~HostBufferWriter() override { AbortIfUnfinished(); }

  void Start() { CompleteIfEmpty(); }

  // The device memory is this process's: producers may fill it in place (BufferWriter::Written).
  void* HostWritableBytes() override { return allocation_->mutable_data(); }

 protected:
  StatusOr<Future<>> WriteBytes(int64_t offset_bytes, const void* data, int64_t size_bytes,
                                bool last) override {
    if (size_bytes > 0 && data != nullptr) {  // null: written in place already
      std::memcpy(allocation_->mutable_data() + offset_bytes, data,
                  static_cast<size_t>(size_bytes));
    }
    if (last) ready_.Set(OkStatus());
    return Future<>::Ready(OkStatus());
  }
  void FailBuffer(Status status) override { ready_.Set(std::move(status)); }
  std::unique_ptr<Buffer> MakeBuffer() override {
    return std::make_unique<HostBuffer>(device_, device_dtype(), dims(), allocation_,
                                        ready_.future(), engine_);
  }

 private:
  HostDevice* const device_;
  const std::shared_ptr<DeviceAllocation> allocation_;
  const std::weak_ptr<TransferEngine> engine_;
  Promise<> ready_;
};

}  // namespace

StatusOr<std::unique_ptr<BufferWriter>> HostClient::CreateBufferWriter(
    DType device_dtype, const Dims& dims, Device* device, std::string_view memory_kind,
    std::string_view tensor_name) {
  FERRY_ASSIGN_OR_RETURN(
      const WriterPlacement placement,
      CheckCreateBufferWriterArgs(*this, device_dtype, dims, device, memory_kind, tensor_name));
  auto* host_device = static_cast<HostDevice*>(device);
  FERRY_ASSIGN_OR_RETURN(auto allocation,
                         DeviceAllocation::Create(host_device->memory(), placement.size_bytes,
                                                  tensor_name, device->name()));
  auto writer = std::make_unique<HostBufferWriter>(host_device, device_dtype, dims, placement,
                                                   tensor_name, std::move(allocation), engine_);
  writer->Start();
  return std::unique_ptr<BufferWriter>(std::move(writer));
}

}  // namespace ferry::host
