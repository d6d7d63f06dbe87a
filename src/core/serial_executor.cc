#include "src/core/serial_executor.h"

#include <system_error>
#include <utility>

#include "ferry/core/runtime_thread.h"

namespace ferry {

SerialExecutor::~SerialExecutor() {
  std::thread thread;
  {
    MutexLock lock(mutex_);
    stopping_ = true;
    thread = std::move(thread_);
  }
  task_given_.notify_all();
  if (thread.joinable()) thread.join();
}

void SerialExecutor::Execute(absl::AnyInvocable<void() &&> task) {
  {
    MutexLock lock(mutex_);
    bool running = thread_.joinable();
    if (!stopping_ && !running) {
      try {
        thread_ = std::thread([this] { Loop(); });
        running = true;
      } catch (const std::system_error&) {
        // No thread to be had (a thread or memory limit): this task runs here, as after Stop.
      }
    }
    if (!stopping_ && running) {
      tasks_.push_back(std::move(task));
      task_given_.notify_one();
      return;
    }
  }
  std::move(task)();
}

void SerialExecutor::Loop() {
  RuntimeThreadScope runtime_thread;
  MutexLock lock(mutex_);
  for (;;) {
    while (tasks_.empty() && !stopping_) lock.Wait(task_given_);
    if (tasks_.empty()) return;  // stopping, and every task given has run
    absl::AnyInvocable<void()&&> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.Unlock();
    std::move(task)();
    lock.Lock();
  }
}

}  // namespace ferry
