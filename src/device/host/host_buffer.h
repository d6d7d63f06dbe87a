// The host backend's device memory and buffers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ferry/core/future.h"
#include "ferry/device/buffer.h"
#include "ferry/device/device.h"
#include "ferry/device/memory_account.h"
#include "src/device/device_allocation.h"
#include "src/device/transfer_engine.h"

namespace ferry::host {

class HostDevice;

class HostBuffer final : public Buffer {
 public:
  // A buffer that owns `allocation` and becomes ready with `ready`.
  HostBuffer(HostDevice* device, DType device_dtype, Dims dims,
             std::shared_ptr<DeviceAllocation> allocation, Future<> ready,
             std::weak_ptr<TransferEngine> engine);
  // A buffer aliasing caller memory (zero-copy): `allocation` is a DeviceAllocation::Alias, whose
  // on_done runs once the buffer is destroyed and no read of it is running.
  HostBuffer(HostDevice* device, DType device_dtype, Dims dims,
             std::shared_ptr<DeviceAllocation> allocation, std::weak_ptr<TransferEngine> engine);

  Device* device() const override;
  DType device_dtype() const override { return device_dtype_; }
  const Dims& dims() const override { return dims_; }
  int64_t size_bytes() const override;
  bool is_alias() const override { return allocation_->is_alias(); }
  Future<> Ready() const override { return ready_; }
  Future<> ToHost(const MutableHostView& dst) override;
  StatusOr<HostView> HostAccessibleView() const override;

 private:
  HostDevice* const device_;
  const DType device_dtype_;
  const Dims dims_;
  const std::shared_ptr<DeviceAllocation> allocation_;
  const Future<> ready_;
  const std::weak_ptr<TransferEngine> engine_;
};

}  // namespace ferry::host
