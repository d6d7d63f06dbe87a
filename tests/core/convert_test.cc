#include "ferry/core/convert.h"

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "ferry/core/dtype.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

// The tests build values with memcpy and read them back as bytes.
static_assert(std::endian::native == std::endian::little);

struct C64 {
  float real;
  float imag;
};
struct C128 {
  double real;
  double imag;
};

uint32_t Bits(float value) { return std::bit_cast<uint32_t>(value); }
float FromBits32(uint32_t bits) { return std::bit_cast<float>(bits); }
uint64_t Bits(double value) { return std::bit_cast<uint64_t>(value); }
double FromBits64(uint64_t bits) { return std::bit_cast<double>(bits); }

// Converts one element with the kernel from GetConvertKernel.
template <typename Target, typename Source>
Target ConvertOne(DType from, DType to, Source value) {
  EXPECT_EQ(DTypeSize(from), static_cast<int64_t>(sizeof(Source)));
  EXPECT_EQ(DTypeSize(to), static_cast<int64_t>(sizeof(Target)));
  Target out{};
  StatusOr<ConvertKernel> kernel = GetConvertKernel(from, to);
  EXPECT_TRUE(kernel.ok()) << kernel.status();
  if (!kernel.ok()) return out;
  (*kernel)(reinterpret_cast<const std::byte*>(&value), sizeof(Source),
            reinterpret_cast<std::byte*>(&out), sizeof(Target), 1);
  return out;
}

// ---------------------------------------------------------------------------------------------
// 16-bit float scalar functions on edge inputs.

TEST(ConvertTest, F32ToBF16MatchesReferenceVectors) {
  const std::pair<uint32_t, uint16_t> kVectors[] = {
      {0x3F808000, 0x3F80},                        // tie, even stays
      {0x3F818000, 0x3F82},                        // tie, odd rounds up
      {0x3F808001, 0x3F81},                        // above the tie
      {0x3F807FFF, 0x3F80},                        // below the tie
      {0x7F7FFFFF, 0x7F80},                        // overflow to Inf
      {0x7F7F7FFF, 0x7F7F},                        // largest value that stays finite
      {0x7F7F8000, 0x7F80},                        // smallest that overflows
      {0x80000000, 0x8000},                        // -0
      {0x00000000, 0x0000}, {0x7F800000, 0x7F80},  // +Inf
      {0xFF800000, 0xFF80},                        // -Inf
      {0xC0490FDB, 0xC049},                        // -pi
  };
  for (const auto& [input, expected] : kVectors) {
    EXPECT_EQ(F32ToBF16Bits(FromBits32(input)), expected) << std::hex << input;
    EXPECT_EQ(ConvertOne<uint16_t>(DType::kF32, DType::kBF16, FromBits32(input)), expected)
        << std::hex << input;
  }
}

TEST(ConvertTest, F32ToBF16KeepsNaNQuietWithSignNeverInf) {
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0x7F800001)), 0x7FC0);  // would become Inf if rounded
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0xFF800001)), 0xFFC0);
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0x7FFFFFFF)), 0x7FFF);
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0xFFA00000)), 0xFFE0);  // signalling, payload kept, quieted
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kF32, DType::kBF16, FromBits32(0xFF800001)), 0xFFC0);
}

TEST(ConvertTest, F32ToBF16RoundsSubnormalsInsteadOfFlushing) {
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0x00010000)), 0x0001);  // 2^-133, smallest bf16
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0x00008000)), 0x0000);  // tie to even: 0
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0x00008001)), 0x0001);
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0x00018000)), 0x0002);  // tie to even: up
  EXPECT_EQ(F32ToBF16Bits(FromBits32(0x807F8000)), 0x8080);  // carries into the smallest normal
}

TEST(ConvertTest, F32ToF16OverflowsAt65520AndKeeps65504) {
  EXPECT_EQ(F32ToF16Bits(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16Bits(FromBits32(0x477FEFFF)), 0x7BFF);  // just below 65520
  EXPECT_EQ(F32ToF16Bits(65520.0f), 0x7C00);
  EXPECT_EQ(F32ToF16Bits(-65520.0f), 0xFC00);
  EXPECT_EQ(F32ToF16Bits(1e10f), 0x7C00);
  EXPECT_EQ(F32ToF16Bits(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(F32ToF16Bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kF32, DType::kF16, 65520.0f), 0x7C00);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kF32, DType::kF16, 65504.0f), 0x7BFF);
}

TEST(ConvertTest, F32ToF16RoundsNormalsToNearestEven) {
  EXPECT_EQ(F32ToF16Bits(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16Bits(1.0f + 0x1p-11f), 0x3C00);      // tie, even stays
  EXPECT_EQ(F32ToF16Bits(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, odd rounds up
  EXPECT_EQ(F32ToF16Bits(1.0f + 0x1p-11f + 0x1p-20f), 0x3C01);
  EXPECT_EQ(F32ToF16Bits(-2.0f + 0x1p-13f), 0xC000);  // rounds across the binade
  EXPECT_EQ(F32ToF16Bits(0.0f), 0x0000);
  EXPECT_EQ(F32ToF16Bits(-0.0f), 0x8000);
}

TEST(ConvertTest, F32ToF16RoundsSubnormalsInsteadOfFlushing) {
  EXPECT_EQ(F32ToF16Bits(0x1p-24f), 0x0001);
  EXPECT_EQ(F32ToF16Bits(0x1p-25f), 0x0000);                // exactly half the smallest: ties to 0
  EXPECT_EQ(F32ToF16Bits(FromBits32(0x33000001)), 0x0001);  // just above 2^-25
  EXPECT_EQ(F32ToF16Bits(-0x1p-25f), 0x8000);
  EXPECT_EQ(F32ToF16Bits(3 * 0x1p-25f), 0x0002);  // tie between 1 and 2: even
  EXPECT_EQ(F32ToF16Bits(5 * 0x1p-25f), 0x0002);  // tie between 2 and 3: even
  EXPECT_EQ(F32ToF16Bits(1023 * 0x1p-24f), 0x03FF);
  EXPECT_EQ(F32ToF16Bits(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up to the smallest normal
  EXPECT_EQ(F32ToF16Bits(0x1p-14f), 0x0400);
  EXPECT_EQ(F32ToF16Bits(0x1p-149f), 0x0000);  // f32 subnormal
}

TEST(ConvertTest, F32ToF16KeepsNaNQuietWithSignNeverInf) {
  EXPECT_EQ(F32ToF16Bits(FromBits32(0x7F800001)), 0x7E00);
  EXPECT_EQ(F32ToF16Bits(FromBits32(0xFF800001)), 0xFE00);
  EXPECT_EQ(F32ToF16Bits(FromBits32(0xFFC00000)), 0xFE00);
  EXPECT_EQ(F32ToF16Bits(FromBits32(0x7FFFFFFF)), 0x7FFF);
  EXPECT_EQ(F32ToF16Bits(FromBits32(0x7FA02000)), 0x7F01);  // signalling: payload kept, quieted
}

TEST(ConvertTest, F16ToF32IsExactIncludingSubnormals) {
  EXPECT_EQ(F16BitsToF32(0x0001), 0x1p-24f);
  EXPECT_EQ(F16BitsToF32(0x8001), -0x1p-24f);
  EXPECT_EQ(F16BitsToF32(0x03FF), 1023 * 0x1p-24f);
  EXPECT_EQ(F16BitsToF32(0x0400), 0x1p-14f);
  EXPECT_EQ(F16BitsToF32(0x7BFF), 65504.0f);
  EXPECT_EQ(F16BitsToF32(0x3C01), 1.0f + 0x1p-10f);
  EXPECT_EQ(Bits(F16BitsToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(Bits(F16BitsToF32(0x7C00)), 0x7F800000u);
  EXPECT_EQ(Bits(F16BitsToF32(0xFC00)), 0xFF800000u);
  EXPECT_EQ(Bits(F16BitsToF32(0x7C01)), 0x7FC02000u);  // signalling NaN made quiet
  EXPECT_EQ(Bits(F16BitsToF32(0xFE00)), 0xFFC00000u);
  EXPECT_EQ(ConvertOne<float>(DType::kF16, DType::kF32, uint16_t{0x0001}), 0x1p-24f);
}

TEST(ConvertTest, BF16ToF32IsExactIncludingSubnormals) {
  EXPECT_EQ(BF16BitsToF32(0x0001), 0x1p-133f);
  EXPECT_EQ(BF16BitsToF32(0x3F81), 1.0f + 0x1p-7f);
  EXPECT_EQ(BF16BitsToF32(0x7F7F), FromBits32(0x7F7F0000));
  EXPECT_EQ(Bits(BF16BitsToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(Bits(BF16BitsToF32(0xFF80)), 0xFF800000u);
  EXPECT_EQ(Bits(BF16BitsToF32(0x7F81)), 0x7FC10000u);  // signalling NaN made quiet
  EXPECT_EQ(Bits(BF16BitsToF32(0xFFC1)), 0xFFC10000u);
  EXPECT_EQ(ConvertOne<float>(DType::kBF16, DType::kF32, uint16_t{0x0001}), 0x1p-133f);
}

// ---------------------------------------------------------------------------------------------
// Rounding exactly once.

TEST(ConvertTest, F64ToBF16RoundsOnceNotThroughF32) {
  // Just above the midpoint between bf16 1.0 and 1 + 2^-7; f32 would round it onto the midpoint,
  // and bf16 would then tie to even (1.0).
  const double above_midpoint = 1.0 + 0x1p-8 + 0x1p-30;
  ASSERT_EQ(F32ToBF16Bits(static_cast<float>(above_midpoint)), 0x3F80);  // the double rounding
  EXPECT_EQ(F64ToBF16Bits(above_midpoint), 0x3F81);
  EXPECT_EQ(F64ToBF16Bits(-above_midpoint), 0xBF81);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kF64, DType::kBF16, above_midpoint), 0x3F81);
  // The reverse: just below a midpoint that f32 rounds up onto it, then bf16 ties upward.
  const double below_midpoint = 1.0 + 3 * 0x1p-8 - 0x1p-30;
  ASSERT_EQ(F32ToBF16Bits(static_cast<float>(below_midpoint)), 0x3F82);
  EXPECT_EQ(F64ToBF16Bits(below_midpoint), 0x3F81);
  // Exact ties still go to even.
  EXPECT_EQ(F64ToBF16Bits(1.0 + 0x1p-8), 0x3F80);
  EXPECT_EQ(F64ToBF16Bits(1.0 + 3 * 0x1p-8), 0x3F82);
}

TEST(ConvertTest, F64ToBF16RoundsOnceAtTheOverflowBoundary) {
  // Below the midpoint between the largest bf16 and 2^128: finite. Via f32 it would become Inf.
  const double below_overflow = 0x1.FFp127 - 0x1p90;
  ASSERT_EQ(F32ToBF16Bits(static_cast<float>(below_overflow)), 0x7F80);
  EXPECT_EQ(F64ToBF16Bits(below_overflow), 0x7F7F);
  EXPECT_EQ(F64ToBF16Bits(0x1.FFp127), 0x7F80);
  EXPECT_EQ(F64ToBF16Bits(1e300), 0x7F80);
  EXPECT_EQ(F64ToBF16Bits(-std::numeric_limits<double>::max()), 0xFF80);
  EXPECT_EQ(F64ToBF16Bits(std::numeric_limits<double>::infinity()), 0x7F80);
}

TEST(ConvertTest, F64ToBF16RoundsTinyValuesWithoutFlushing) {
  EXPECT_EQ(F64ToBF16Bits(0x1p-133), 0x0001);
  EXPECT_EQ(F64ToBF16Bits(0x1p-134), 0x0000);             // tie to even
  EXPECT_EQ(F64ToBF16Bits(0x1p-134 + 0x1p-180), 0x0001);  // f32 alone would make this a tie
  EXPECT_EQ(F64ToBF16Bits(-(0x1p-134 + 0x1p-180)), 0x8001);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kF64, DType::kBF16, 0x1p-134 + 0x1p-180), 0x0001);
  EXPECT_EQ(F64ToBF16Bits(1e-300), 0x0000);
  EXPECT_EQ(F64ToBF16Bits(-1e-300), 0x8000);
  EXPECT_EQ(F64ToBF16Bits(-0.0), 0x8000);
}

TEST(ConvertTest, F64ToF16RoundsOnceNotThroughF32) {
  const double above_midpoint = 1.0 + 0x1p-11 + 0x1p-40;
  ASSERT_EQ(F32ToF16Bits(static_cast<float>(above_midpoint)), 0x3C00);
  EXPECT_EQ(F64ToF16Bits(above_midpoint), 0x3C01);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kF64, DType::kF16, above_midpoint), 0x3C01);
  // In the subnormal range too: just above 2^-25 rounds up to the smallest f16.
  const double above_half_smallest = 0x1p-25 + 0x1p-60;
  ASSERT_EQ(F32ToF16Bits(static_cast<float>(above_half_smallest)), 0x0000);
  EXPECT_EQ(F64ToF16Bits(above_half_smallest), 0x0001);
  // And at the overflow boundary: 65520 - tiny stays finite.
  const double below_overflow = 65520.0 - 0x1p-20;
  ASSERT_EQ(F32ToF16Bits(static_cast<float>(below_overflow)), 0x7C00);
  EXPECT_EQ(F64ToF16Bits(below_overflow), 0x7BFF);
  EXPECT_EQ(F64ToF16Bits(65520.0), 0x7C00);
}

TEST(ConvertTest, F64ToSixteenBitKeepsNaNQuietWithSign) {
  const double negative_signalling = FromBits64(0xFFF0000000000001);
  EXPECT_EQ(F64ToBF16Bits(negative_signalling), 0xFFC0);
  EXPECT_EQ(F64ToF16Bits(negative_signalling), 0xFE00);
  EXPECT_EQ(F64ToBF16Bits(std::numeric_limits<double>::quiet_NaN()), 0x7FC0);
  EXPECT_EQ(F64ToF16Bits(-std::numeric_limits<double>::quiet_NaN()), 0xFE00);
  const uint32_t as_f32 = Bits(ConvertOne<float>(DType::kF64, DType::kF32, negative_signalling));
  EXPECT_EQ(as_f32, 0xFFC00000u);
}

TEST(ConvertTest, Int64ToBF16RoundsOnceNotThroughF32) {
  // 2^30 + 2^22 + 1 is just above the bf16 midpoint 2^30 + 2^22; f32 rounds it onto the midpoint.
  const int64_t value = (int64_t{1} << 30) + (int64_t{1} << 22) + 1;
  ASSERT_EQ(F32ToBF16Bits(static_cast<float>(value)), 0x4E80);  // the double rounding
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS64, DType::kBF16, value), 0x4E81);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS64, DType::kBF16, -value), 0xCE81);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kU64, DType::kBF16, static_cast<uint64_t>(value)), 0x4E81);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS32, DType::kBF16, static_cast<int32_t>(value)), 0x4E81);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kU32, DType::kBF16, static_cast<uint32_t>(value)), 0x4E81);
  // Beyond 2^53, where even f64 is inexact: 2^60 + 2^52 + 1 is just above a bf16 midpoint.
  const int64_t huge = (int64_t{1} << 60) + (int64_t{1} << 52) + 1;
  ASSERT_EQ(F64ToBF16Bits(static_cast<double>(huge)), 0x5D80);  // f64 rounds onto the tie
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS64, DType::kBF16, huge), 0x5D81);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kU64, DType::kBF16, static_cast<uint64_t>(huge)), 0x5D81);
}

TEST(ConvertTest, Int64ExtremesConvertToEveryFloat) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr uint64_t kUMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS64, DType::kBF16, kMin), 0xDF00);   // -2^63
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS64, DType::kBF16, kMax), 0x5F00);   // 2^63
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kU64, DType::kBF16, kUMax), 0x5F80);  // 2^64
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS64, DType::kF16, kMin), 0xFC00);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kU64, DType::kF16, kUMax), 0x7C00);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS64, DType::kF16, int64_t{65519}), 0x7BFF);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS64, DType::kF16, int64_t{65520}), 0x7C00);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kU16, DType::kF16, uint16_t{65535}), 0x7C00);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS16, DType::kF16, int16_t{-32768}), 0xF800);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kS32, DType::kF16, int32_t{2049}), 0x6800);  // tie: even
  EXPECT_EQ(ConvertOne<float>(DType::kS64, DType::kF32, kMin), -0x1p63f);
  EXPECT_EQ(ConvertOne<float>(DType::kU64, DType::kF32, kUMax), 0x1p64f);
  EXPECT_EQ(ConvertOne<double>(DType::kS64, DType::kF64, kMax), 0x1p63);
  EXPECT_EQ(ConvertOne<double>(DType::kU64, DType::kF64, kUMax), 0x1p64);
}

TEST(ConvertTest, Int64ToF32AndF64RoundOnceToNearestEven) {
  // Just above an f32 midpoint (ulp 2^39 at 2^62).
  const int64_t above = (int64_t{1} << 62) + (int64_t{1} << 38) + 1;
  EXPECT_EQ(ConvertOne<float>(DType::kS64, DType::kF32, above), 0x1p62f + 0x1p39f);
  EXPECT_EQ(ConvertOne<float>(DType::kS64, DType::kF32, above - 1), 0x1p62f);  // tie: even
  const uint64_t u_above = (uint64_t{1} << 63) + (uint64_t{1} << 39) + 1;
  EXPECT_EQ(ConvertOne<float>(DType::kU64, DType::kF32, u_above), 0x1p63f + 0x1p40f);
  const int64_t f64_above = (int64_t{1} << 62) + (int64_t{1} << 9) + 1;
  EXPECT_EQ(ConvertOne<double>(DType::kS64, DType::kF64, f64_above), 0x1p62 + 0x1p10);
  EXPECT_EQ(ConvertOne<double>(DType::kS64, DType::kF64, f64_above - 1), 0x1p62);
}

// ---------------------------------------------------------------------------------------------
// Floats to integers, integers to integers.

TEST(ConvertTest, FloatToIntTruncatesTowardZero) {
  EXPECT_EQ(ConvertOne<int32_t>(DType::kF64, DType::kS32, 2.7), 2);
  EXPECT_EQ(ConvertOne<int32_t>(DType::kF64, DType::kS32, -2.7), -2);
  EXPECT_EQ(ConvertOne<int8_t>(DType::kF32, DType::kS8, -0.9f), 0);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF32, DType::kU8, 255.9f), 255);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF32, DType::kU8, -0.9f), 0);
  EXPECT_EQ(ConvertOne<int16_t>(DType::kF16, DType::kS16, uint16_t{0xC0F0}), -2);  // -2.46875
  EXPECT_EQ(ConvertOne<int64_t>(DType::kBF16, DType::kS64, uint16_t{0x4049}), 3);  // 3.140625
  EXPECT_EQ(ConvertOne<int64_t>(DType::kF64, DType::kS64, 0x1p62 + 0x1p10),
            (int64_t{1} << 62) + 1024);
  EXPECT_EQ(ConvertOne<uint64_t>(DType::kF64, DType::kU64, 0x1.FFFFFFFFFFFFFp63),
            0xFFFFFFFFFFFFF800u);
}

TEST(ConvertTest, FloatToIntSaturatesAtTheTargetLimits) {
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(ConvertOne<int64_t>(DType::kF64, DType::kS64, 0x1p63), kMax);
  EXPECT_EQ(ConvertOne<int64_t>(DType::kF64, DType::kS64, -0x1p63), kMin);
  EXPECT_EQ(ConvertOne<int64_t>(DType::kF64, DType::kS64, -0x1p63 - 4096.0), kMin);
  EXPECT_EQ(ConvertOne<int64_t>(DType::kF32, DType::kS64, 0x1p63f), kMax);
  EXPECT_EQ(ConvertOne<int64_t>(DType::kF64, DType::kS64, 1e300), kMax);
  EXPECT_EQ(ConvertOne<uint64_t>(DType::kF64, DType::kU64, 0x1p64),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ConvertOne<uint64_t>(DType::kF64, DType::kU64, -1e300), 0u);
  EXPECT_EQ(ConvertOne<int32_t>(DType::kF32, DType::kS32, 3e9f),
            std::numeric_limits<int32_t>::max());
  EXPECT_EQ(ConvertOne<int32_t>(DType::kF32, DType::kS32, -3e9f),
            std::numeric_limits<int32_t>::min());
  EXPECT_EQ(ConvertOne<int32_t>(DType::kF64, DType::kS32, 2147483647.9), 2147483647);
  EXPECT_EQ(ConvertOne<uint32_t>(DType::kF64, DType::kU32, 4294967296.0), 4294967295u);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF32, DType::kU8, 256.0f), 255);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF32, DType::kU8, -1.5f), 0);
  EXPECT_EQ(ConvertOne<int8_t>(DType::kF32, DType::kS8, -129.0f), -128);
  EXPECT_EQ(ConvertOne<int8_t>(DType::kF32, DType::kS8, 127.99f), 127);
  EXPECT_EQ(ConvertOne<int32_t>(DType::kF16, DType::kS32, uint16_t{0x7C00}),
            std::numeric_limits<int32_t>::max());
  EXPECT_EQ(ConvertOne<int64_t>(DType::kBF16, DType::kS64, uint16_t{0xFF80}), kMin);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kF16, DType::kU16, uint16_t{0x7BFF}), 65504);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF16, DType::kU8, uint16_t{0xFC00}), 0);
}

TEST(ConvertTest, FloatNaNToIntIsZero) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(ConvertOne<int64_t>(DType::kF64, DType::kS64, nan), 0);
  EXPECT_EQ(ConvertOne<int64_t>(DType::kF64, DType::kS64, -nan), 0);
  EXPECT_EQ(ConvertOne<uint32_t>(DType::kF32, DType::kU32, FromBits32(0xFFC00000)), 0u);
  EXPECT_EQ(ConvertOne<int8_t>(DType::kF16, DType::kS8, uint16_t{0x7E00}), 0);
  EXPECT_EQ(ConvertOne<uint64_t>(DType::kBF16, DType::kU64, uint16_t{0xFFC1}), 0u);
}

TEST(ConvertTest, IntegerNarrowingWrapsTwosComplement) {
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kS32, DType::kU8, int32_t{300}), 44);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kS32, DType::kU8, int32_t{-1}), 255);
  EXPECT_EQ(ConvertOne<int8_t>(DType::kU8, DType::kS8, uint8_t{200}), -56);
  EXPECT_EQ(ConvertOne<int8_t>(DType::kS16, DType::kS8, int16_t{-129}), 127);
  EXPECT_EQ(ConvertOne<int32_t>(DType::kS64, DType::kS32, int64_t{0x100000001}), 1);
  EXPECT_EQ(ConvertOne<int32_t>(DType::kS64, DType::kS32, std::numeric_limits<int64_t>::min()), 0);
  EXPECT_EQ(ConvertOne<int32_t>(DType::kU32, DType::kS32, uint32_t{0x80000000}),
            std::numeric_limits<int32_t>::min());
  EXPECT_EQ(ConvertOne<int64_t>(DType::kU64, DType::kS64, std::numeric_limits<uint64_t>::max()),
            -1);
  EXPECT_EQ(ConvertOne<uint16_t>(DType::kU64, DType::kU16, uint64_t{0x123456789}), 0x6789);
}

TEST(ConvertTest, IntegerWideningExtendsBySourceSignedness) {
  EXPECT_EQ(ConvertOne<uint64_t>(DType::kS8, DType::kU64, int8_t{-1}),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(ConvertOne<uint32_t>(DType::kS16, DType::kU32, int16_t{-2}), 0xFFFFFFFEu);
  EXPECT_EQ(ConvertOne<int64_t>(DType::kU8, DType::kS64, uint8_t{255}), 255);
  EXPECT_EQ(ConvertOne<int64_t>(DType::kU32, DType::kS64, uint32_t{0xFFFFFFFF}), 0xFFFFFFFF);
  EXPECT_EQ(ConvertOne<int32_t>(DType::kS8, DType::kS32, int8_t{-128}), -128);
}

// ---------------------------------------------------------------------------------------------
// Bool and complex.

TEST(ConvertTest, AnythingToBoolIsNonZeroWithNaNTrueAndNegativeZeroFalse) {
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF64, DType::kBool, std::nan("")), 1);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF64, DType::kBool, -0.0), 0);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF64, DType::kBool, 0x1p-1074), 1);  // subnormal
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF32, DType::kBool, -0.0f), 0);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF32, DType::kBool, 0x1p-149f), 1);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF16, DType::kBool, uint16_t{0x8000}), 0);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kF16, DType::kBool, uint16_t{0x0001}), 1);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kBF16, DType::kBool, uint16_t{0xFFC0}), 1);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kS64, DType::kBool, int64_t{1} << 40), 1);  // no truncation
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kU16, DType::kBool, uint16_t{256}), 1);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kS8, DType::kBool, int8_t{0}), 0);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kC64, DType::kBool, C64{0.0f, 1.0f}), 1);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kC64, DType::kBool, C64{0.0f, -0.0f}), 0);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kC128, DType::kBool, C128{-2.0, 0.0}), 1);
  EXPECT_EQ(ConvertOne<uint8_t>(DType::kC128, DType::kBool, C128{0.0, std::nan("")}), 1);
}

TEST(ConvertTest, BoolToAnythingIsZeroOrOneAndAnyNonZeroByteIsTrue) {
  for (const uint8_t byte : {uint8_t{0}, uint8_t{1}, uint8_t{2}, uint8_t{0xFF}}) {
    const int one = byte != 0 ? 1 : 0;
    EXPECT_EQ(ConvertOne<int8_t>(DType::kBool, DType::kS8, byte), one);
    EXPECT_EQ(ConvertOne<uint64_t>(DType::kBool, DType::kU64, byte), static_cast<uint64_t>(one));
    EXPECT_EQ(ConvertOne<int64_t>(DType::kBool, DType::kS64, byte), one);
    EXPECT_EQ(ConvertOne<uint16_t>(DType::kBool, DType::kF16, byte), one ? 0x3C00 : 0);
    EXPECT_EQ(ConvertOne<uint16_t>(DType::kBool, DType::kBF16, byte), one ? 0x3F80 : 0);
    EXPECT_EQ(ConvertOne<float>(DType::kBool, DType::kF32, byte), one);
    EXPECT_EQ(ConvertOne<double>(DType::kBool, DType::kF64, byte), one);
    const C64 c64 = ConvertOne<C64>(DType::kBool, DType::kC64, byte);
    EXPECT_EQ(c64.real, one);
    EXPECT_EQ(Bits(c64.imag), 0u);
    const C128 c128 = ConvertOne<C128>(DType::kBool, DType::kC128, byte);
    EXPECT_EQ(c128.real, one);
    EXPECT_EQ(Bits(c128.imag), 0u);
  }
}

TEST(ConvertTest, RealToComplexHasPositiveZeroImaginaryPart) {
  C64 c64 = ConvertOne<C64>(DType::kF32, DType::kC64, -1.5f);
  EXPECT_EQ(c64.real, -1.5f);
  EXPECT_EQ(Bits(c64.imag), 0u);
  c64 = ConvertOne<C64>(DType::kF64, DType::kC64, 1.0 + 0x1p-24 + 0x1p-40);  // rounds once
  EXPECT_EQ(c64.real, 1.0f + 0x1p-23f);
  c64 = ConvertOne<C64>(DType::kS64, DType::kC64, std::numeric_limits<int64_t>::max());
  EXPECT_EQ(c64.real, 0x1p63f);
  c64 = ConvertOne<C64>(DType::kF64, DType::kC64, -std::numeric_limits<double>::quiet_NaN());
  EXPECT_EQ(Bits(c64.real), 0xFFC00000u);
  EXPECT_EQ(Bits(c64.imag), 0u);
  // A conversion, not a copy: a signalling NaN comes out quiet.
  c64 = ConvertOne<C64>(DType::kF32, DType::kC64, FromBits32(0xFF800001));
  EXPECT_EQ(Bits(c64.real), 0xFFC00001u);
  C128 c128 = ConvertOne<C128>(DType::kF64, DType::kC128, FromBits64(0x7FF0000000000001));
  EXPECT_EQ(Bits(c128.real), 0x7FF8000000000001u);
  c128 = ConvertOne<C128>(DType::kBF16, DType::kC128, uint16_t{0x0001});
  EXPECT_EQ(c128.real, 0x1p-133);
  EXPECT_EQ(Bits(c128.imag), 0u);
  c128 = ConvertOne<C128>(DType::kU64, DType::kC128, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(c128.real, 0x1p64);
}

TEST(ConvertTest, ComplexToComplexConvertsEachPart) {
  const C128 wide{1.0 + 0x1p-30, -1e300};
  const C64 narrow = ConvertOne<C64>(DType::kC128, DType::kC64, wide);
  EXPECT_EQ(narrow.real, 1.0f);
  EXPECT_EQ(Bits(narrow.imag), 0xFF800000u);  // -Inf
  const C128 back = ConvertOne<C128>(DType::kC64, DType::kC128, C64{0x1p-149f, -0.0f});
  EXPECT_EQ(back.real, 0x1p-149);
  EXPECT_EQ(Bits(back.imag), 0x8000000000000000u);
}

TEST(ConvertTest, ComplexToRealIsRefusedButComplexToBoolIsNot) {
  for (DType complex : {DType::kC64, DType::kC128}) {
    for (DType to : AllDTypes()) {
      const DTypeKind kind = GetDTypeInfo(to).kind;
      if (kind == DTypeKind::kComplex || kind == DTypeKind::kBool) {
        EXPECT_TRUE(GetConvertKernel(complex, to).ok()) << DTypeName(to);
        continue;
      }
      const absl::StatusCode expected = GetDTypeInfo(to).storage_only
                                            ? absl::StatusCode::kUnimplemented
                                            : absl::StatusCode::kInvalidArgument;
      EXPECT_EQ(GetConvertKernel(complex, to).status().code(), expected) << DTypeName(to);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Storage-only types and the kernel table.

TEST(ConvertTest, Float8ConversionsAreUnimplementedWithAClearMessage) {
  const StatusOr<ConvertKernel> kernel = GetConvertKernel(DType::kF8E4M3FN, DType::kF32);
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(kernel.status().message(),
            "converting float8_e4m3fn to float32 is not supported: float8 types are storage-only");
  EXPECT_EQ(GetConvertKernel(DType::kBF16, DType::kF8E5M2).status().code(),
            absl::StatusCode::kUnimplemented);
  EXPECT_EQ(GetConvertKernel(DType::kF8E5M2, DType::kF8E4M3FN).status().code(),
            absl::StatusCode::kUnimplemented);
}

TEST(ConvertTest, Float8SameDTypeIsAStridedByteCopy) {
  for (DType f8 : {DType::kF8E4M3FN, DType::kF8E5M2}) {
    StatusOr<ConvertKernel> kernel = GetConvertKernel(f8, f8);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    const uint8_t src[6] = {0x7F, 0x80, 0x01, 0xFE, 0x55, 0xAA};
    uint8_t dst[3] = {0, 0, 0};
    // Every other byte, backwards: src[4], src[2], src[0].
    (*kernel)(reinterpret_cast<const std::byte*>(src + 4), -2, reinterpret_cast<std::byte*>(dst), 1,
              3);
    EXPECT_EQ(dst[0], 0x55);
    EXPECT_EQ(dst[1], 0x01);
    EXPECT_EQ(dst[2], 0x7F);
  }
}

TEST(ConvertTest, SameDTypeCopyPreservesEveryBitIncludingSignallingNaN) {
  const uint32_t src[3] = {0x7F800001, 0xFFA00000, 0x00000001};
  uint32_t dst[3] = {};
  StatusOr<ConvertKernel> kernel = GetConvertKernel(DType::kF32, DType::kF32);
  ASSERT_TRUE(kernel.ok());
  (*kernel)(reinterpret_cast<const std::byte*>(src), 4, reinterpret_cast<std::byte*>(dst), 4, 3);
  EXPECT_EQ(std::memcmp(src, dst, sizeof(src)), 0);
}

TEST(ConvertTest, EveryConvertiblePairHasAKernelAndTheOthersTheCheckError) {
  int kernels = 0;
  for (DType from : AllDTypes()) {
    for (DType to : AllDTypes()) {
      const Status check = CheckConvertible(from, to);
      const StatusOr<ConvertKernel> kernel = GetConvertKernel(from, to);
      EXPECT_EQ(kernel.status(), check) << DTypeName(from) << " -> " << DTypeName(to);
      if (kernel.ok()) {
        EXPECT_NE(*kernel, nullptr);
        ++kernels;
      }
    }
  }
  // 15 x 15 numeric pairs, less 2 complex x 12 non-bool reals, plus the two float8 copies.
  EXPECT_EQ(kernels, 15 * 15 - 2 * 12 + 2);
}

TEST(ConvertTest, InvalidDTypeValueIsRejected) {
  const auto garbage = static_cast<DType>(200);
  EXPECT_EQ(GetConvertKernel(garbage, DType::kF32).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GetConvertKernel(garbage, garbage).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// Strides.

TEST(ConvertTest, KernelFollowsNegativeStrides) {
  const float src[4] = {1.5f, -2.0f, 0x1p-149f, 65520.0f};
  uint16_t dst[4] = {};
  StatusOr<ConvertKernel> kernel = GetConvertKernel(DType::kF32, DType::kF16);
  ASSERT_TRUE(kernel.ok());
  (*kernel)(reinterpret_cast<const std::byte*>(src + 3), -4, reinterpret_cast<std::byte*>(dst), 2,
            4);
  EXPECT_EQ(dst[0], 0x7C00);
  EXPECT_EQ(dst[1], 0x0000);
  EXPECT_EQ(dst[2], 0xC000);
  EXPECT_EQ(dst[3], 0x3E00);
  // Negative destination stride: written backwards.
  uint16_t backwards[4] = {};
  (*kernel)(reinterpret_cast<const std::byte*>(src), 4, reinterpret_cast<std::byte*>(backwards + 3),
            -2, 4);
  EXPECT_EQ(backwards[3], 0x3E00);
  EXPECT_EQ(backwards[0], 0x7C00);
}

TEST(ConvertTest, KernelBroadcastsZeroSourceStrideAndZeroDestinationStrideKeepsTheLast) {
  const double value = 3.0;
  int16_t dst[5] = {};
  StatusOr<ConvertKernel> kernel = GetConvertKernel(DType::kF64, DType::kS16);
  ASSERT_TRUE(kernel.ok());
  (*kernel)(reinterpret_cast<const std::byte*>(&value), 0, reinterpret_cast<std::byte*>(dst), 2, 5);
  for (int16_t element : dst) EXPECT_EQ(element, 3);
  const double src[3] = {1.0, 2.0, 7.0};
  int16_t single = 0;
  (*kernel)(reinterpret_cast<const std::byte*>(src), 8, reinterpret_cast<std::byte*>(&single), 0,
            3);
  EXPECT_EQ(single, 7);
}

TEST(ConvertTest, KernelReadsAndWritesUnalignedElements) {
  alignas(8) std::byte src[1 + 3 * 8] = {};
  alignas(8) std::byte dst[3 + 3 * 4] = {};
  const double values[3] = {1.25, -0.0, 1e300};
  for (int i = 0; i < 3; ++i) std::memcpy(src + 1 + 8 * i, &values[i], 8);
  StatusOr<ConvertKernel> kernel = GetConvertKernel(DType::kF64, DType::kF32);
  ASSERT_TRUE(kernel.ok());
  (*kernel)(src + 1, 8, dst + 3, 4, 3);  // dense strides, odd addresses
  float out[3];
  for (int i = 0; i < 3; ++i) std::memcpy(&out[i], dst + 3 + 4 * i, 4);
  EXPECT_EQ(out[0], 1.25f);
  EXPECT_EQ(Bits(out[1]), 0x80000000u);
  EXPECT_EQ(Bits(out[2]), 0x7F800000u);
}

TEST(ConvertTest, ZeroOrNegativeCountTouchesNoMemory) {
  const std::vector<std::byte> src(16, std::byte{0x3C});
  for (DType from : AllDTypes()) {
    for (DType to : AllDTypes()) {
      StatusOr<ConvertKernel> kernel = GetConvertKernel(from, to);
      if (!kernel.ok()) continue;
      std::vector<std::byte> dst(16, std::byte{0xA5});
      (*kernel)(src.data(), DTypeSize(from), dst.data(), DTypeSize(to), 0);
      (*kernel)(src.data(), 0, dst.data(), 0, 0);
      (*kernel)(src.data(), DTypeSize(from), dst.data(), DTypeSize(to), -1);
      EXPECT_EQ(dst, std::vector<std::byte>(16, std::byte{0xA5}))
          << DTypeName(from) << " -> " << DTypeName(to);
      // Null pointers are fine when there is nothing to do (sanitizers would report a memcpy).
      (*kernel)(nullptr, DTypeSize(from), nullptr, DTypeSize(to), 0);
    }
  }
}

}  // namespace
}  // namespace ferry
