// fork() while other threads are inside ferry's process-wide registries: the child gets a copy of
// every lock in the state it had at the fork, and a lock that another thread held then is held
// forever in the child (that thread does not exist there). These tests fork while threads hammer
// the host memory cache, the metrics registry and the settings, and expect every child to finish.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/core/settings.h"

namespace ferry {
namespace {

// One round of what the registries are used for: the host memory cache (above its minimum cached
// size, so that the cache's lock is taken), a counter and a metric (the registry's lock and a
// metric's own), a setting read and a setting change (the settings lock, and the cache's refresh,
// which reads the settings under its own lock).
void UseEveryRegistry(int round) {
  const int64_t size_bytes = int64_t{4096} * (1 + round % 4);
  std::byte* memory = AllocateHostMemory(size_bytes);
  if (memory != nullptr) {
    memory[0] = std::byte{1};
    FreeHostMemory(memory, size_bytes);
  }
  GetCounter("ForkTestCounter")->Add(1);
  GetMetric("ForkTestMetric", MetricUnit::kCount)->AddSample(round);
  (void)settings::HostMemoryCacheBytes();
  if (round % 64 == 0) {
    (void)SetSetting("FERRY_HOST_MEMORY_CACHE_BYTES", round % 128 == 0 ? "64M" : "");
  }
}

// Waits up to `deadline` for `child` to exit; kills it when it does not. True when it exited 0.
bool ChildExitedCleanly(pid_t child, std::chrono::steady_clock::time_point deadline,
                        std::string& problem) {
  int status = 0;
  while (true) {
    const pid_t done = waitpid(child, &status, WNOHANG);
    if (done == child) break;
    if (done < 0) {
      problem = "waitpid failed";
      return false;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      problem = "hung (killed)";
      return false;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  problem = WIFSIGNALED(status) ? "died of signal " + std::to_string(WTERMSIG(status))
                                : "exited " + std::to_string(WEXITSTATUS(status));
  return false;
}

TEST(Fork, ChildOfBusyProcessUsesHostCacheMetricsAndSettings) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // The sanitizers' own allocators are not fork-safe here (GCC 12's runtimes): a child forked
  // while another thread is inside ASan's malloc hangs in
  // SizeClassAllocator64::GetFromAllocator, whatever ferry does, and TSan does not support
  // fork() while other threads run (die_after_fork). The plain build runs this test.
  GTEST_SKIP() << "the sanitizer's allocator does not survive fork() while other threads allocate";
#endif
  constexpr int kThreads = 4;
  constexpr int kChildren = 20;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&stop, t] {
      for (int round = t; !stop.load(std::memory_order_relaxed); ++round) UseEveryRegistry(round);
    });
  }
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    // Let the threads get going between forks, so that each fork lands inside some lock.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const pid_t child = fork();
    ASSERT_GE(child, 0) << "fork failed";
    if (child == 0) {
      // Only async-signal-safe calls are promised in a child of a multi-threaded process; ferry
      // promises more for its own registries, which is what this checks.
      for (int round = 0; round < 4; ++round) UseEveryRegistry(round);
      _exit(0);
    }
    children.push_back(child);
  }
  stop.store(true);
  for (std::thread& thread : threads) thread.join();
  (void)ClearSetting("FERRY_HOST_MEMORY_CACHE_BYTES");

  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  int failed = 0;
  for (size_t c = 0; c < children.size(); ++c) {
    std::string problem;
    if (!ChildExitedCleanly(children[c], deadline, problem)) {
      ++failed;
      ADD_FAILURE() << "child " << c << " " << problem;
    }
  }
  EXPECT_EQ(failed, 0) << "of " << kChildren << " children";
}

}  // namespace
}  // namespace ferry
