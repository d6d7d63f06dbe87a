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
