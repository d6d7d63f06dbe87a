// CallOnItsOwnThread: runs a call that must not block on a thread of its own, so that a test can
// tell "returned at once" from "waits for something" without hanging when it does wait.
//
// The pattern: start the call, ask ReturnedWithin(timeout), then unblock whatever the call could
// be waiting for (finish a fill, abort it), then Join() and look at what the call produced. The
// destructor joins too, so the thread never outlives the objects the call refers to, as long as
// the test unblocks it before they go.
#pragma once

#include <atomic>
#include <chrono>
#include <thread>
#include <utility>

#include "absl/functional/any_invocable.h"

namespace ferry::test_support {

class CallOnItsOwnThread {
 public:
  explicit CallOnItsOwnThread(absl::AnyInvocable<void() &&> call)
      : thread_([this, call = std::move(call)]() mutable {
          std::move(call)();
          returned_.store(true, std::memory_order_release);
        }) {}
  ~CallOnItsOwnThread() { Join(); }
  CallOnItsOwnThread(const CallOnItsOwnThread&) = delete;
  CallOnItsOwnThread& operator=(const CallOnItsOwnThread&) = delete;

  // Whether the call has returned, waiting up to `timeout` for it.
  bool ReturnedWithin(std::chrono::milliseconds timeout) const {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (!returned_.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return returned_.load(std::memory_order_acquire);
  }

  void Join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> returned_{false};
  std::thread thread_;  // last: starts once returned_ exists
};

}  // namespace ferry::test_support
