// DeviceAllocation: device memory that the host addresses, 64-byte aligned, counted in a
// MemoryAccount (or a caller's memory aliased): the memory behind the host backend's buffers and
// the buffers ferry's PJRT plugin writes itself.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "ferry/core/status.h"
#include "ferry/device/device.h"
#include "ferry/device/memory_account.h"
#include "src/device/small_allocations.h"

namespace ferry {

// The memory behind one buffer: an allocation of device memory (64-byte aligned) that returns its
// bytes to the account when freed, or, for a zero-copy buffer, the caller's memory, whose
// `on_done` runs when this is destroyed. Shared between the buffer and the transfers that still
// write or read it, so the last of them, not the buffer, decides when the memory goes: a read in
// flight keeps an alias's source memory (and defers its on_done) exactly as it keeps an
// allocation. Allocations of up to 32 KiB share slabs (small_allocations.h); larger ones are
// their own.
class DeviceAllocation {
 public:
  // Reserves and allocates `size_bytes`. ResourceExhausted when the account or malloc says no.
  static StatusOr<std::shared_ptr<DeviceAllocation>> Create(std::shared_ptr<MemoryAccount> account,
                                                            int64_t size_bytes,
                                                            std::string_view tensor_name,
                                                            std::string_view device_name);
  // The caller's memory at `aliased`, released by running `on_done` (may be empty) when the last
  // holder lets go: on the thread that drops the buffer, or the one that finishes its last read.
  static std::shared_ptr<DeviceAllocation> Alias(const void* aliased, OnDoneWithHostBuffer on_done);
  ~DeviceAllocation();
  DeviceAllocation(const DeviceAllocation&) = delete;
  DeviceAllocation& operator=(const DeviceAllocation&) = delete;

  const std::byte* data() const { return data_; }
  // Only for an allocation (never written through for an alias).
  std::byte* mutable_data() const { return const_cast<std::byte*>(data_); }
  bool is_alias() const { return account_ == nullptr; }

  // For Create's and Alias's std::make_shared (one allocation for the object and its count) only.
  struct CreateKey {
    explicit CreateKey() = default;
  };
  DeviceAllocation(CreateKey, std::shared_ptr<MemoryAccount> account, const std::byte* data,
                   int64_t size_bytes, OnDoneWithHostBuffer on_alias_done,
                   std::shared_ptr<internal::HostSlab> slab = nullptr)
      : account_(std::move(account)),
        data_(data),
        size_bytes_(size_bytes),
        on_alias_done_(std::move(on_alias_done)),
        slab_(std::move(slab)) {}

 private:
  const std::shared_ptr<MemoryAccount> account_;  // null for an alias
  const std::byte* const data_;
  const int64_t size_bytes_;
  OnDoneWithHostBuffer on_alias_done_;
  const std::shared_ptr<internal::HostSlab> slab_;  // the slab of a small allocation, else null
};

}  // namespace ferry
