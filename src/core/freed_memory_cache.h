// FreedMemoryCache: device memory that buffers have freed, kept for the next allocation of exactly
// the same size (the idea of PyTorch's caching allocator and of PJRT's device allocators, reduced
// to what a transfer library needs).
//
// Why: making fresh memory is cheap, but its first write is not. The kernel (host memory) or the
// OpenCL runtime backs fresh memory page by page on first touch and zeroes every page, which costs
// about as much as the transfer's own write; memory that was written before is just written
// again. Tensors come in few sizes (the layers of a model, the batches of a data loader), so
// repeated transfers hit the cache.
//
// Bounded: at most `limit_bytes` are kept (SetLimit changes it, releasing the oldest entries when
// it shrinks); the oldest entries are released first to make room, and an allocation that fails
// for want of memory should empty the cache (`ReleaseAll`) and retry. Optional gauges follow what
// it holds and its limit (the metrics report shows them); several caches may share a gauge (one
// per OpenCL device), which then reads their sum.
// Cached memory belongs to no tensor: it is not counted in a device's bytes_in_use. `Close` (the
// client's destructor) releases everything and turns the cache into a pass-through, so memory of
// buffers that outlive their client is released when they die.
//
// Take and Give cost O(1) whatever the number of entries (an index by size next to the age
// order), so that thousands of small blocks, one per tensor of a large batch, are cheap to keep.
//
// Thread-safe; `release` is called without the lock held, on the thread that evicts.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <list>
#include <mutex>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "ferry/core/metrics.h"
#include "ferry/core/mutex.h"
#include "src/core/fork_locks.h"

namespace ferry {

template <typename Handle>
class FreedMemoryCache {
 public:
  // `release` frees one handle for good. Entries smaller than `min_cached_bytes` are never cached
  // (the allocator already serves small sizes well). `cached_gauge` and `limit_gauge`, when not
  // null, follow the bytes held and the limit: the cache adds its changes to them, and takes its
  // share back when it is closed or destroyed, so a gauge shared by several caches reads the sum.
  FreedMemoryCache(int64_t limit_bytes, int64_t min_cached_bytes,
                   std::function<void(Handle)> release, Gauge* cached_gauge = nullptr,
                   Gauge* limit_gauge = nullptr)
      : min_cached_bytes_(min_cached_bytes),
        release_(std::move(release)),
        cached_gauge_(cached_gauge),
        limit_gauge_(limit_gauge),
        limit_bytes_(limit_bytes) {
    MutexLock lock(mutex_);
    UpdateGauges();
  }
  ~FreedMemoryCache() { Close(); }
  FreedMemoryCache(const FreedMemoryCache&) = delete;
  FreedMemoryCache& operator=(const FreedMemoryCache&) = delete;

  // A cached handle of exactly `size_bytes` (the most recently freed, its pages the likeliest to
  // be resident), or nullopt.
  std::optional<Handle> Take(int64_t size_bytes) {
    MutexLock lock(mutex_);
    auto same_size = by_size_.find(size_bytes);
    if (same_size == by_size_.end()) return std::nullopt;
    const typename std::list<Entry>::iterator newest = same_size->second.back();
    same_size->second.pop_back();
    if (same_size->second.empty()) by_size_.erase(same_size);
    Handle handle = std::move(newest->handle);
    cached_bytes_ -= size_bytes;
    by_age_.erase(newest);
    UpdateGauges();
    return handle;
  }

  // Keeps `handle` for reuse, or releases it when the cache is closed or the size is out of range.
  void Give(Handle handle, int64_t size_bytes) {
    std::list<Entry> evicted;
    {
      MutexLock lock(mutex_);
      if (!closed_ && size_bytes >= min_cached_bytes_ && size_bytes <= limit_bytes_) {
        while (cached_bytes_ + size_bytes > limit_bytes_) EvictOldest(evicted);
        by_age_.push_back({std::move(handle), size_bytes});
        by_size_[size_bytes].push_back(std::prev(by_age_.end()));
        cached_bytes_ += size_bytes;
        UpdateGauges();
      } else {
        evicted.push_back({std::move(handle), size_bytes});
      }
    }
    Release(evicted);
  }

  // Releases every cached handle; true when there was any (worth retrying a failed allocation).
  bool ReleaseAll() {
    std::list<Entry> evicted;
    {
      MutexLock lock(mutex_);
      evicted.swap(by_age_);
      by_size_.clear();
      cached_bytes_ = 0;
      UpdateGauges();
    }
    Release(evicted);
    return !evicted.empty();
  }

  // Releases every cached handle and caches nothing from now on (its limit leaves the gauge).
  void Close() {
    {
      MutexLock lock(mutex_);
      closed_ = true;
    }
    ReleaseAll();
  }

  // Keeps at most `limit_bytes` from now on, releasing the oldest entries beyond it.
  void SetLimit(int64_t limit_bytes) {
    std::list<Entry> evicted;
    {
      MutexLock lock(mutex_);
      limit_bytes_ = limit_bytes;
      while (cached_bytes_ > limit_bytes_) EvictOldest(evicted);
      UpdateGauges();
    }
    Release(evicted);
  }

  // Takes this cache's lock around every fork() (fork_locks.h). Only for a cache that is never
  // destroyed.
  void RegisterForkLock(internal::ForkLockRank rank) { internal::RegisterForkLock(rank, mutex_); }

  int64_t limit_bytes() const {
    MutexLock lock(mutex_);
    return limit_bytes_;
  }
  int64_t cached_bytes() const {
    MutexLock lock(mutex_);
    return cached_bytes_;
  }

 private:
  struct Entry {
    Handle handle;
    int64_t size_bytes;
  };

  // Moves the oldest entry to `evicted`. Requires the lock and an entry.
  void EvictOldest(std::list<Entry>& evicted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    const int64_t size_bytes = by_age_.front().size_bytes;
    // The oldest entry of all is the oldest of its size.
    auto same_size = by_size_.find(size_bytes);
    same_size->second.pop_front();
    if (same_size->second.empty()) by_size_.erase(same_size);
    cached_bytes_ -= size_bytes;
    evicted.splice(evicted.end(), by_age_, by_age_.begin());
  }

  // Adds what changed since the last report to the gauges; a closed cache reports a limit of 0.
  void UpdateGauges() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    const int64_t limit = closed_ ? 0 : limit_bytes_;
    if (cached_gauge_ != nullptr) cached_gauge_->Add(cached_bytes_ - reported_cached_bytes_);
    if (limit_gauge_ != nullptr) limit_gauge_->Add(limit - reported_limit_bytes_);
    reported_cached_bytes_ = cached_bytes_;
    reported_limit_bytes_ = limit;
  }

  void Release(std::list<Entry>& entries) const {
    for (Entry& entry : entries) release_(std::move(entry.handle));
  }

  const int64_t min_cached_bytes_;
  const std::function<void(Handle)> release_;
  Gauge* const cached_gauge_;
  Gauge* const limit_gauge_;
  mutable Mutex mutex_;
  int64_t limit_bytes_ ABSL_GUARDED_BY(mutex_);
  std::list<Entry> by_age_ ABSL_GUARDED_BY(mutex_);  // oldest first
  // Per size, the entries of by_age_ of that size, oldest first.
  absl::flat_hash_map<int64_t, std::deque<typename std::list<Entry>::iterator>> by_size_
      ABSL_GUARDED_BY(mutex_);
  int64_t cached_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;
  // This cache's share of the gauges, as last added to them.
  int64_t reported_cached_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t reported_limit_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ferry
