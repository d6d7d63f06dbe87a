#include "ferry/core/host_tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <new>
#include <optional>

#include "ferry/core/metrics.h"
#include "ferry/core/mutex.h"
#include "ferry/core/settings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/core/fork_locks.h"
#include "src/core/freed_memory_cache.h"
#include "src/core/host_memory_cache.h"

namespace ferry {

namespace {

// Below this, glibc's bins serve allocations well enough; from it on, 64-byte aligned blocks go
// through its memalign path, which splits and consolidates chunks (measured: half the time of a
// 16384-tensor put of 4 KiB tensors was in it), and large ones cost first-touch page faults.
constexpr int64_t kMinCachedBytes = int64_t{1} << 10;

// FERRY_HOST_MEMORY_CACHE_BYTES, or 0 (cache nothing) while its value is bad: the error is
// reported by HostMemoryCacheSettingStatus (HostTensor::Allocate, CreateClient), never replaced
// by the default.
int64_t CacheLimitFromSettings(Status& status) {
  StatusOr<int64_t> limit = settings::HostMemoryCacheBytes();
  status = limit.status();
  return limit.ok() ? *limit : 0;
}

std::byte* AllocateFromSystem(int64_t size_bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t size = static_cast<size_t>(std::max<int64_t>(size_bytes, 1));
  const size_t alignment = size >= kHugePage ? kHugePage : kHostAlignment;
  // aligned_alloc needs a size that is a multiple of the alignment.
  const size_t rounded = (size + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);
  if (memory != nullptr && alignment == kHugePage) {
    madvise(memory, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
  }
  return static_cast<std::byte*>(memory);
}

// The cache and what its limit was read from. Its locks are taken around fork(), so that a child
// forked while another thread allocates or frees finds them free. Never destroyed: blocks freed
// during static destruction still find it.
struct HostCache {
  FreedMemoryCache<std::byte*> cache;
  // The SettingsGeneration() the limit was read at; the limit is read again when it changes.
  std::atomic<uint64_t> settings_generation;
  std::atomic<bool> setting_bad{false};
  Mutex refresh_mutex;
  Status setting_status ABSL_GUARDED_BY(refresh_mutex);

  HostCache(uint64_t generation, int64_t limit_bytes, Status status)
      : cache(
            limit_bytes, kMinCachedBytes, [](std::byte* memory) { std::free(memory); },
            metrics::HostMemoryCacheBytes(), metrics::HostMemoryCacheLimitBytes()),
        settings_generation(generation),
        setting_bad(!status.ok()),
        setting_status(std::move(status)) {
    internal::RegisterForkLock(internal::ForkLockRank::kHostMemoryCacheRefresh, refresh_mutex);
    cache.RegisterForkLock(internal::ForkLockRank::kHostMemoryCache);
  }

  // Reads the limit again after SetSetting or ClearSetting. Serialised, so that the last reader
  // applies the latest value.
  void Refresh() {
    MutexLock lock(refresh_mutex);
    const uint64_t generation = SettingsGeneration();
    if (generation == settings_generation.load(std::memory_order_acquire)) return;
    Status status;
    const int64_t limit = CacheLimitFromSettings(status);
    cache.SetLimit(limit);
    setting_bad.store(!status.ok(), std::memory_order_release);
    setting_status = std::move(status);
    settings_generation.store(generation, std::memory_order_release);
  }
};

HostCache& GetHostCache() {
  static HostCache* const host_cache = [] {
    const uint64_t generation = SettingsGeneration();
    Status status;
    const int64_t limit = CacheLimitFromSettings(status);
    return new HostCache(generation, limit, std::move(status));
  }();
  if (SettingsGeneration() != host_cache->settings_generation.load(std::memory_order_acquire)) {
    host_cache->Refresh();
  }
  return *host_cache;
}

FreedMemoryCache<std::byte*>& Cache() { return GetHostCache().cache; }

}  // namespace

std::byte* AllocateHostMemory(int64_t size_bytes) {
  if (size_bytes >= kMinCachedBytes) {
    if (std::optional<std::byte*> cached = Cache().Take(size_bytes)) return *cached;
  }
  std::byte* memory = AllocateFromSystem(size_bytes);
  if (memory == nullptr && Cache().ReleaseAll()) memory = AllocateFromSystem(size_bytes);
  return memory;
}

void FreeHostMemory(std::byte* memory, int64_t size_bytes) {
  if (memory == nullptr) return;
  Cache().Give(memory, size_bytes);
}

int64_t CachedHostMemoryBytes() { return Cache().cached_bytes(); }
int64_t HostMemoryCacheLimitBytes() { return Cache().limit_bytes(); }
void ReleaseCachedHostMemory() { Cache().ReleaseAll(); }

namespace internal {
void ApplyHostMemoryCacheSetting() { GetHostCache(); }  // refreshes when the generation moved
}  // namespace internal

Status HostMemoryCacheSettingStatus() {
  HostCache& host_cache = GetHostCache();
  if (!host_cache.setting_bad.load(std::memory_order_acquire)) return OkStatus();
  MutexLock lock(host_cache.refresh_mutex);
  return host_cache.setting_status;
}

StatusOr<HostTensor> HostTensor::Allocate(DType dtype, absl::Span<const int64_t> dims) {
  FERRY_RETURN_IF_ERROR(HostMemoryCacheSettingStatus());
  FERRY_ASSIGN_OR_RETURN(int64_t count, CheckedNumElements(dims));
  int64_t size_bytes;
  if (__builtin_mul_overflow(count, DTypeSize(dtype), &size_bytes)) {
    return InvalidArgumentError("host tensor size in bytes overflows int64");
  }
  HostTensor tensor;
  tensor.dtype_ = dtype;
  tensor.dims_.assign(dims.begin(), dims.end());
  tensor.size_bytes_ = size_bytes;
  std::byte* memory = AllocateHostMemory(size_bytes);
  if (memory == nullptr) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate {} bytes of host memory", size_bytes));
  }
  tensor.data_ = std::unique_ptr<std::byte[], AlignedFree>(memory, AlignedFree{size_bytes});
  return tensor;
}

}  // namespace ferry
