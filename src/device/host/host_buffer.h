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
#include "src/device/host/transfer_engine.h"

namespace ferry::host {

class HostDevice;

// One allocation of device memory (64-byte aligned); returns its bytes to the account when freed.
// Shared between the buffer and the transfers that still write or read it.
class DeviceAllocation {
 public:
  // Reserves and allocates `size_bytes`. ResourceExhausted when the account or malloc says no.
  static StatusOr<std::shared_ptr<DeviceAllocation>> Create(std::shared_ptr<MemoryAccount> account,
                                                            int64_t size_bytes,
                                                            std::string_view tensor_name,
                                                            std::string_view device_name);
  ~DeviceAllocation();

  std::byte* data() const { return data_; }

  // For Create's std::make_shared (one allocation for the object and its count) only.
  struct CreateKey {
    explicit CreateKey() = default;
  };
  DeviceAllocation(CreateKey, std::shared_ptr<MemoryAccount> account, std::byte* data,
                   int64_t size_bytes)
      : account_(std::move(account)), data_(data), size_bytes_(size_bytes) {}

 private:
  std::shared_ptr<MemoryAccount> account_;
  std::byte* data_;
  int64_t size_bytes_;
};

class HostBuffer final : public Buffer {
 public:
  // A buffer that owns `allocation` and becomes ready with `ready`.
  HostBuffer(HostDevice* device, DType device_dtype, Dims dims,
             std::shared_ptr<DeviceAllocation> allocation, Future<> ready,
             std::weak_ptr<TransferEngine> engine);
  // A buffer aliasing caller memory (zero-copy); `on_done` runs when the buffer is destroyed.
  HostBuffer(HostDevice* device, DType device_dtype, Dims dims, const void* aliased,
             OnDoneWithHostBuffer on_done, std::weak_ptr<TransferEngine> engine);
  ~HostBuffer() override;

  Device* device() const override;
  DType device_dtype() const override { return device_dtype_; }
  const Dims& dims() const override { return dims_; }
  int64_t size_bytes() const override;
  bool is_alias() const override { return aliased_ != nullptr; }
  Future<> Ready() const override { return ready_; }
  Future<> ToHost(const MutableHostView& dst) override;
  StatusOr<HostView> HostAccessibleView() const override;

 private:
  const std::byte* data() const;

  HostDevice* const device_;
  const DType device_dtype_;
  const Dims dims_;
  const std::shared_ptr<DeviceAllocation> allocation_;  // null for an alias
  const void* const aliased_ = nullptr;
  OnDoneWithHostBuffer on_alias_done_;
  const Future<> ready_;
  const std::weak_ptr<TransferEngine> engine_;
};

}  // namespace ferry::host
