// When no thread can be started (a thread or memory limit), ferry's components say so instead of
// ending the process (std::terminate from a std::thread member being destroyed joinable) or
// keeping work that nothing will run. Each case runs in a forked child whose default thread stack
// is 1 TiB, which no thread can get.
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <string>
#include <system_error>
#include <thread>

#include "ferry/device/registry.h"
#include "gtest/gtest.h"
#include "src/core/serial_executor.h"
#include "src/device/staging_ring.h"
#include "src/device/transfer_engine.h"

namespace ferry {
namespace {

// Runs `check` in a forked child where no thread can start; its exit code (0: every check held;
// else the number of the first that failed, printed on stderr).
template <typename Check>
int InChildWithoutThreads(Check check) {
  const pid_t pid = fork();
  if (pid == 0) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, size_t{1} << 40);
    pthread_setattr_default_np(&attr);
    std::thread probe;
    try {
      probe = std::thread([] {});
    } catch (const std::system_error&) {
    }
    if (probe.joinable()) {
      probe.join();
      _exit(100);  // threads still start here: nothing to tell
    }
    _exit(check());
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status)
                           : 200 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FERRY_SKIP_UNDER_SANITIZERS() \
  GTEST_SKIP()                        \
      << "the sanitizers' pthread_create runs threads their own way; the plain build runs this"
#else
#define FERRY_SKIP_UNDER_SANITIZERS() (void)0
#endif

int Outcome(int code) {
  if (code == 100) std::fprintf(stderr, "threads still start in the child\n");
  return code;
}

TEST(ThreadLimitsTest, NoThreadToBeHadIsAnErrorNotAnAbort) {
  FERRY_SKIP_UNDER_SANITIZERS();
  const int code = InChildWithoutThreads([] {
    // The transfer engine: its constructor throws, leaving nothing running (it aborted).
    try {
      TransferEngine engine(4);
      return 1;
    } catch (const std::system_error&) {
    }
    // A client: ResourceExhausted saying so.
    StatusOr<std::unique_ptr<Client>> client = CreateClient("host");
    if (client.ok() || client.status().code() != absl::StatusCode::kResourceExhausted) return 2;
    if (std::string(client.status().message()).find("threads") == std::string::npos) return 3;
    // A staging ring: the job is refused, not kept for a worker that never starts.
    bool ran = false;
    {
      StagingRing ring("the test ring", StagingChunkAllocator::Host());
      const Status submitted = ring.Submit([&](Status) { ran = true; });
      if (submitted.code() != absl::StatusCode::kResourceExhausted) return 4;
    }
    if (ran) return 5;
    // A serial executor: the task runs on the calling thread.
    SerialExecutor executor;
    bool executed = false;
    executor.Execute([&] { executed = true; });
    if (!executed) return 6;
    return 0;
  });
  if (code == 100) GTEST_SKIP() << "a 1 TiB thread stack could be had here: nothing to tell";
  EXPECT_EQ(Outcome(code), 0) << "the check that failed (200 + signal: the child died)";
}

}  // namespace
}  // namespace ferry
