// Future<T> / Promise<T>: a one-shot value (or error Status) produced on one thread and consumed
// on others, in the manner of PJRT's futures.
//
// - A Promise is set once. A second Set is a bug of its producer: builds with assertions on (the
//   sanitizer builds: no NDEBUG) stop at it; others ignore it (the first value stands). Producers
//   that race by design (a completion against a cancellation) say so with SetIfUnset, whose later
//   calls are ignored in every build. When the last copy of
//   a Promise goes without having been set, its future completes with Aborted ("dropped before it
//   was set") instead of never: a producer that fails without saying so cannot hang its consumers.
// - `Future::OnReady(cb)` runs `cb` exactly once: inline on the calling thread if the future is
//   already ready, otherwise on the thread that sets the promise, after the value is stored.
//   Callbacks must not block for long: they run on runtime threads. `OnReady(executor, cb)` runs
//   `cb` on an Executor's thread instead (work that may block or take long).
// - `Await()` blocks the calling thread until ready; `AwaitFor(timeout)` at most `timeout`. Never
//   call them while holding a lock that the producer needs (or the Python GIL: the Python layer
//   releases it first).
// Futures are cheap shared handles; all members are thread-safe. A ready future is read without
// taking its lock, and Future<>::Ready(OkStatus()) allocates nothing (one shared ready state).
#pragma once

#include <atomic>
#include <cassert>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/types/span.h"
#include "ferry/core/mutex.h"
#include "ferry/core/status.h"

namespace ferry {

namespace internal {

template <typename T>
using FutureValue = std::conditional_t<std::is_void_v<T>, Status, StatusOr<T>>;

template <typename T>
class FutureState {
 public:
  using Value = FutureValue<T>;
  using Callback = absl::AnyInvocable<void(const Value&) &&>;

  // value_ is written once, under the lock, before set_ is released; from then on it is immutable,
  // and the readers below take it without the lock once set_ (acquire) says so, which the static
  // analysis cannot follow: they are excluded from it, and TSan checks them at run time.
  // Stores `value` and runs the callbacks; false (and nothing changes) when already set.
  bool Set(Value value) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    std::vector<Callback> callbacks;
    {
      MutexLock lock(mutex_);
      if (value_.has_value()) return false;  // set once
      value_.emplace(std::move(value));
      set_.store(true, std::memory_order_release);
      callbacks.swap(callbacks_);
    }
    ready_.notify_all();
    // The value is immutable from here on: callbacks read it without the lock.
    for (Callback& callback : callbacks) std::move(callback)(*value_);
    return true;
  }

  // Once set_ reads true (acquire), value_ is immutable and visible: no lock needed.
  bool IsReady() const { return set_.load(std::memory_order_acquire); }

  const Value& Await() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (IsReady()) return *value_;
    MutexLock lock(mutex_);
    while (!value_.has_value()) lock.Wait(ready_);
    return *value_;
  }

  // The value once ready within `timeout`, else null.
  const Value* AwaitFor(std::chrono::nanoseconds timeout) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (IsReady()) return &*value_;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    MutexLock lock(mutex_);
    while (!value_.has_value()) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return nullptr;
      lock.WaitFor(ready_, deadline - now);
    }
    return &*value_;
  }

  void OnReady(Callback callback) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (!IsReady()) {
      MutexLock lock(mutex_);
      if (!value_.has_value()) {
        callbacks_.push_back(std::move(callback));
        return;
      }
    }
    std::move(callback)(*value_);
  }

 private:
  mutable Mutex mutex_;
  mutable std::condition_variable ready_;
  std::atomic<bool> set_{false};
  std::optional<Value> value_ ABSL_GUARDED_BY(mutex_);  // immutable once set_ is true
  std::vector<Callback> callbacks_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace internal

// Runs tasks on threads of its own: where a continuation must not run on the thread that
// completes a future (a plugin's event thread, a thread holding a lock). `Execute` runs `task`
// exactly once: on one of the executor's threads, or, once the executor has stopped, on the
// calling thread (a continuation is never lost). Implementations are thread-safe.
class Executor {
 public:
  virtual ~Executor() = default;
  virtual void Execute(absl::AnyInvocable<void() &&> task) = 0;
};

template <typename T = void>
class Future;

template <typename T = void>
class Promise {
 public:
  using Value = internal::FutureValue<T>;

  Promise()
      : state_(std::make_shared<internal::FutureState<T>>()),
        unset_guard_(std::make_shared<UnsetGuard>(state_)) {}

  // Completes the future; runs its waiting callbacks on this thread. Exactly once per promise
  // (see the top of this file).
  void Set(Value value) const {
    [[maybe_unused]] const bool first = state_->Set(std::move(value));
    assert(first && "Promise::Set called on a promise already set (use SetIfUnset where racing)");
  }
  // Completes the future unless it already is; true when this call did.
  bool SetIfUnset(Value value) const { return state_->Set(std::move(value)); }
  Future<T> future() const { return Future<T>(state_); }

 private:
  // Shared by the copies of one Promise (not by its futures): the last copy to go completes a
  // future still unset with Aborted, on the thread that drops it.
  struct UnsetGuard {
    explicit UnsetGuard(std::shared_ptr<internal::FutureState<T>> state)
        : state(std::move(state)) {}
    ~UnsetGuard() {
      if (!state->IsReady()) {
        state->Set(Value(AbortedError("the promise was dropped before it was set")));
      }
    }
    std::shared_ptr<internal::FutureState<T>> state;
  };

  std::shared_ptr<internal::FutureState<T>> state_;
  std::shared_ptr<UnsetGuard> unset_guard_;
};

template <typename T>
class Future {
 public:
  using Value = internal::FutureValue<T>;

  // An invalid future; only assignment and `valid()` may be used on it.
  Future() = default;

  // A future that is already ready with `value`. For an OK Future<> this is one state shared by
  // the whole process, made once (a buffer that is ready when made costs no allocation).
  static Future Ready(Value value) {
    if constexpr (std::is_void_v<T>) {
      if (value.ok()) {
        static const auto* const ok = new std::shared_ptr<internal::FutureState<void>>([] {
          auto state = std::make_shared<internal::FutureState<void>>();
          state->Set(OkStatus());
          return state;
        }());
        return Future(*ok);
      }
    }
    Promise<T> promise;
    promise.Set(std::move(value));
    return promise.future();
  }

  bool valid() const { return state_ != nullptr; }
  bool IsReady() const { return state_->IsReady(); }
  // Blocks until ready. The reference stays valid while any copy of this future lives.
  const Value& Await() const { return state_->Await(); }
  // The value if it is ready within `timeout` (valid while any copy of this future lives), else
  // null: the future is still pending.
  const Value* AwaitFor(std::chrono::nanoseconds timeout) const {
    return state_->AwaitFor(timeout);
  }
  // `callback(value)` runs exactly once; see the file comment for the thread.
  void OnReady(absl::AnyInvocable<void(const Value&) &&> callback) const {
    state_->OnReady(std::move(callback));
  }
  // `callback(value)` runs exactly once, on `executor` (handed to it once the future is ready,
  // from the thread that completes it, or from this one when it is ready already). `executor`
  // must outlive that hand-over.
  void OnReady(Executor& executor, absl::AnyInvocable<void(const Value&) &&> callback) const {
    state_->OnReady(
        [&executor, state = state_, callback = std::move(callback)](const Value&) mutable {
          executor.Execute([state = std::move(state), callback = std::move(callback)]() mutable {
            std::move(callback)(state->Await());  // ready: Await only reads the value
          });
        });
  }

 private:
  friend class Promise<T>;
  explicit Future(std::shared_ptr<internal::FutureState<T>> state) : state_(std::move(state)) {}

  std::shared_ptr<internal::FutureState<T>> state_;
};

// A future that completes when every one of `futures` has completed: OK if all are OK,
// otherwise the first error in argument order.
Future<> JoinFutures(absl::Span<const Future<>> futures);

}  // namespace ferry
