// What this process read from storage and holds in memory, from Linux's /proc and mincore: the
// per-rank numbers of `ferry put --mesh all`. Every function returns -1 (or an empty result)
// where the kernel does not say; none of them keeps state except the sampler, which is
// thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/status.h"

namespace ferry::cli {

// Bytes this process caused to be read from storage (/proc/self/io read_bytes: page-cache misses,
// mapped-file faults and their read-ahead included).
int64_t StorageReadBytes();

// The peak resident set size of the process so far (VmHWM: anonymous and file-backed pages).
int64_t PeakRssBytes();

// Resident memory now, by kind (/proc/self/status): anonymous (RssAnon: the heap, the host
// devices' buffers, staging) and file-backed (RssFile: pages of mapped files, the program's and
// libraries' code included).
struct ResidentMemory {
  int64_t anonymous = -1;
  int64_t file = -1;
};
ResidentMemory CurrentResidentMemory();

// The resident pages this process has mapped from `paths` (the Rss of its mappings of those files
// in /proc/self/smaps): what it touched of them. 0 when none is mapped.
int64_t MappedFileBytes(const std::vector<std::string>& paths);

// Bytes of `path` in the page cache (mincore over a fresh mapping of the whole file): what any
// process of this machine has read of it and the kernel still holds.
StatusOr<int64_t> PageCacheBytes(const std::string& path);

// Drops `path` from the page cache (after writing back dirty pages, which cannot be dropped).
// Pages that some process has mapped stay.
void DropPageCache(const std::string& path);

// The largest anonymous and file-backed resident memory seen while it runs: a thread reads
// CurrentResidentMemory() every `interval` from construction to Stop(). A peak shorter than the
// interval can be missed; memory that only grows (device buffers, mapped pages) is not.
class ResidentMemorySampler {
 public:
  explicit ResidentMemorySampler(
      std::chrono::microseconds interval = std::chrono::microseconds(2000));
  ~ResidentMemorySampler() { Stop(); }
  ResidentMemorySampler(const ResidentMemorySampler&) = delete;
  ResidentMemorySampler& operator=(const ResidentMemorySampler&) = delete;

  // Stops the thread after a last sample and returns the peaks; the same peaks on later calls.
  ResidentMemory Stop();

 private:
  void Sample();

  std::atomic<int64_t> peak_anonymous_{-1};
  std::atomic<int64_t> peak_file_{-1};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ferry::cli
