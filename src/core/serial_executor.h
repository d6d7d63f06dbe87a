// SerialExecutor: an Executor (ferry/core/future.h) with one thread of its own, which runs the
// tasks it is given one at a time, in the order given.
//
// For continuations that must run neither on the thread that completes a future (a copy worker
// whose next chunk waits) nor on a caller's thread, and whose own callbacks may run inline: ferry's
// plugin fulfils its pending buffers here, so the callbacks that the plugin's users registered on
// those buffers never hold up a copy worker.
//
// Ownership and threading: Execute may be called from any thread, tasks included. The thread
// starts with the first task. The destructor runs the tasks already given, then joins the thread;
// a task given after the destructor has begun, or while no thread can be started (a thread or
// memory limit), runs on the calling thread (a continuation is never lost). Not for use in a forked
// child of a process whose executor had started (the child has no thread): as with every ferry
// worker, fork before the first transfer.
#pragma once

#include <condition_variable>
#include <deque>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "ferry/core/future.h"
#include "ferry/core/mutex.h"

namespace ferry {

class SerialExecutor final : public Executor {
 public:
  SerialExecutor() = default;
  ~SerialExecutor() override;
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  void Execute(absl::AnyInvocable<void() &&> task) override;

 private:
  void Loop();

  Mutex mutex_;
  std::condition_variable task_given_;
  std::deque<absl::AnyInvocable<void() &&>> tasks_ ABSL_GUARDED_BY(mutex_);
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread thread_ ABSL_GUARDED_BY(mutex_);  // started by the first Execute
};

}  // namespace ferry
