#include "ferry/core/host_tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
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
#include "src/core/settings_cached.h"

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

// The bracketed choice of a sysfs THP file ("always [madvise] never" -> "madvise"); "" when the
// file cannot be read (no THP in this kernel, or no /sys).
std::string ReadThpChoice(const char* path) {
  std::ifstream file(path);
  std::string line;
  if (!std::getline(file, line)) return "";
  const size_t open = line.find('[');
  const size_t close = line.find(']', open);
  if (open == std::string::npos || close == std::string::npos) return "";
  return line.substr(open + 1, close - open - 1);
}

struct ThpSettings {
  std::string enabled;
  std::string defrag;
};

// Read once: the kernel's settings are the machine's, and an allocation must not open files.
const ThpSettings& KernelThpSettings() {
  static const ThpSettings* const settings =
      new ThpSettings{ReadThpChoice("/sys/kernel/mm/transparent_hugepage/enabled"),
                      ReadThpChoice("/sys/kernel/mm/transparent_hugepage/defrag")};
  return *settings;
}

constexpr uint64_t kAdviseHugePages = 1;
constexpr uint64_t kRefuseHugePages = 2;

// HostHugePagePolicy's advice as the two bits above, from a copy kept with the SettingsGeneration()
// it was made at: an allocation neither reads the setting nor formats the policy's reason unless
// SetSetting or ClearSetting ran since.
uint64_t HugePageAdvice() {
  static internal::SettingsCachedBits<2> cached;
  return cached.Get([] {
    const HugePagePolicy policy = HostHugePagePolicy();
    return (policy.advise ? kAdviseHugePages : 0) | (policy.refuse ? kRefuseHugePages : 0);
  });
}

std::byte* AllocateFromSystem(int64_t size_bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t size = static_cast<size_t>(std::max<int64_t>(size_bytes, 1));
  const size_t alignment = size >= kHugePage ? kHugePage : kHostAlignment;
  // aligned_alloc needs a size that is a multiple of the alignment.
  const size_t rounded = (size + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);
  if (memory != nullptr && alignment == kHugePage) {
    const uint64_t advice = HugePageAdvice();
    // Advice only: a failure changes nothing.
    if (advice & kAdviseHugePages) madvise(memory, rounded, MADV_HUGEPAGE);
    if (advice & kRefuseHugePages) madvise(memory, rounded, MADV_NOHUGEPAGE);
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

HugePagePolicy ChooseHugePagePolicy(std::string_view thp_enabled, std::string_view thp_defrag,
                                    settings::HugePagesSetting setting) {
  HugePagePolicy policy;
  policy.thp_enabled = std::string(thp_enabled);
  policy.thp_defrag = std::string(thp_defrag);
  const std::string kernel = thp_enabled.empty()
                                 ? std::string("this kernel has no transparent huge pages")
                                 : fmt::format("THP enabled={}, defrag={}", thp_enabled,
                                               thp_defrag.empty() ? "?" : thp_defrag);
  switch (setting) {
    case settings::HugePagesSetting::kOn:
      policy.advise = !thp_enabled.empty();
      policy.reason = fmt::format("asked for (FERRY_HOST_HUGE_PAGES=on; {})", kernel);
      return policy;
    case settings::HugePagesSetting::kOff:
      // Also where THP is "madvise": memory that malloc hands back may lie in a range advised
      // before.
      policy.refuse = !thp_enabled.empty() && thp_enabled != "never";
      policy.reason = fmt::format("not asked for (FERRY_HOST_HUGE_PAGES=off; {})", kernel);
      return policy;
    case settings::HugePagesSetting::kAuto:
      break;
  }
  if (thp_enabled.empty() || thp_enabled == "never") {
    policy.reason = fmt::format("not asked for ({})", kernel);
  } else if (thp_defrag == "defer" || thp_defrag == "never") {
    // A madvised fault takes a free huge page or falls back to small pages at once; compaction,
    // if any, runs in the background.
    policy.advise = true;
    policy.reason = fmt::format("asked for ({}: a fault never waits for compaction)", kernel);
  } else {
    // "always", "madvise", "defer+madvise" (or unreadable): a madvised fault with no free huge
    // page compacts memory before it returns, milliseconds each on a busy machine. (Asking only
    // where /proc/buddyinfo's free 2 MiB blocks covered the allocation was tried: 0.41 s against
    // 0.60 s for a 1 GiB `ferry put` on a quiet machine, but 0.7-2.9 s against 0.8-1.1 s with
    // both cores busy, so free blocks do not say that a fault will not stall.)
    policy.reason = fmt::format(
        "not asked for ({}: a madvised fault would wait for memory compaction; "
        "FERRY_HOST_HUGE_PAGES=on asks anyway)",
        kernel);
  }
  return policy;
}

HugePagePolicy HostHugePagePolicy() {
  const ThpSettings& kernel = KernelThpSettings();
  const StatusOr<settings::HugePagesSetting> setting = settings::HostHugePages();
  return ChooseHugePagePolicy(kernel.enabled, kernel.defrag,
                              setting.ok() ? *setting : settings::HugePagesSetting::kAuto);
}

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
