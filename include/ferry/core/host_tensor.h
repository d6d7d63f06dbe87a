// HostTensor: a dense row-major tensor that owns its host memory (64-byte aligned).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/core/dtype.h"
#include "ferry/core/host_view.h"
#include "ferry/core/settings.h"
#include "ferry/core/status.h"

namespace ferry {

inline constexpr size_t kHostAlignment = 64;

// Allocates `size_bytes` of uninitialised host memory, 64-byte aligned; nullptr when the system
// is out of memory. Allocations of 2 MiB or more are aligned to 2 MiB and advised to use huge
// pages, so that first-touch page faults (which otherwise dominate large transfers into fresh
// memory) are 512 times fewer. Free with FreeHostMemory, giving the same size. Thread-safe.
//
// Freed allocations of 1 KiB or more go to a process-wide cache and serve the next allocation of
// exactly the same size (src/core/freed_memory_cache.h says why: fresh memory costs a zeroing
// page fault per page on first touch, about the price of the copy itself; and glibc's aligned
// allocation of thousands of small blocks, one per tensor of a batch, costs more than their copy).
// The cache holds at most FERRY_HOST_MEMORY_CACHE_BYTES (ferry/core/settings.h; default 1 GiB;
// 0 turns it off; off by default in AddressSanitizer builds so that use-after-free stays
// detectable; SetSetting changes it while running) and is emptied when an allocation fails. The
// gauges HostMemoryCacheBytes and HostMemoryCacheLimitBytes (ferry/core/metrics.h) follow it.
//
// Huge pages: in a fresh process the first touch of fresh memory is most of a large transfer's
// cost, and 2 MiB pages make those faults 512 times fewer; but where the kernel's THP defrag
// setting lets a madvised fault compact memory synchronously ("always", "madvise",
// "defer+madvise"), a busy machine turns that fault into milliseconds each and a load into
// seconds. FERRY_HOST_HUGE_PAGES (auto, the default) asks for them only where it cannot stall
// (HostHugePagePolicy).
std::byte* AllocateHostMemory(int64_t size_bytes);
void FreeHostMemory(std::byte* memory, int64_t size_bytes);
// Bytes of freed host memory held by the cache, and its limit.
int64_t CachedHostMemoryBytes();
int64_t HostMemoryCacheLimitBytes();
// Gives every cached block back to the system.
void ReleaseCachedHostMemory();
// The error of a bad FERRY_HOST_MEMORY_CACHE_BYTES (the cache then holds nothing), else OK.
// HostTensor::Allocate returns it.
Status HostMemoryCacheSettingStatus();

// Whether large host allocations ask for transparent huge pages, and why.
struct HugePagePolicy {
  bool advise = false;      // MADV_HUGEPAGE on allocations of 2 MiB or more
  bool refuse = false;      // MADV_NOHUGEPAGE instead (FERRY_HOST_HUGE_PAGES=off)
  std::string thp_enabled;  // /sys/kernel/mm/transparent_hugepage/enabled's choice; "" unreadable
  std::string thp_defrag;   // .../defrag's choice; "" unreadable
  std::string reason;       // one sentence, for `ferry devices` and the docs
};
// The policy for the kernel settings `thp_enabled` and `thp_defrag` (as the kernel names them)
// and FERRY_HOST_HUGE_PAGES = `setting`. Pure: no system call.
HugePagePolicy ChooseHugePagePolicy(std::string_view thp_enabled, std::string_view thp_defrag,
                                    settings::HugePagesSetting setting);
// The policy in force: this kernel's settings (read once per process) and the setting's current
// value (a bad value counts as auto). Thread-safe.
HugePagePolicy HostHugePagePolicy();

// Owns its bytes; movable, not copyable. Not thread-safe for concurrent writes (plain memory).
class HostTensor {
 public:
  HostTensor() = default;
  // Allocates (uninitialised) memory for `dims` of `dtype`. InvalidArgument on negative dims or
  // overflow, or while FERRY_HOST_MEMORY_CACHE_BYTES is bad; ResourceExhausted when the
  // allocation fails.
  static StatusOr<HostTensor> Allocate(DType dtype, absl::Span<const int64_t> dims);

  DType dtype() const { return dtype_; }
  const Dims& dims() const { return dims_; }
  int64_t size_bytes() const { return size_bytes_; }
  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }

  HostView view() const { return HostView::Dense(data_.get(), dtype_, dims_); }
  MutableHostView mutable_view() { return MutableHostView::Dense(data_.get(), dtype_, dims_); }

 private:
  // Gives the block back with its size (FreeHostMemory needs it).
  struct AlignedFree {
    AlignedFree() noexcept : size_bytes(0) {}
    explicit AlignedFree(int64_t size) noexcept : size_bytes(size) {}
    void operator()(std::byte* p) const { FreeHostMemory(p, size_bytes); }
    int64_t size_bytes;
  };
  DType dtype_ = DType::kF32;
  Dims dims_;
  int64_t size_bytes_ = 0;
  std::unique_ptr<std::byte[], AlignedFree> data_;
};

}  // namespace ferry
