#include "src/core/background_executor.h"

#include <unistd.h>

#include <atomic>

#include "src/core/serial_executor.h"

namespace ferry {
namespace {

struct ProcessExecutor {
  explicit ProcessExecutor(pid_t owner) : pid(owner) {}
  const pid_t pid;
  SerialExecutor executor;
};

// No lock: a child forked while another thread held one would wait for it forever.
std::atomic<ProcessExecutor*> current{nullptr};

}  // namespace

Executor& BackgroundExecutor() {
  const pid_t pid = getpid();
  ProcessExecutor* executor = current.load(std::memory_order_acquire);
  while (executor == nullptr || executor->pid != pid) {
    // Never deleted: the first (or, after a fork, the parent's) is left as it is.
    auto* fresh = new ProcessExecutor(pid);
    if (current.compare_exchange_strong(executor, fresh, std::memory_order_acq_rel)) {
      return fresh->executor;
    }
    delete fresh;  // another thread installed one first: `executor` now holds it
  }
  return executor->executor;
}

}  // namespace ferry
