#include "ferry/core/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ferry/core/metrics.h"
#include "ferry/core/settings.h"
#include "src/core/settings_cached.h"

// Linux 5.14's value; older C libraries do not name it.
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace ferry {
namespace {

// The range is checked with one mincore call per kCheckBytes (a system call costs about 1 us here,
// the check itself about 0.2 us per MiB) and faulted in a kFaultBytes window at a time: a window is
// faulted in whole when any of its pages is not resident, so a range partly written before costs
// at most the written part of one window per run of fresh pages.
constexpr int64_t kCheckBytes = int64_t{8} << 20;
constexpr int64_t kFaultBytes = int64_t{1} << 20;
constexpr int64_t kSmallestPage = 4096;

int64_t PageSize() {
  static const int64_t page = [] {
    const long size = sysconf(_SC_PAGESIZE);
    return size > 0 ? static_cast<int64_t>(size) : kSmallestPage;
  }();
  return page;
}

// FERRY_HOST_PREFAULT, kept with the SettingsGeneration() it was read at: a call reads the setting
// again only after SetSetting or ClearSetting ran.
bool PrefaultOn() {
  static internal::SettingsCachedBits<1> cached;
  return cached.Get([] {
    const StatusOr<bool> setting = settings::HostPrefault();
    return uint64_t{!setting.ok() || *setting};  // a bad value counts as the default (on)
  }) != 0;
}

// Faults in each kFaultBytes window of [begin, begin + size) (page-aligned, at most kCheckBytes)
// that holds a page not resident, adding the bytes to `faulted`. False when the kernel refused
// (a range not wholly mapped, memory not writable): the rest is left to the copy, which then fails
// or not as it would have anyway.
bool FaultInFreshWindows(std::byte* begin, int64_t size, int64_t page, int64_t& faulted) {
  unsigned char resident[kCheckBytes / kSmallestPage];
  if (mincore(begin, static_cast<size_t>(size), resident) != 0) return false;
  for (int64_t window = 0; window < size; window += kFaultBytes) {
    const int64_t window_size = std::min(kFaultBytes, size - window);
    const unsigned char* bits = resident + window / page;
    if (std::all_of(bits, bits + window_size / page, [](unsigned char b) { return b & 1; })) {
      continue;
    }
    if (madvise(begin + window, static_cast<size_t>(window_size), MADV_POPULATE_WRITE) != 0) {
      return false;
    }
    faulted += window_size;
  }
  return true;
}

}  // namespace

bool KernelCanPrefault() {
  static const bool can = [] {
    const int64_t page = PageSize();
    void* probe = mmap(nullptr, static_cast<size_t>(page), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (probe == MAP_FAILED) return false;
    const bool populated = madvise(probe, static_cast<size_t>(page), MADV_POPULATE_WRITE) == 0;
    munmap(probe, static_cast<size_t>(page));
    return populated;
  }();
  return can;
}

std::string PrefaultDescription() {
  if (!PrefaultOn()) return "fresh pages not faulted in ahead (FERRY_HOST_PREFAULT=off)";
  if (!KernelCanPrefault()) {
    return "fresh pages not faulted in ahead (this kernel has no MADV_POPULATE_WRITE, Linux 5.14)";
  }
  return "fresh pages faulted in ahead of large writes (MADV_POPULATE_WRITE)";
}

int64_t PrefaultForWriting(void* data, int64_t size) {
  if (data == nullptr || size < kMinPrefaultBytes || !PrefaultOn() || !KernelCanPrefault()) {
    return 0;
  }
  const int64_t page = PageSize();
  if (page > kFaultBytes) return 0;
  const auto address = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (address + page - 1) / page * page;
  const uintptr_t last = (address + static_cast<uintptr_t>(size)) / page * page;
  int64_t faulted = 0;
  for (uintptr_t checked = first; checked < last; checked += kCheckBytes) {
    const auto check_size = static_cast<int64_t>(std::min<uintptr_t>(kCheckBytes, last - checked));
    if (!FaultInFreshWindows(reinterpret_cast<std::byte*>(checked), check_size, page, faulted)) {
      break;
    }
  }
  if (faulted > 0) metrics::HostBytesPrefaulted()->Add(faulted);
  return faulted;
}

}  // namespace ferry
