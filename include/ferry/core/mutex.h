// Mutex and MutexLock: std::mutex with clang's thread-safety annotations, so that what each mutex
// guards is declared (ABSL_GUARDED_BY) and checked at compile time (-Wthread-safety, the clang
// build in scripts/test.sh).
//
// Why not std::mutex or absl::Mutex directly: libstdc++'s std::mutex and std::lock_guard carry no
// capability annotations, so clang rejects ABSL_GUARDED_BY on them; absl::Mutex has them, but
// Debian's libabsl is not built with ThreadSanitizer, and absl::Mutex synchronises inside it, out
// of TSan's sight (TSan would report every guarded access as a race). This wrapper locks a plain
// std::mutex (pthread, which TSan intercepts) and only adds the annotations.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "absl/base/thread_annotations.h"

namespace ferry {

class ABSL_LOCKABLE Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { mutex_.lock(); }
  void Unlock() ABSL_UNLOCK_FUNCTION() { mutex_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex mutex_;
};

// Holds `mutex` for its scope (like std::unique_lock: it may be released and taken again inside
// the scope, and waited on with a std::condition_variable).
class ABSL_SCOPED_LOCKABLE MutexLock {
 public:
  explicit MutexLock(Mutex& mutex) ABSL_EXCLUSIVE_LOCK_FUNCTION(mutex) : lock_(mutex.mutex_) {}
  ~MutexLock() ABSL_UNLOCK_FUNCTION() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() ABSL_UNLOCK_FUNCTION() { lock_.unlock(); }
  void Lock() ABSL_EXCLUSIVE_LOCK_FUNCTION() { lock_.lock(); }

  // Releases the mutex, sleeps until `condition` is notified (or wakes spuriously), and takes the
  // mutex again. Call it in a loop that tests the awaited state: written in the caller, that test
  // is checked against the annotations (a predicate lambda would not be).
  void Wait(std::condition_variable& condition) { condition.wait(lock_); }
  // As Wait, for at most `timeout`.
  template <typename Rep, typename Period>
  void WaitFor(std::condition_variable& condition, std::chrono::duration<Rep, Period> timeout) {
    condition.wait_for(lock_, timeout);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

}  // namespace ferry
