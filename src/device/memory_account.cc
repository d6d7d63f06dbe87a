#include "ferry/device/memory_account.h"

#include "fmt/format.h"

namespace ferry {

Status MemoryAccount::Reserve(int64_t bytes, std::string_view tensor_name,
                              std::string_view device_name) {
  int64_t current = in_use_.load(std::memory_order_relaxed);
  while (true) {
    if (limit_bytes_.has_value() && (bytes > *limit_bytes_ || current > *limit_bytes_ - bytes)) {
      return ResourceExhaustedError(fmt::format(
          "tensor '{}': device {} is out of memory: {} bytes requested, {} of {} bytes in use",
          tensor_name, device_name, bytes, current, *limit_bytes_));
    }
    if (in_use_.compare_exchange_weak(current, current + bytes, std::memory_order_relaxed)) {
      return OkStatus();
    }
  }
}

}  // namespace ferry
