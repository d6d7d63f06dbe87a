// The sample checkpoint's plan: the size asked for (within one tensor), whatever the target.
#include "ferry/io/sample_checkpoint.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(SampleCheckpointTest, PlanIsWithinOneTensorOfTheTargetSize) {
  for (const int64_t target :
       {int64_t{120} << 10, int64_t{300} << 10, int64_t{1} << 20, int64_t{3} << 20,
        int64_t{7} << 20, int64_t{64} << 20, int64_t{100'000'000}, int64_t{1} << 30}) {
    for (const std::optional<DType> float_dtype :
         {std::optional<DType>(), std::optional(DType::kF32), std::optional(DType::kF64)}) {
      if (target < (int64_t{200} << 10) && float_dtype == DType::kF64) continue;  // too small
      StatusOr<std::vector<SampleTensor>> planned = PlanSampleCheckpoint(target, 0, float_dtype);
      ASSERT_TRUE(planned.ok()) << planned.status() << " for target " << target;
      const std::vector<SampleTensor>& plan = *planned;
      int64_t total = 0;
      int64_t largest = 0;
      for (const SampleTensor& tensor : plan) {
        total += SampleTensorBytes(tensor);
        largest = std::max(largest, SampleTensorBytes(tensor));
      }
      EXPECT_LE(total, target) << "target " << target;
      EXPECT_GT(total, target - largest) << "target " << target;
      // Still a whole model: embedding first, final norm and head last.
      ASSERT_GE(plan.size(), 4u);
      EXPECT_EQ(plan.front().name, "model.embed_tokens.weight");
      EXPECT_EQ(plan[plan.size() - 2].name, "model.norm.weight");
      EXPECT_EQ(plan.back().name, "lm_head.weight");
    }
  }
}

// Below the smallest model, or with a hidden size too wide for the target: an error that names
// the size needed, never a file larger than asked.
TEST(SampleCheckpointTest, TargetsTooSmallForTheModelAreRefusedNamingTheSizeNeeded) {
  StatusOr<std::vector<SampleTensor>> tiny = PlanSampleCheckpoint(1024);
  EXPECT_TRUE(absl::IsInvalidArgument(tiny.status())) << tiny.status();
  EXPECT_THAT(
      std::string(tiny.status().message()),
      ::testing::HasSubstr("ask for at least 65792 bytes"));  // hidden 64: 32 + 16 + 16 KiB + 256
  StatusOr<std::vector<SampleTensor>> wide = PlanSampleCheckpoint(10 << 10, 100'000);
  EXPECT_TRUE(absl::IsInvalidArgument(wide.status())) << wide.status();
  EXPECT_THAT(std::string(wide.status().message()), ::testing::HasSubstr("smaller hidden size"));
  EXPECT_TRUE(absl::IsInvalidArgument(PlanSampleCheckpoint(1 << 20, -1).status()));
}

TEST(SampleCheckpointTest, FillIsDeterministicInTheSeed) {
  const SampleTensor tensor{"w", DType::kBF16, {16, 8}};
  auto a = FillSampleTensor(tensor, 3);
  auto b = FillSampleTensor(tensor, 3);
  auto c = FillSampleTensor(tensor, 4);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  ASSERT_EQ(a->size_bytes(), SampleTensorBytes(tensor));
  EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size_bytes()), 0);
  EXPECT_NE(std::memcmp(a->data(), c->data(), a->size_bytes()), 0);
}

}  // namespace
}  // namespace ferry
