#include "src/core/fork_locks.h"

#include <pthread.h>

#include <array>
#include <atomic>

namespace ferry::internal {
namespace {

constexpr int kRanks = static_cast<int>(ForkLockRank::kCount);

struct Entry {
  void (*lock)(void*);
  void (*unlock)(void*);
  void* context;
  Entry* next;
};

// One list per rank, pushed to without a lock: registration may happen while registered locks
// are held (a metric is created under the metrics registry's lock), so taking a lock here could
// deadlock with a fork waiting for that registry's lock. Entries are never removed or freed.
std::array<std::atomic<Entry*>, kRanks> lists{};

// What the last prepare step locked, for the parent and child steps to unlock: an entry
// registered after its rank was locked was not taken, and must not be released. Written and read
// by the forking thread only (glibc runs one fork's handlers at a time).
std::array<Entry*, kRanks> locked{};

void LockAll() {
  for (int rank = 0; rank < kRanks; ++rank) {
    locked[rank] = lists[rank].load(std::memory_order_acquire);
    for (Entry* entry = locked[rank]; entry != nullptr; entry = entry->next) {
      entry->lock(entry->context);
    }
  }
}

// The same in the parent and in the child: the child is the forking thread's copy, which owns
// every lock taken above, so it may release them as the parent does.
void UnlockAll() {
  for (int rank = kRanks - 1; rank >= 0; --rank) {
    for (Entry* entry = locked[rank]; entry != nullptr; entry = entry->next) {
      entry->unlock(entry->context);
    }
  }
}

std::atomic<uint64_t> fork_generation{0};

void InChild() {
  UnlockAll();
  fork_generation.fetch_add(1, std::memory_order_relaxed);
}

// Once per process (per copy of ferry: the plugin holds its own); the handlers only walk the
// lists, so registering before the first entry exists is harmless.
void RegisterHandlersOnce() {
  static const bool handlers_registered = pthread_atfork(&LockAll, &UnlockAll, &InChild) == 0;
  (void)handlers_registered;
}

void LockMutex(void* mutex) ABSL_NO_THREAD_SAFETY_ANALYSIS { static_cast<Mutex*>(mutex)->Lock(); }
void UnlockMutex(void* mutex) ABSL_NO_THREAD_SAFETY_ANALYSIS {
  static_cast<Mutex*>(mutex)->Unlock();
}

}  // namespace

void RegisterForkLock(ForkLockRank rank, void (*lock)(void*), void (*unlock)(void*),
                      void* context) {
  RegisterHandlersOnce();
  std::atomic<Entry*>& list = lists[static_cast<int>(rank)];
  auto* entry = new Entry{lock, unlock, context, list.load(std::memory_order_relaxed)};
  while (!list.compare_exchange_weak(entry->next, entry, std::memory_order_release,
                                     std::memory_order_relaxed)) {
  }
}

uint64_t ForkGeneration() {
  RegisterHandlersOnce();
  return fork_generation.load(std::memory_order_relaxed);
}

void RegisterForkLock(ForkLockRank rank, Mutex& mutex) {
  RegisterForkLock(rank, &LockMutex, &UnlockMutex, &mutex);
}

}  // namespace ferry::internal
