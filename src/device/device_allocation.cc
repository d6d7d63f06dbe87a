#include "src/device/device_allocation.h"

#include "ferry/core/host_tensor.h"
#include "fmt/format.h"

namespace ferry {

StatusOr<std::shared_ptr<DeviceAllocation>> DeviceAllocation::Create(
    std::shared_ptr<MemoryAccount> account, int64_t size_bytes, std::string_view tensor_name,
    std::string_view device_name) {
  FERRY_RETURN_IF_ERROR(account->Reserve(size_bytes, tensor_name, device_name));
  internal::SmallAllocation small;
  if (size_bytes <= internal::kSmallAllocationMaxBytes) {
    small = internal::AllocateSmall(size_bytes);
  } else {
    small.data = AllocateHostMemory(size_bytes);
  }
  std::byte* data = small.data;
  if (data == nullptr) {
    account->Release(size_bytes);
    return ResourceExhaustedError(fmt::format("tensor '{}': device {} could not allocate {} bytes",
                                              tensor_name, device_name, size_bytes));
  }
  return std::make_shared<DeviceAllocation>(CreateKey(), std::move(account), data, size_bytes,
                                            nullptr, std::move(small.slab));
}

std::shared_ptr<DeviceAllocation> DeviceAllocation::Alias(const void* aliased,
                                                          OnDoneWithHostBuffer on_done) {
  return std::make_shared<DeviceAllocation>(
      CreateKey(), nullptr, static_cast<const std::byte*>(aliased), 0, std::move(on_done));
}

DeviceAllocation::~DeviceAllocation() {
  if (is_alias()) {
    // Nothing reads the caller's memory any more: this is when ferry is done with it.
    if (on_alias_done_) std::move(on_alias_done_)();
    return;
  }
  // A small allocation's memory goes with its slab, when the slab's last allocation is freed.
  if (slab_ == nullptr) FreeHostMemory(mutable_data(), size_bytes_);
  account_->Release(size_bytes_);
}

}  // namespace ferry
