#include "src/core/serial_executor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "ferry/core/future.h"

namespace ferry {
namespace {

TEST(SerialExecutorTest, RunsTasksInTheOrderGivenOnAThreadOfItsOwn) {
  std::vector<int> order;  // written only by the executor's thread, read after the last task
  std::vector<std::thread::id> threads;
  Promise<> last;
  // Declared last, so destroyed (its thread joined) first: a task may still be inside
  // last.Set(), after waking this thread, when the test ends.
  SerialExecutor executor;
  for (int i = 0; i < 100; ++i) {
    executor.Execute([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
      if (i == 99) last.Set(OkStatus());
    });
  }
  ASSERT_NE(last.future().AwaitFor(std::chrono::seconds(30)), nullptr);
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  for (const std::thread::id& thread : threads) {
    EXPECT_EQ(thread, threads.front());
    EXPECT_NE(thread, std::this_thread::get_id());
  }
}

TEST(SerialExecutorTest, TasksFromManyThreadsEachRunOnceAndMayGiveMore) {
  std::atomic<int> runs{0};
  {
    SerialExecutor executor;
    std::vector<std::thread> givers;
    for (int t = 0; t < 4; ++t) {
      givers.emplace_back([&] {
        for (int i = 0; i < 250; ++i) {
          // Each task gives one more from the executor's own thread: it queues, never deadlocks.
          executor.Execute([&] {
            runs.fetch_add(1);
            executor.Execute([&] { runs.fetch_add(1); });
          });
        }
      });
    }
    for (std::thread& giver : givers) giver.join();
  }  // the destructor runs every task given before it began
  EXPECT_EQ(runs.load(), 2000);
}

TEST(SerialExecutorTest, FutureContinuationsRunOnTheExecutorNotOnTheSettingThread) {
  Promise<int> promise;
  Promise<std::thread::id> ran_on;
  SerialExecutor executor;  // destroyed first: see above
  promise.future().OnReady(executor, [&](const StatusOr<int>& value) {
    EXPECT_EQ(*value, 7);
    ran_on.Set(std::this_thread::get_id());
  });
  std::thread setter([&] { promise.Set(7); });
  const std::thread::id setter_id = setter.get_id();
  setter.join();
  const StatusOr<std::thread::id>* id = ran_on.future().AwaitFor(std::chrono::seconds(30));
  ASSERT_NE(id, nullptr);
  EXPECT_NE(**id, setter_id);
  EXPECT_NE(**id, std::this_thread::get_id());
}

}  // namespace
}  // namespace ferry
