// MemoryAccount: the bytes one device's buffers hold, against the device's optional limit.
// Shared by every backend (one per device); allocations hold a shared_ptr to it so that memory
// may be returned after the client is gone. Thread-safe and lock-free.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string_view>

#include "ferry/core/status.h"

namespace ferry {

class MemoryAccount {
 public:
  explicit MemoryAccount(std::optional<int64_t> limit_bytes) : limit_bytes_(limit_bytes) {}

  // Adds `bytes`, or returns ResourceExhausted (naming the tensor and the device) when that would
  // pass the limit.
  Status Reserve(int64_t bytes, std::string_view tensor_name, std::string_view device_name);
  void Release(int64_t bytes) { in_use_.fetch_sub(bytes, std::memory_order_relaxed); }
  int64_t in_use() const { return in_use_.load(std::memory_order_relaxed); }

 private:
  const std::optional<int64_t> limit_bytes_;
  std::atomic<int64_t> in_use_{0};
};

}  // namespace ferry
