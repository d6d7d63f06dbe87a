#include "ferry/core/host_view.h"

#include <cstdint>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

TEST(HostViewTest, DenseViewHasRowMajorStridesAndIsDense) {
  std::vector<float> data(24);
  HostView view = HostView::Dense(data.data(), DType::kF32, {2, 3, 4});
  EXPECT_EQ(view.byte_strides, Dims({48, 16, 4}));
  EXPECT_TRUE(view.IsRowMajorDense());
  EXPECT_EQ(view.num_elements(), 24);
  EXPECT_EQ(view.dense_size_bytes(), 96);
  EXPECT_TRUE(view.ValidateWithin(data.data(), 96, "x").ok());
}

TEST(HostViewTest, TransposedViewIsNotDenseButValid) {
  std::vector<float> data(12);
  HostView view(data.data(), DType::kF32, {4, 3}, {4, 16});
  EXPECT_FALSE(view.IsRowMajorDense());
  EXPECT_TRUE(view.ValidateWithin(data.data(), 48, "x").ok());
}

TEST(HostViewTest, NegativeStridesAddressBytesBelowTheDataPointer) {
  std::vector<int32_t> data(10);
  // Reversed: element 0 is the last int, stride -4.
  HostView view(data.data() + 9, DType::kS32, {10}, {-4});
  auto addressed = view.ComputeAddressedBytes("rev");
  ASSERT_TRUE(addressed.ok());
  EXPECT_EQ(addressed->begin, -36);
  EXPECT_EQ(addressed->end, 4);
  EXPECT_TRUE(view.ValidateWithin(data.data(), 40, "rev").ok());
  // One element further is outside.
  HostView too_far(data.data() + 9, DType::kS32, {11}, {-4});
  Status status = too_far.ValidateWithin(data.data(), 40, "rev");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("dim 0"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("byte stride -4"));
  EXPECT_THAT(std::string(status.message()), HasSubstr("'rev'"));
}

TEST(HostViewTest, ZeroStrideBroadcastsOneElement) {
  float value = 3.0f;
  HostView view(&value, DType::kF32, {1000, 7}, {0, 0});
  EXPECT_TRUE(view.ValidateWithin(&value, 4, "scalar").ok());
}

TEST(HostViewTest, ElementsAreDistinctFollowsTheNestedStridesRule) {
  auto distinct = [](Dims dims, Dims strides) {
    return MutableHostView(nullptr, DType::kF32, std::move(dims), std::move(strides))
        .ElementsAreDistinct();
  };
  EXPECT_TRUE(distinct({4, 5}, {20, 4}));
  EXPECT_TRUE(distinct({4, 5}, {4, 16}));    // a transpose
  EXPECT_TRUE(distinct({4, 5}, {-20, -4}));  // reversed
  EXPECT_TRUE(distinct({4, 5}, {40, 8}));    // gaps
  EXPECT_TRUE(distinct({1, 5}, {0, 4}));     // a size-1 dim's stride is never used
  EXPECT_TRUE(distinct({0, 5}, {0, 0}));     // no elements
  EXPECT_TRUE(distinct({}, {}));
  EXPECT_FALSE(distinct({4, 5}, {0, 4}));   // broadcast
  EXPECT_FALSE(distinct({4, 5}, {8, 4}));   // rows overlap
  EXPECT_FALSE(distinct({4, 5}, {20, 2}));  // elements overlap by half
  EXPECT_FALSE(distinct({2, 2}, {4, -4}));  // the same element twice
  // Distinct but interleaved (strides of 3 and 2 elements over dims of 2 and 3): the rule is
  // sufficient only, so it answers false.
  EXPECT_FALSE(distinct({2, 3}, {12, 8}));
}

TEST(HostViewTest, ZeroSizeDimAddressesNothing) {
  HostView view(nullptr, DType::kF64, {3, 0, 5}, {1 << 20, 8, 8});
  auto addressed = view.ComputeAddressedBytes("empty");
  ASSERT_TRUE(addressed.ok());
  EXPECT_EQ(addressed->begin, addressed->end);
  EXPECT_TRUE(view.ValidateWithin(nullptr, 0, "empty").ok());
}

TEST(HostViewTest, StrideReachingPastTheRegionNamesDimAndStride) {
  std::vector<float> data(16);
  HostView view(data.data(), DType::kF32, {4, 4}, {20, 4});  // 4*20 > 64
  Status status = view.ValidateWithin(data.data(), 64, "w");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("dim 0 (size 4, byte stride 20)"));
}

TEST(HostViewTest, StridesMustMatchDims) {
  float value = 0;
  HostView view(&value, DType::kF32, {1, 1}, {4});
  EXPECT_EQ(view.ValidateWithin(&value, 4, "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostViewTest, NegativeDimIsRejected) {
  float value = 0;
  HostView view(&value, DType::kF32, {-1}, {4});
  Status status = view.ValidateWithin(&value, 4, "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("negative"));
}

TEST(HostViewTest, ElementCountOverflowIsRejected) {
  float value = 0;
  HostView view(&value, DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, {4, 4});
  Status status = view.ValidateWithin(&value, 4, "huge");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("overflow"));
}

TEST(HostViewTest, ByteExtentOverflowIsRejected) {
  float value = 0;
  HostView view(&value, DType::kF32, {4, 2}, {INT64_MAX / 2, 4});
  EXPECT_EQ(view.ValidateWithin(&value, 4, "x").code(), absl::StatusCode::kInvalidArgument);
}

// The shape of a view that has not been validated yet is read without overflow: a zero-stride view
// of huge dims (which validation refuses) is not dense, its element count saturates, and a zero dim
// makes it empty whatever the others are. UBSan (the asan build) saw the signed overflow here.
TEST(HostViewTest, ShapeQueriesOfAnUnvalidatedHugeViewDoNotOverflow) {
  const float value = 1.0f;
  const int64_t huge = int64_t{1} << 40;
  const HostView broadcast(&value, DType::kF32, {huge, huge}, {0, 0});
  EXPECT_FALSE(broadcast.IsRowMajorDense());
  EXPECT_EQ(broadcast.num_elements(), INT64_MAX);
  EXPECT_EQ(broadcast.dense_size_bytes(), INT64_MAX);
  EXPECT_FALSE(broadcast.ComputeAddressedBytes("t").ok());
  // Dense strides for dims whose byte size alone overflows: still not dense, never UB.
  const HostView dense_strides(&value, DType::kF32, {int64_t{1} << 31, int64_t{1} << 31},
                               {int64_t{4} << 31, 4});
  EXPECT_FALSE(dense_strides.IsRowMajorDense());
  EXPECT_EQ(dense_strides.num_elements(), int64_t{1} << 62);
  EXPECT_EQ(dense_strides.dense_size_bytes(), INT64_MAX);
  const HostView empty(&value, DType::kF32, {huge, huge, 0}, {0, 0, 0});
  EXPECT_EQ(empty.num_elements(), 0);
  EXPECT_EQ(empty.dense_size_bytes(), 0);
  EXPECT_EQ(SaturatedNumElements({huge, -1}), 0);
  EXPECT_EQ(SaturatedProduct(INT64_MAX / 2, 3), INT64_MAX);
}

TEST(HostViewTest, DataPointerOutsideRegionIsRejected) {
  std::vector<float> data(4);
  HostView view(data.data() + 8, DType::kF32, {1}, {4});
  EXPECT_EQ(view.ValidateWithin(data.data(), 16, "x").code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostViewTest, MutableViewConvertsToReadOnly) {
  std::vector<float> data(6);
  MutableHostView mutable_view = MutableHostView::Dense(data.data(), DType::kF32, {2, 3});
  HostView view = mutable_view;
  EXPECT_EQ(view.data, data.data());
  EXPECT_EQ(view.dims, mutable_view.dims);
  EXPECT_EQ(view.byte_strides, mutable_view.byte_strides);
}

}  // namespace
}  // namespace ferry
