#include "src/core/background_executor.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "ferry/core/future.h"

namespace ferry {
namespace {

TEST(BackgroundExecutorTest, IsOneExecutorWhoseTasksRunOffTheCallingThread) {
  Executor& executor = BackgroundExecutor();
  EXPECT_EQ(&executor, &BackgroundExecutor());
  Promise<std::thread::id> ran_on;
  executor.Execute([ran_on] { ran_on.Set(std::this_thread::get_id()); });
  const StatusOr<std::thread::id>* id = ran_on.future().AwaitFor(std::chrono::seconds(30));
  ASSERT_NE(id, nullptr) << "the task never ran";
  ASSERT_TRUE(id->ok());
  EXPECT_NE(**id, std::this_thread::get_id());
}

// A child forked after the parent's executor started has no thread behind that executor: it gets
// one of its own, and its tasks run.
TEST(BackgroundExecutorTest, AForkedChildGetsAnExecutorOfItsOwn) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "ThreadSanitizer does not support a fork of a process that has threads";
#else
  Promise<> started;
  BackgroundExecutor().Execute([started] { started.Set(OkStatus()); });
  ASSERT_NE(started.future().AwaitFor(std::chrono::seconds(30)), nullptr);
  Executor* parents = &BackgroundExecutor();
  const pid_t child = fork();
  ASSERT_GE(child, 0) << "fork failed";
  if (child == 0) {
    Executor& own = BackgroundExecutor();
    Promise<> ran;
    own.Execute([ran] { ran.Set(OkStatus()); });
    const bool task_ran = ran.future().AwaitFor(std::chrono::seconds(30)) != nullptr;
    _exit(&own == parents ? 2 : (task_ran ? 0 : 1));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_NE(WEXITSTATUS(status), 2) << "the child was handed its parent's executor";
  EXPECT_NE(WEXITSTATUS(status), 1) << "the child's task never ran";
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(&BackgroundExecutor(), parents) << "the parent's executor changed";
#endif
}

}  // namespace
}  // namespace ferry
