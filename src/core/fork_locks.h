// Process-wide locks across fork(): POSIX gives the child a copy of every mutex in the state it had
// at the fork, so a lock that another thread held then stays held forever in the child (the
// thread that would release it does not exist there), and the child's first use of that registry
// hangs. Each process-wide lock is registered here once; around every fork() the forking thread
// takes all of them (so no other thread is inside one, and the data they guard is consistent) and
// releases them again after the fork, in the parent and in the child.
//
// Only locks that are held briefly and never across a call that could wait for the forking thread
// belong here: fork() waits for them with glibc's fork-handler lock held (so a holder that calls
// dlopen, whose library constructors may call pthread_atfork, would deadlock with it). The library
// loaders' locks, held across dlopen, are therefore not registered.
#pragma once

#include <cstdint>

#include "ferry/core/mutex.h"

namespace ferry::internal {

// The order in which fork takes the registered locks, outermost first: code that holds a lock of
// one rank may take locks of later ranks, never of earlier ones (as fork does, so it cannot
// deadlock with normal use). Locks of one rank are never held together.
enum class ForkLockRank : int {
  kDeviceRegistry,
  kSmallAllocations,        // the device slab pool: allocates its slabs from the host cache
  kHostMemoryCacheRefresh,  // reads the settings, then resizes the cache
  kConvertKernelLevel,      // reads the settings
  kHostMemoryCache,
  kMappedFiles,
  kPluginState,  // ferry's PJRT plugin: its client table and its pending puts (never both)
  kPluginErrors,
  kPluginEvents,
  kSettings,
  kMetricsRegistry,  // the registry, then every metric's own lock
  kCount,
};

// Takes `mutex` before every fork() of this process and releases it after, in the parent and in
// the child. `mutex` must live until the process ends (the registries' are never destroyed). Call
// once per mutex; safe from any thread, also while holding registered locks (registration takes
// no lock).
void RegisterForkLock(ForkLockRank rank, Mutex& mutex);

// As above, for a lock that is not one Mutex: `lock(context)` runs before the fork and must leave
// every lock it took held; `unlock(context)` runs after, in the parent and in the child.
void RegisterForkLock(ForkLockRank rank, void (*lock)(void*), void (*unlock)(void*), void* context);

// How many fork()s lie between the first call of any function here (in this copy of ferry) and
// the calling process: 0 in the process that called first, 1 in its forked child, and so on. A
// component that owns threads records it when it starts them, and in a forked child (a larger
// number: none of those threads exist there) makes its own instead of waiting for them forever.
uint64_t ForkGeneration();

}  // namespace ferry::internal
