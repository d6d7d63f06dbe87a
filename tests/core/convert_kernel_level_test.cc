// Every conversion kernel level against the scalar reference (the exported 16-bit functions and
// the C++ casts, as in convert.cc) on edge values and random bit patterns, for the float pairs the
// vectorised levels serve: every length from 0 to 100 (whole blocks and every tail), unaligned
// pointers, and strided rows. Every other pair must give the portable level's bytes at every
// level. A level this CPU lacks is skipped with the reason. Set FERRY_TEST_SEED to replay a run.

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "ferry/core/convert.h"
#include "ferry/core/dtype.h"
#include "fmt/format.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

static_assert(std::endian::native == std::endian::little);

constexpr DType kFloatDTypes[] = {DType::kF16, DType::kBF16, DType::kF32, DType::kF64};

uint64_t SeedFromEnvironmentOrRandom() {
  if (const char* text = std::getenv("FERRY_TEST_SEED")) return std::strtoull(text, nullptr, 0);
  return std::random_device{}();
}

template <typename T>
T Load(const std::byte* bytes) {
  T value;
  std::memcpy(&value, bytes, sizeof(T));
  return value;
}

template <typename T>
void Store(std::byte* bytes, T value) {
  std::memcpy(bytes, &value, sizeof(T));
}

// One element, as the scalar reference converts it.
void ReferenceConvert(DType from, DType to, const std::byte* src, std::byte* dst) {
  if (from == DType::kF64) {
    const auto value = Load<double>(src);
    if (to == DType::kF32) return Store(dst, static_cast<float>(value));
    return Store(dst, to == DType::kF16 ? F64ToF16Bits(value) : F64ToBF16Bits(value));
  }
  float value;  // every other source widens to f32 exactly
  if (from == DType::kF16) {
    value = F16BitsToF32(Load<uint16_t>(src));
  } else if (from == DType::kBF16) {
    value = BF16BitsToF32(Load<uint16_t>(src));
  } else {
    value = Load<float>(src);
  }
  switch (to) {
    case DType::kF16:
      return Store(dst, F32ToF16Bits(value));
    case DType::kBF16:
      return Store(dst, F32ToBF16Bits(value));
    case DType::kF32:
      return Store(dst, value);
    default:
      return Store(dst, static_cast<double>(value));
  }
}

// Edge values of each source format: zeros, subnormals, the normal range's ends, the targets'
// rounding ties and overflow boundaries, infinities, and NaNs (quiet and signalling, with payloads,
// of both signs).
std::vector<uint64_t> EdgeBits(DType from) {
  std::vector<uint64_t> positive;
  switch (from) {
    case DType::kF16:
      positive = {0x0000, 0x0001, 0x0002, 0x01FF, 0x03FF, 0x0400, 0x0401, 0x3C00,
                  0x3C01, 0x3BFF, 0x7BFF, 0x7C00, 0x7C01, 0x7D00, 0x7E00, 0x7FFF};
      break;
    case DType::kBF16:
      positive = {0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x3F81, 0x477F,
                  0x4780, 0x7F7F, 0x7F80, 0x7F81, 0x7FA0, 0x7FC0, 0x7FFF};
      break;
    case DType::kF32:
      positive = {
          0x00000000, 0x00000001, 0x00008000, 0x00008001, 0x007FFFFF, 0x00800000,  // subnormals
          0x33000000, 0x33000001, 0x33800000, 0x387FE000, 0x387FF000, 0x38800000,  // f16 subnormal
          0x3F800000, 0x3F801000, 0x3F803000, 0x3F801001, 0x3F808000, 0x3F818000,  // ties
          0x3F808001, 0x3F807FFF, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000,  // f16 overflow
          0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0x7F800000,                          // bf16 overflow
          0x7F800001, 0x7F802000, 0x7FA00000, 0x7FBFFFFF, 0x7FC00000, 0x7FC00001, 0x7FFFFFFF};
      break;
    default:
      positive = {
          0x0000000000000000, 0x0000000000000001, 0x000FFFFFFFFFFFFF,  // f64 subnormals
          0x36A0000000000000, 0x36A0000000000001, 0x3690000000000000,  // f32 subnormal range
          0x3E70000000000000, 0x3E70000000000001, 0x3E6FFFFFFFFFFFFF,  // 2^-24, 2^-25 +- ulp
          0x3FF0000000000000, 0x3FF0100000000000, 0x3FF0100000000001,  // 1, bf16 tie and above
          0x3FF0100004000000, 0x3FF0020000000000, 0x3FF0060000000000,  // 1 + 2^-8 + 2^-30; f16 ties
          0x3FF0000010000000, 0x3FF0000030000000, 0x3FF000000FFFFFFF,  // f32 ties, below a tie
          0x40EFFE0000000000, 0x40EFFDFFFFFFFFFF, 0x40EFFC0000000000,  // 65520, 65504
          0x47EFFFFFE0000000, 0x47EFFFFFDFFFFFFF, 0x47EFFFFFF0000000,  // f32 max and overflow
          0x47EFEFFFFFFFFFFF, 0x47EFF00000000000, 0x7FEFFFFFFFFFFFFF,  // bf16 overflow, f64 max
          0x7FF0000000000000, 0x7FF0000000000001, 0x7FF0000020000000,  // Inf, NaN payloads
          0x7FF4000000000000, 0x7FF8000000000000, 0x7FF8000000000001, 0x7FFFFFFFFFFFFFFF};
      break;
  }
  const int size_bits = static_cast<int>(DTypeSize(from)) * 8;
  const uint64_t sign = uint64_t{1} << (size_bits - 1);
  std::vector<uint64_t> bits = positive;
  for (uint64_t value : positive) bits.push_back(value | sign);
  return bits;
}

// A random element of a float format: mostly uniform bit patterns; for f64, also values within
// f32's range with random low bits (uniform f64 patterns are nearly all far outside it), and
// values exactly halfway between two floats.
void RandomElement(std::mt19937_64& rng, DType from, std::byte* out) {
  const uint64_t random = rng();
  if (from != DType::kF64) {
    std::memcpy(out, &random, static_cast<size_t>(DTypeSize(from)));
    return;
  }
  uint64_t bits = random;
  switch (rng() % 4) {
    case 0:
      break;  // any pattern
    case 1:
    case 2: {
      // An f32 value (any exponent from 2^-150 to 2^128) with 29 random bits below it.
      const double wide = std::bit_cast<float>(static_cast<uint32_t>(random >> 32));
      bits = (std::bit_cast<uint64_t>(wide) & ~uint64_t{0x1FFFFFFF}) | (random & 0x1FFFFFFF);
      break;
    }
    default: {
      // A tie for f32 (halfway between two floats) or one of the 16-bit formats.
      const double wide = std::bit_cast<float>(static_cast<uint32_t>(random >> 32));
      const int drop = 29 + static_cast<int>(rng() % 17);  // f32 ... bf16 (52 - 7 = 45)
      bits = (std::bit_cast<uint64_t>(wide) & ~((uint64_t{1} << drop) - 1)) |
             (uint64_t{1} << (drop - 1));
      break;
    }
  }
  Store(out, bits);
}

std::string Hex(const std::byte* bytes, int64_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, bytes, static_cast<size_t>(size));
  return fmt::format("0x{:0{}x}", bits, size * 2);
}

std::string LevelName(const testing::TestParamInfo<ConvertKernelLevel>& info) {
  return std::string(ConvertKernelLevelName(info.param));
}

class ConvertKernelLevelTest : public testing::TestWithParam<ConvertKernelLevel> {
 protected:
  void SetUp() override {
    const StatusOr<ConvertKernel> probe = GetConvertKernel(DType::kF32, DType::kF16, GetParam());
    if (GetParam() > BestConvertKernelLevel()) {
      ASSERT_EQ(probe.status().code(), absl::StatusCode::kFailedPrecondition) << probe.status();
      GTEST_SKIP() << probe.status().message();
    }
    ASSERT_TRUE(probe.ok()) << probe.status();
    seed_ = SeedFromEnvironmentOrRandom();
    std::cout << "seed: " << seed_ << " (set FERRY_TEST_SEED to replay)\n";
    rng_.seed(seed_);
  }

  ConvertKernel Kernel(DType from, DType to) { return Kernel(from, to, GetParam()); }

  // Runs `check(from, to, kernel, &failures)` for every vectorised pair (two different float
  // dtypes) at this level, and expects it to count no failure.
  template <typename Check>
  void ForEachVectorPair(Check check) {
    for (DType from : kFloatDTypes) {
      for (DType to : kFloatDTypes) {
        if (from == to) continue;
        const ConvertKernel kernel = Kernel(from, to);
        ASSERT_NE(kernel, nullptr) << DTypeName(from) << " -> " << DTypeName(to);
        int failures = 0;
        check(from, to, kernel, &failures);
        EXPECT_EQ(failures, 0) << DTypeName(from) << " -> " << DTypeName(to);
      }
    }
  }

  static ConvertKernel Kernel(DType from, DType to, ConvertKernelLevel level) {
    StatusOr<ConvertKernel> kernel = GetConvertKernel(from, to, level);
    EXPECT_TRUE(kernel.ok()) << kernel.status();
    return kernel.ok() ? *kernel : nullptr;
  }

  // `count` source elements: the edge values first (all of them when count allows), then random.
  std::vector<std::byte> Inputs(DType from, int64_t count) {
    const int64_t size = DTypeSize(from);
    const std::vector<uint64_t> edges = EdgeBits(from);
    std::vector<std::byte> bytes(static_cast<size_t>(count * size));
    // Start at a random edge so that short rows see different ones.
    const size_t first_edge = rng_() % edges.size();
    for (int64_t i = 0; i < count; ++i) {
      std::byte* element = bytes.data() + i * size;
      if (i < static_cast<int64_t>(edges.size()) && rng_() % 4 != 0) {
        std::memcpy(element, &edges[(first_edge + i) % edges.size()], static_cast<size_t>(size));
      } else {
        RandomElement(rng_, from, element);
      }
    }
    return bytes;
  }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
};

// Runs the kernel on `count` elements at the given strides (in elements of each side, possibly
// negative or zero) and byte offsets, and compares every byte of a guarded destination with the
// reference: wrong elements and writes outside them both fail.
void CheckRow(ConvertKernel kernel, DType from, DType to, const std::vector<std::byte>& elements,
              int64_t count, int64_t src_step, int64_t dst_step, int64_t src_offset,
              int64_t dst_offset, int* failures) {
  const int64_t src_size = DTypeSize(from);
  const int64_t dst_size = DTypeSize(to);
  const int64_t src_stride = src_step * src_size;
  const int64_t dst_stride = dst_step * dst_size;
  constexpr int64_t kGuard = 64;
  // Element i sits at base + i * stride; negative strides start at the far end.
  auto span = [](int64_t n, int64_t stride, int64_t size) {
    return (n > 0 ? (n - 1) * (stride < 0 ? -stride : stride) : 0) + size;
  };
  std::vector<std::byte> src(static_cast<size_t>(span(count, src_stride, src_size) + src_offset));
  std::vector<std::byte> dst(
      static_cast<size_t>(span(count, dst_stride, dst_size) + dst_offset + 2 * kGuard),
      std::byte{0xA5});
  std::byte* src_base =
      src.data() + src_offset + (src_stride < 0 && count > 0 ? (count - 1) * -src_stride : 0);
  std::byte* dst_base = dst.data() + kGuard + dst_offset +
                        (dst_stride < 0 && count > 0 ? (count - 1) * -dst_stride : 0);
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(src_base + i * src_stride, elements.data() + i * src_size,
                static_cast<size_t>(src_size));
  }
  std::vector<std::byte> expected = dst;
  std::byte* expected_base = expected.data() + (dst_base - dst.data());
  for (int64_t i = 0; i < count; ++i) {
    ReferenceConvert(from, to, src_base + i * src_stride, expected_base + i * dst_stride);
  }
  kernel(src_base, src_stride, dst_base, dst_stride, count);
  if (dst == expected) return;
  std::string detail = "bytes outside the elements changed";
  for (int64_t i = 0; i < count; ++i) {
    if (std::memcmp(dst_base + i * dst_stride, expected_base + i * dst_stride,
                    static_cast<size_t>(dst_size)) != 0) {
      const int64_t source = dst_stride == 0 ? count - 1 : i;
      detail = fmt::format("element {}: source {}, got {}, want {}", source,
                           Hex(src_base + source * src_stride, src_size),
                           Hex(dst_base + i * dst_stride, dst_size),
                           Hex(expected_base + i * dst_stride, dst_size));
      break;
    }
  }
  if (++*failures <= 5) {
    ADD_FAILURE() << DTypeName(from) << " -> " << DTypeName(to) << ", count " << count << ", steps "
                  << src_step << "/" << dst_step << ", offsets " << src_offset << "/" << dst_offset
                  << ": " << detail;
  }
}

TEST_P(ConvertKernelLevelTest, DenseRowsOfEveryLengthMatchTheScalarReference) {
  ForEachVectorPair([&](DType from, DType to, ConvertKernel kernel, int* failures) {
    if (GetParam() != ConvertKernelLevel::kPortable) {
      // The level has its own kernel for these pairs: this test is not the portable one again.
      EXPECT_NE(kernel, Kernel(from, to, ConvertKernelLevel::kPortable))
          << DTypeName(from) << " -> " << DTypeName(to);
    }
    for (int64_t count = 0; count <= 100; ++count) {
      const std::vector<std::byte> elements = Inputs(from, count);
      // Unaligned: the source and destination start at every byte offset below 4.
      const auto offset = static_cast<int64_t>(count % 4);
      CheckRow(kernel, from, to, elements, count, 1, 1, offset, (count / 4) % 4, failures);
    }
  });
}

TEST_P(ConvertKernelLevelTest, LongDenseRowsOfRandomBitsMatchTheScalarReference) {
  ForEachVectorPair([&](DType from, DType to, ConvertKernel kernel, int* failures) {
    for (int trial = 0; trial < 4; ++trial) {
      const auto count = static_cast<int64_t>(4000 + rng_() % 1000);
      const std::vector<std::byte> elements = Inputs(from, count);
      CheckRow(kernel, from, to, elements, count, 1, 1, trial, 3 - trial, failures);
    }
  });
}

// Rows of a megabyte or more of destination are written with non-temporal stores from the first
// 64-byte boundary on: every head and tail length around that boundary must still be exact.
TEST_P(ConvertKernelLevelTest, StreamedRowsMatchTheScalarReference) {
  ForEachVectorPair([&](DType from, DType to, ConvertKernel kernel, int* failures) {
    const int64_t streamed = (int64_t{1} << 20) / DTypeSize(to);  // the shortest streamed row
    for (int trial = 0; trial < 3; ++trial) {
      const int64_t count = streamed + static_cast<int64_t>(rng_() % 100);
      const std::vector<std::byte> elements = Inputs(from, count);
      // Destination offsets of whole elements (a misaligned element never streams) that are
      // not multiples of 64 bytes: a head to convert cached before the first streamed line.
      CheckRow(kernel, from, to, elements, count, 1, 1, trial * 3, (trial * 2 + 1) * DTypeSize(to),
               failures);
    }
  });
}

TEST_P(ConvertKernelLevelTest, StridedRowsMatchTheScalarReference) {
  // (source step, destination step) in elements: gaps, reversal, broadcast, last-wins.
  const std::pair<int64_t, int64_t> kSteps[] = {{2, 1},  {1, 3}, {-1, 1}, {1, -1},
                                                {-3, 2}, {0, 1}, {1, 0},  {5, -7}};
  ForEachVectorPair([&](DType from, DType to, ConvertKernel kernel, int* failures) {
    for (const auto& [src_step, dst_step] : kSteps) {
      for (int64_t count : {0, 1, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100, 300}) {
        const std::vector<std::byte> elements = Inputs(from, count);
        CheckRow(kernel, from, to, elements, count, src_step, dst_step, count % 3, count % 5,
                 failures);
      }
    }
  });
}

TEST_P(ConvertKernelLevelTest, EveryOtherPairGivesThePortableLevelsBytes) {
  int pairs = 0;
  for (DType from : AllDTypes()) {
    for (DType to : AllDTypes()) {
      StatusOr<ConvertKernel> kernel = GetConvertKernel(from, to, GetParam());
      StatusOr<ConvertKernel> portable = GetConvertKernel(from, to, ConvertKernelLevel::kPortable);
      ASSERT_EQ(kernel.status(), portable.status()) << DTypeName(from) << " -> " << DTypeName(to);
      if (!kernel.ok()) continue;
      ++pairs;
      const int64_t src_size = DTypeSize(from);
      const int64_t dst_size = DTypeSize(to);
      constexpr int64_t kCount = 77;
      std::vector<std::byte> src(static_cast<size_t>(kCount * src_size));
      for (std::byte& byte : src) byte = static_cast<std::byte>(rng_());
      std::vector<std::byte> got(static_cast<size_t>(kCount * dst_size), std::byte{0xA5});
      std::vector<std::byte> want = got;
      (*kernel)(src.data(), src_size, got.data(), dst_size, kCount);
      (*portable)(src.data(), src_size, want.data(), dst_size, kCount);
      EXPECT_EQ(got, want) << DTypeName(from) << " -> " << DTypeName(to);
    }
  }
  EXPECT_EQ(pairs, 15 * 15 - 2 * 12 + 2);
}

INSTANTIATE_TEST_SUITE_P(Levels, ConvertKernelLevelTest,
                         testing::Values(ConvertKernelLevel::kPortable, ConvertKernelLevel::kAvx2,
                                         ConvertKernelLevel::kAvx512),
                         LevelName);

TEST(ConvertKernelLevelNamesTest, NamesRoundTripAndUnknownNamesAreRefused) {
  for (ConvertKernelLevel level :
       {ConvertKernelLevel::kPortable, ConvertKernelLevel::kAvx2, ConvertKernelLevel::kAvx512}) {
    StatusOr<ConvertKernelLevel> parsed = ConvertKernelLevelFromName(ConvertKernelLevelName(level));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, level);
  }
  const StatusOr<ConvertKernelLevel> unknown = ConvertKernelLevelFromName("AVX2");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'AVX2'"), std::string_view::npos);
}

TEST(ConvertKernelLevelNamesTest, ActiveLevelIsAtMostTheBestAndAnInvalidLevelIsRefused) {
  const StatusOr<ConvertKernelLevel> active = ActiveConvertKernelLevel();
  ASSERT_TRUE(active.ok()) << active.status();
  EXPECT_LE(*active, BestConvertKernelLevel());
  std::cout << "best level: " << ConvertKernelLevelName(BestConvertKernelLevel())
            << ", active: " << ConvertKernelLevelName(*active) << "\n";
  const auto garbage = static_cast<ConvertKernelLevel>(7);
  EXPECT_EQ(GetConvertKernel(DType::kF32, DType::kF16, garbage).status().code(),
            absl::StatusCode::kInvalidArgument);
  // The dtype check comes first, whatever the level.
  EXPECT_EQ(
      GetConvertKernel(DType::kC64, DType::kF32, ConvertKernelLevel::kPortable).status().code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
