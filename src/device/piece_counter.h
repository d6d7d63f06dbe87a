// PieceCounter: counts the pieces of one asynchronous operation (its chunks, its commands, its
// events) and runs `finish` exactly once, with the first error, when the last piece is done, then
// releases the operation's client token (if it has one), after `finish` and its captures are gone.
// It starts with one piece: the hold of whoever is still adding pieces, released by a final
// Done(). Shared (held by every piece's continuation), thread-safe; `finish` runs on the thread
// that ends the last piece. Used by every backend whose pieces complete on runtime threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "ferry/core/mutex.h"
#include "ferry/core/status.h"
#include "src/device/client_lifetime.h"

namespace ferry {

class PieceCounter {
 public:
  explicit PieceCounter(absl::AnyInvocable<void(Status) &&> finish,
                        ClientLifetime::Token token = ClientLifetime::Token())
      : finish_(std::move(finish)), token_(std::move(token)) {}
  PieceCounter(const PieceCounter&) = delete;
  PieceCounter& operator=(const PieceCounter&) = delete;

  void Add() { pending_.fetch_add(1, std::memory_order_relaxed); }
  void Done(Status status) {
    if (!status.ok()) {
      MutexLock lock(mutex_);
      if (first_error_.ok()) first_error_ = std::move(status);
    }
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    Status result;
    {
      // Moved out, not copied: the counter may be destroyed on another thread than the one that
      // reads the result, and a copy left here would free a shared error message there, through
      // an atomic count that ThreadSanitizer cannot see (Debian's abseil is not instrumented).
      MutexLock lock(mutex_);
      result = std::move(first_error_);
    }
    {
      // The captures (a caller's on_done among them) are gone before the token is released.
      absl::AnyInvocable<void(Status)&&> finish = std::move(finish_);
      std::move(finish)(std::move(result));
    }
    token_.Release();
  }

 private:
  absl::AnyInvocable<void(Status) &&> finish_;
  ClientLifetime::Token token_;
  std::atomic<int64_t> pending_{1};
  Mutex mutex_;
  Status first_error_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ferry
