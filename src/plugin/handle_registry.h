// HandleRegistry: the opaque C API objects (PJRT_Error*, PJRT_Event*) that ferry's plugin made and
// has not destroyed yet. A caller hands ferry's table every such object it holds, ferry's or the
// wrapped plugin's alike; the registry, not a tag inside the object, tells them apart, so ferry
// never reads memory behind a pointer the wrapped plugin owns.
//
// Thread-safe. Registries are made once and never destroyed (plugin threads may use them while the
// process exits); their lock is held across fork() (src/core/fork_locks.h).
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "ferry/core/mutex.h"
#include "src/core/fork_locks.h"

namespace ferry::plugin {

class HandleRegistry {
 public:
  explicit HandleRegistry(internal::ForkLockRank rank) { internal::RegisterForkLock(rank, mutex_); }
  HandleRegistry(const HandleRegistry&) = delete;
  HandleRegistry& operator=(const HandleRegistry&) = delete;

  void Add(const void* handle) {
    MutexLock lock(mutex_);
    live_.insert(handle);
  }
  // True (and forgets it) when `handle` was ferry's.
  bool Remove(const void* handle) {
    MutexLock lock(mutex_);
    return live_.erase(handle) > 0;
  }
  bool Contains(const void* handle) {
    MutexLock lock(mutex_);
    return live_.contains(handle);
  }

 private:
  Mutex mutex_;
  absl::flat_hash_set<const void*> live_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ferry::plugin
