#include "ferry/core/future.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ferry {
namespace {

TEST(FutureTest, on_ready_runs_inline_when_already_ready) {
  Future<int> future = Future<int>::Ready(42);
  ASSERT_TRUE(future.IsReady());
  int calls = 0;
  std::thread::id callback_thread;
  future.OnReady([&](const StatusOr<int>& value) {
    ++calls;
    callback_thread = std::this_thread::get_id();
    EXPECT_EQ(*value, 42);
  });
  // Inline: it has already run when OnReady returns, on this thread.
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(callback_thread, std::this_thread::get_id());
}

// Ready OK void futures share one state; each still behaves as its own ready future, from many
// threads at once, and an error is never shared.
TEST(FutureTest, ready_ok_void_futures_are_ready_everywhere_and_errors_stay_apart) {
  std::atomic<int> callbacks{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        Future<> ok = Future<>::Ready(OkStatus());
        EXPECT_TRUE(ok.IsReady());
        EXPECT_TRUE(ok.Await().ok());
        ok.OnReady([&](const Status& status) {
          if (status.ok()) callbacks.fetch_add(1);
        });
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(callbacks.load(), 4000);
  Future<> failed = Future<>::Ready(InternalError("broken"));
  EXPECT_EQ(failed.Await().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(Future<>::Ready(OkStatus()).Await().ok());  // the error did not leak into it
}

// Await and OnReady read a set future without its lock: a value set while others wait or
// register is still seen whole by each of them.
TEST(FutureTest, readers_racing_the_setter_see_the_whole_value) {
  for (int round = 0; round < 200; ++round) {
    Promise<std::string> promise;
    Future<std::string> future = promise.future();
    std::atomic<int> good{0};
    std::vector<std::thread> readers;
    for (int r = 0; r < 3; ++r) {
      readers.emplace_back([&, r] {
        if (r == 0) {
          if (*future.Await() == "a value long enough to live on the heap") good.fetch_add(1);
        } else {
          future.OnReady([&](const StatusOr<std::string>& value) {
            if (*value == "a value long enough to live on the heap") good.fetch_add(1);
          });
        }
      });
    }
    promise.Set(std::string("a value long enough to live on the heap"));
    for (std::thread& reader : readers) reader.join();
    EXPECT_EQ(good.load(), 3);
  }
}

TEST(FutureTest, on_ready_runs_once_on_the_setting_thread) {
  Promise<int> promise;
  Future<int> future = promise.future();
  EXPECT_FALSE(future.IsReady());
  std::atomic<int> calls{0};
  std::thread::id callback_thread;
  std::thread::id setter_thread;
  future.OnReady([&](const StatusOr<int>& value) {
    calls.fetch_add(1);
    callback_thread = std::this_thread::get_id();
    EXPECT_EQ(*value, 7);
  });
  EXPECT_EQ(calls.load(), 0);
  std::thread setter([&] {
    setter_thread = std::this_thread::get_id();
    promise.Set(7);
    EXPECT_FALSE(promise.SetIfUnset(8));  // ignored: must not run the callback again
  });
  setter.join();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(callback_thread, setter_thread);
  EXPECT_NE(callback_thread, std::this_thread::get_id());
}

TEST(FutureTest, set_if_unset_keeps_the_first_value) {
  Promise<> promise;
  EXPECT_TRUE(promise.SetIfUnset(InvalidArgumentError("first")));
  EXPECT_FALSE(promise.SetIfUnset(OkStatus()));
  EXPECT_FALSE(promise.SetIfUnset(InternalError("third")));
  const Status& status = promise.future().Await();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "first");

  Promise<std::string> value_promise;
  value_promise.Set(std::string("kept"));
  EXPECT_FALSE(value_promise.SetIfUnset(std::string("dropped")));
  EXPECT_EQ(*value_promise.future().Await(), "kept");
}

// A second Set is a bug of the producer: with assertions on (the sanitizer builds) it stops the
// process, naming it; without, the first value stands.
TEST(FutureTest, second_set_is_a_debug_check) {
  Promise<> promise;
  promise.Set(InvalidArgumentError("first"));
#ifndef NDEBUG
  EXPECT_DEATH(promise.Set(OkStatus()), "already set");
#else
  promise.Set(OkStatus());
#endif
  EXPECT_EQ(promise.future().Await().message(), "first");
}

TEST(FutureTest, every_callback_runs_exactly_once_with_many_registrations) {
  Promise<> promise;
  Future<> future = promise.future();
  constexpr int kCallbacks = 50;
  std::vector<int> calls(kCallbacks, 0);
  for (int i = 0; i < kCallbacks; ++i) {
    future.OnReady([&calls, i](const Status&) { ++calls[i]; });
  }
  promise.Set(OkStatus());
  future.OnReady([&calls](const Status&) { ++calls[0]; });  // late: inline
  EXPECT_EQ(calls[0], 2);
  for (int i = 1; i < kCallbacks; ++i) EXPECT_EQ(calls[i], 1) << "callback " << i;
}

TEST(FutureTest, await_from_several_threads_sees_the_value) {
  Promise<int> promise;
  Future<int> future = promise.future();
  constexpr int kWaiters = 8;
  std::atomic<int> started{0};
  std::vector<int> seen(kWaiters, 0);
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] {
      started.fetch_add(1);
      const StatusOr<int>& value = future.Await();
      seen[i] = value.ok() ? *value : -1;
    });
  }
  while (started.load() < kWaiters) std::this_thread::yield();
  promise.Set(1234);
  for (std::thread& waiter : waiters) waiter.join();
  for (int i = 0; i < kWaiters; ++i) EXPECT_EQ(seen[i], 1234) << "waiter " << i;
}

TEST(FutureTest, await_returns_the_error) {
  Promise<int> promise;
  std::thread setter([&] { promise.Set(absl::NotFoundError("no such tensor")); });
  const StatusOr<int>& value = promise.future().Await();
  setter.join();
  ASSERT_FALSE(value.ok());
  EXPECT_EQ(value.status().code(), absl::StatusCode::kNotFound);
}

TEST(FutureTest, join_of_nothing_is_ready_and_ok) {
  Future<> joined = JoinFutures({});
  ASSERT_TRUE(joined.valid());
  EXPECT_TRUE(joined.IsReady());
  EXPECT_TRUE(joined.Await().ok());
}

TEST(FutureTest, join_waits_for_all) {
  std::vector<Promise<>> promises(3);
  std::vector<Future<>> futures;
  for (const Promise<>& promise : promises) futures.push_back(promise.future());
  Future<> joined = JoinFutures(futures);
  promises[2].Set(OkStatus());
  promises[0].Set(OkStatus());
  EXPECT_FALSE(joined.IsReady());
  promises[1].Set(OkStatus());
  EXPECT_TRUE(joined.IsReady());
  EXPECT_TRUE(joined.Await().ok());
}

TEST(FutureTest, join_reports_the_first_error_in_argument_order) {
  std::vector<Promise<>> promises(4);
  std::vector<Future<>> futures;
  for (const Promise<>& promise : promises) futures.push_back(promise.future());
  Future<> joined = JoinFutures(futures);
  // The later argument fails first in time; the earlier argument's error must still win.
  promises[3].Set(InternalError("error of future 3"));
  promises[0].Set(OkStatus());
  promises[1].Set(absl::DataLossError("error of future 1"));
  EXPECT_FALSE(joined.IsReady());
  promises[2].Set(OkStatus());
  const Status& status = joined.Await();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(status.message(), "error of future 1");
}

TEST(FutureTest, join_of_already_ready_futures_is_ready_at_once) {
  std::vector<Future<>> futures = {Future<>::Ready(OkStatus()),
                                   Future<>::Ready(absl::AbortedError("aborted")),
                                   Future<>::Ready(CancelledError("cancelled"))};
  Future<> joined = JoinFutures(futures);
  EXPECT_TRUE(joined.IsReady());
  EXPECT_EQ(joined.Await().code(), absl::StatusCode::kAborted);
}

TEST(FutureTest, join_completes_when_set_from_many_threads) {
  constexpr int kFutures = 64;
  std::vector<Promise<>> promises(kFutures);
  std::vector<Future<>> futures;
  for (const Promise<>& promise : promises) futures.push_back(promise.future());
  Future<> joined = JoinFutures(futures);
  std::vector<std::thread> setters;
  for (int t = 0; t < 4; ++t) {
    setters.emplace_back([&, t] {
      for (int i = t; i < kFutures; i += 4) {
        promises[i].Set(i == 40 ? OutOfRangeError("forty") : OkStatus());
      }
    });
  }
  const Status& status = joined.Await();
  for (std::thread& setter : setters) setter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(status.message(), "forty");
}

TEST(FutureTest, join_reports_an_invalid_future_instead_of_hanging) {
  std::vector<Future<>> futures = {Future<>::Ready(OkStatus()), Future<>()};
  Future<> joined = JoinFutures(futures);
  ASSERT_TRUE(joined.IsReady());
  EXPECT_EQ(joined.Await().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FutureTest, a_promise_dropped_unset_completes_its_future_as_aborted) {
  Future<int> future;
  std::optional<Promise<int>> copy;
  {
    Promise<int> promise;
    future = promise.future();
    copy.emplace(promise);  // a copy of the same promise
  }
  EXPECT_FALSE(future.IsReady()) << "a copy still holds the promise";
  std::optional<Status> seen;
  future.OnReady([&](const StatusOr<int>& value) { seen = value.status(); });
  copy.reset();  // the last copy goes, unset
  ASSERT_TRUE(future.IsReady());
  EXPECT_EQ(future.Await().status().code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->code(), absl::StatusCode::kAborted);

  // A promise that was set keeps its value when it goes.
  Future<> done;
  {
    Promise<> promise;
    done = promise.future();
    promise.Set(OkStatus());
  }
  EXPECT_TRUE(done.Await().ok());
}

TEST(FutureTest, await_for_returns_null_on_timeout_then_the_value) {
  Promise<int> promise;
  Future<int> future = promise.future();
  EXPECT_EQ(future.AwaitFor(std::chrono::milliseconds(20)), nullptr) << "nothing set it";
  std::thread setter([promise] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    promise.Set(7);
  });
  const StatusOr<int>* value = future.AwaitFor(std::chrono::seconds(30));
  setter.join();
  ASSERT_NE(value, nullptr);
  ASSERT_TRUE(value->ok());
  EXPECT_EQ(**value, 7);
  EXPECT_EQ(future.AwaitFor(std::chrono::nanoseconds(0)), value) << "ready: at once";
}

// An executor whose tasks wait in a queue until the test runs them.
class QueueExecutor final : public Executor {
 public:
  void Execute(absl::AnyInvocable<void() &&> task) override {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  int RunAll() {
    std::vector<absl::AnyInvocable<void() &&>> tasks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      tasks.swap(tasks_);
    }
    for (auto& task : tasks) std::move(task)();
    return static_cast<int>(tasks.size());
  }

 private:
  std::mutex mutex_;
  std::vector<absl::AnyInvocable<void() &&>> tasks_;
};

TEST(FutureTest, on_ready_with_an_executor_runs_the_callback_there_once) {
  QueueExecutor executor;
  Promise<int> promise;
  int calls = 0;
  int seen = 0;
  promise.future().OnReady(executor, [&](const StatusOr<int>& value) {
    ++calls;
    seen = *value;
  });
  promise.Set(41);
  EXPECT_EQ(calls, 0) << "not on the thread that set the promise";
  EXPECT_EQ(executor.RunAll(), 1);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(seen, 41);

  // Ready already: handed to the executor as well, never run inline.
  promise.future().OnReady(executor, [&](const StatusOr<int>&) { ++calls; });
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(executor.RunAll(), 1);
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(executor.RunAll(), 0) << "exactly once";
}

}  // namespace
}  // namespace ferry
