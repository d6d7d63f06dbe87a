// ParallelFor runs every index exactly once, and really on several threads at once, in every
// build: under ThreadSanitizer too, where it once ran serially and so hid the races of the bodies.
#include "src/runtime/parallel_for.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace ferry::internal {
namespace {

// Runs `parallel_for` over bodies that each wait until two of them are running at once; true
// when they met, i.e. the bodies did overlap. Run one at a time, the first body waits 5 s in
// vain and the others give up at once.
template <typename ParallelForFn>
bool BodiesOverlap(const ParallelForFn& parallel_for) {
  std::mutex mutex;
  std::condition_variable changed;
  int running = 0;
  bool met = false;
  bool gave_up = false;
  parallel_for(64, 1, [&](size_t) {
    std::unique_lock<std::mutex> lock(mutex);
    ++running;
    if (running >= 2) met = true;
    changed.notify_all();
    if (!gave_up && !changed.wait_for(lock, std::chrono::seconds(5), [&] { return met; })) {
      gave_up = true;
    }
    --running;
  });
  return met;
}

TEST(ParallelForTest, EveryIndexRunsExactlyOnce) {
  for (size_t grain : {1, 7, 64, 1000}) {
    SCOPED_TRACE(grain);
    std::vector<std::atomic<int>> runs(1000);
    ParallelFor(runs.size(), grain, [&](size_t i) { runs[i].fetch_add(1); });
    for (size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << "index " << i;
  }
  ParallelFor(0, 1, [](size_t) { ADD_FAILURE() << "a body ran for an empty range"; });
}

TEST(ParallelForTest, ThreadParallelForRunsEveryIndexExactlyOnce) {
  for (size_t grain : {0, 1, 7, 64, 1000}) {
    SCOPED_TRACE(grain);
    std::vector<std::atomic<int>> runs(1000);
    ThreadParallelFor(runs.size(), grain, [&](size_t i) { runs[i].fetch_add(1); });
    for (size_t i = 0; i < runs.size(); ++i) ASSERT_EQ(runs[i].load(), 1) << "index " << i;
  }
}

// The bodies overlap in time: a race between them is a real race that ThreadSanitizer can see.
TEST(ParallelForTest, BodiesRunOnSeveralThreadsAtOnce) {
#if !defined(FERRY_THREAD_SANITIZER)
  if (std::thread::hardware_concurrency() < 2) {
    GTEST_SKIP() << "one core: oneTBB runs everything on the calling thread";
  }
#endif
  EXPECT_TRUE(BodiesOverlap([](size_t count, size_t grain, const auto& body) {
    ParallelFor(count, grain, body);
  })) << "ParallelFor ran its bodies one at a time";
}

// The std::thread version overlaps even on one core (it is what TSan builds run).
TEST(ParallelForTest, ThreadParallelForBodiesRunAtOnce) {
  EXPECT_TRUE(BodiesOverlap(
      [](size_t count, size_t grain, const auto& body) { ThreadParallelFor(count, grain, body); }));
}

}  // namespace
}  // namespace ferry::internal
