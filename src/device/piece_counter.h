// PieceCounter: counts the pieces of one asynchronous operation (its chunks, its events) and runs
// `finish` exactly once, with the first error, when the last piece is done. It starts with one
// piece: the hold of whoever is still adding pieces, released by a final Done(). Shared (held by
// every piece's continuation), thread-safe; `finish` runs on the thread that ends the last piece.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "ferry/core/status.h"
#include "src/core/mutex.h"

namespace ferry {

class PieceCounter {
 public:
  explicit PieceCounter(absl::AnyInvocable<void(Status) &&> finish) : finish_(std::move(finish)) {}
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
      MutexLock lock(mutex_);
      result = first_error_;
    }
    std::move(finish_)(std::move(result));
  }

 private:
  absl::AnyInvocable<void(Status) &&> finish_;
  std::atomic<int64_t> pending_{1};
  Mutex mutex_;
  Status first_error_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace ferry
