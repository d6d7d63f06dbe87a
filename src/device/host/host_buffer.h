// The host backend's device memory and buffers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ferry/core/copy_convert.h"
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
  // Both return at once: a buffer still being filled (create-then-fill) is read once it is ready.
  Future<> ToHost(const MutableHostView& dst) override;
  Future<> CopyRawToHost(int64_t offset_bytes, int64_t size_bytes, void* dst) override;
  StatusOr<HostView> HostAccessibleView() const override;

 protected:
  // The allocation (for an alias: the caller's memory, whose on_done waits for it).
  std::shared_ptr<const void> HoldHostAccessibleMemory() const override { return allocation_; }

 private:
  // Runs `plan` (a copy out of this buffer's memory of `bytes`) once Ready() completes: inline
  // when small, else on the engine; the read holds the memory until it is over.
  Future<> CopyOutOnceReady(CopyConvertPlan plan, int64_t bytes, std::string_view what);

  HostDevice* const device_;
  const DType device_dtype_;
  const Dims dims_;
  const std::shared_ptr<DeviceAllocation> allocation_;
  const Future<> ready_;
  const std::weak_ptr<TransferEngine> engine_;
};

}  // namespace ferry::host
