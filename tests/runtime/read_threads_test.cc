#include "src/runtime/read_threads.h"

#include <gtest/gtest.h>

#include <cstdlib>

#include "ferry/runtime/file_load.h"

namespace ferry {
namespace {

TEST(ReadThreadsTest, OnePerCoreWhenNothingElseIsRunnable) {
  EXPECT_EQ(LoadReadThreadsFor(2, 0), 2);
  EXPECT_EQ(LoadReadThreadsFor(16, 0), 16);
  EXPECT_EQ(LoadReadThreadsFor(0, 0), 1);  // an unknown core count still reads
}

TEST(ReadThreadsTest, MoreForEachRunnableThreadOfOtherWorkAtMostFourPerCore) {
  EXPECT_EQ(LoadReadThreadsFor(2, 1), 5);
  EXPECT_EQ(LoadReadThreadsFor(2, 2), 8);  // a 2-core machine running `ninja -j2`
  EXPECT_EQ(LoadReadThreadsFor(2, 40), 8);
  EXPECT_EQ(LoadReadThreadsFor(16, 4), 28);
  EXPECT_EQ(LoadReadThreadsFor(16, 100), 64);
}

TEST(ReadThreadsTest, RunnableThreadsAreReadFromLoadavgsFourthField) {
  EXPECT_EQ(RunnableThreadsIn("2.98 3.00 2.62 3/108 13543\n"), 3);
  EXPECT_EQ(RunnableThreadsIn("0.00 0.01 0.05 1/1 1"), 1);
  EXPECT_EQ(RunnableThreadsIn("12.5  9.1 7.0 17/2048 99"), 17);
  EXPECT_EQ(RunnableThreadsIn(""), std::nullopt);
  EXPECT_EQ(RunnableThreadsIn("2.98 3.00 2.62"), std::nullopt);
  EXPECT_EQ(RunnableThreadsIn("2.98 3.00 2.62 x/108 1"), std::nullopt);
  EXPECT_EQ(RunnableThreadsIn("2.98 3.00 2.62 3"), std::nullopt);
  EXPECT_EQ(RunnableThreadsIn("2.98 3.00 2.62 -3/108 1"), std::nullopt);
}

TEST(ReadThreadsTest, TheDefaultIsWithinThePolicysBoundsAndTheSettingOverridesIt) {
  const int threads = DefaultLoadReadThreads();
  EXPECT_GE(threads, 1);
  EXPECT_LE(threads, 4 * 1024);
  ASSERT_EQ(setenv("FERRY_LOAD_READ_THREADS", "3", 1), 0);
  StatusOr<FileLoadOptions> options = FileLoadOptionsFromSettings();
  unsetenv("FERRY_LOAD_READ_THREADS");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->read_threads, 3);
}

}  // namespace
}  // namespace ferry
