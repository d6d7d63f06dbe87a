// Every f32 bit pattern through f32 -> bf16 and f32 -> f16, and every 16-bit pattern back to f32,
// both through the scalar functions and through the kernels of every kernel level this CPU has
// (GetConvertKernel(from, to, level); the others are skipped with the reason), against a
// reference written here: it decodes the candidate 16-bit values with ldexp and picks the nearer
// one by comparing distances in double (exact for these operands), ties to the even one.
//
// About 2 x 2^32 conversions per format and level; the work is split over the available cores.

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iostream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/core/convert.h"
#include "ferry/core/dtype.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

constexpr uint32_t kBlockSize = 1 << 16;  // f32 patterns per block: one value of the top 16 bits

// The value of a finite, non-negative bf16 or f16 pattern (exponent_bits + mantissa_bits = 15).
double DecodeMagnitude(uint32_t bits, int exponent_bits, int mantissa_bits) {
  const int bias = (1 << (exponent_bits - 1)) - 1;
  const uint32_t exponent = bits >> mantissa_bits;
  const uint32_t mantissa = bits & ((1u << mantissa_bits) - 1);
  if (exponent == 0) return std::ldexp(static_cast<double>(mantissa), 1 - bias - mantissa_bits);
  return std::ldexp(static_cast<double>(mantissa + (1u << mantissa_bits)),
                    static_cast<int>(exponent) - bias - mantissa_bits);
}

// The positive finite values of a 16-bit format in increasing order, indexed by bit pattern, with
// one more entry at the Inf pattern: the value the next binade would start at, so that anything
// at or beyond the midpoint between the largest finite value and it rounds to Inf.
std::vector<double> PositiveValues(int exponent_bits, int mantissa_bits) {
  const uint32_t inf_bits = ((1u << exponent_bits) - 1) << mantissa_bits;
  std::vector<double> values(inf_bits + 1);
  for (uint32_t bits = 0; bits < inf_bits; ++bits) {
    values[bits] = DecodeMagnitude(bits, exponent_bits, mantissa_bits);
  }
  const int bias = (1 << (exponent_bits - 1)) - 1;
  values[inf_bits] = std::ldexp(1.0, bias + 1);
  return values;
}

// Round to nearest, ties to even, of a non-negative finite `x` among `values` (sorted), given
// `below` with values[below] <= x < values[below + 1] (or below == last entry: Inf).
uint16_t NearestEven(double x, const std::vector<double>& values, uint32_t below) {
  const auto inf = static_cast<uint32_t>(values.size() - 1);
  if (below == inf) return static_cast<uint16_t>(inf);
  const double down = x - values[below];
  const double up = values[below + 1] - x;
  if (down < up) return static_cast<uint16_t>(below);
  if (up < down) return static_cast<uint16_t>(below + 1);
  return static_cast<uint16_t>((below & 1) == 0 ? below : below + 1);
}

// The reference's quiet NaN: sign, all-ones exponent, quiet bit, the f32 payload's leading bits.
uint16_t ReferenceNaN(uint32_t f32_bits, int mantissa_bits) {
  const uint32_t sign = (f32_bits >> 31) << 15;
  const uint32_t payload = (f32_bits & 0x007FFFFFu) >> (23 - mantissa_bits);
  const uint32_t exponent = ((1u << (15 - mantissa_bits)) - 1) << mantissa_bits;
  return static_cast<uint16_t>(sign | exponent | payload | (1u << (mantissa_bits - 1)));
}

struct Mismatches {
  std::mutex mutex;
  int64_t count = 0;
  std::vector<std::string> examples;
  void Add(int64_t n, std::vector<std::string> found) {
    std::lock_guard<std::mutex> lock(mutex);
    count += n;
    for (std::string& example : found) {
      if (examples.size() < 10) examples.push_back(std::move(example));
    }
  }
};

// Runs `work(first_block, last_block)` over [0, num_blocks) on every core, in chunks.
template <typename Work>
void RunInParallel(uint32_t num_blocks, const Work& work) {
  const unsigned num_threads = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  constexpr uint32_t kChunk = 64;
  std::atomic<uint32_t> next{0};
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < num_threads; ++t) {
    threads.emplace_back([&] {
      for (uint32_t first = next.fetch_add(kChunk); first < num_blocks;
           first = next.fetch_add(kChunk)) {
        work(first, std::min(first + kChunk, num_blocks));
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
}

// Checks every f32 pattern through the scalar function and the kernel for one 16-bit format.
void CheckEveryF32Pattern(DType target, int mantissa_bits, uint16_t (*scalar)(float),
                          ConvertKernelLevel level) {
  const auto start = std::chrono::steady_clock::now();
  const std::vector<double> values = PositiveValues(15 - mantissa_bits, mantissa_bits);
  StatusOr<ConvertKernel> kernel = GetConvertKernel(DType::kF32, target, level);
  ASSERT_TRUE(kernel.ok()) << kernel.status();
  Mismatches mismatches;
  std::atomic<int64_t> checked{0};

  // A block is one value of the top 15 bits of the magnitude, with both signs: the positive
  // patterns in [0, kBlockSize), the negative ones in [kBlockSize, 2 * kBlockSize).
  RunInParallel(kBlockSize / 2, [&](uint32_t first_block, uint32_t last_block) {
    std::vector<float> input(2 * kBlockSize);
    std::vector<uint16_t> expected(2 * kBlockSize);
    std::vector<uint16_t> from_kernel(2 * kBlockSize);
    int64_t found = 0;
    std::vector<std::string> examples;
    // The 16-bit value at or below the block's first (smallest) magnitude.
    const double block_start = std::bit_cast<float>(first_block << 16);
    auto below = static_cast<uint32_t>(std::upper_bound(values.begin(), values.end(), block_start) -
                                       values.begin() - 1);
    for (uint32_t block = first_block; block < last_block; ++block) {
      for (uint32_t low = 0; low < kBlockSize; ++low) {
        const uint32_t magnitude = (block << 16) | low;
        input[low] = std::bit_cast<float>(magnitude);
        input[kBlockSize + low] = std::bit_cast<float>(magnitude | 0x80000000u);
      }
      (*kernel)(reinterpret_cast<const std::byte*>(input.data()), 4,
                reinterpret_cast<std::byte*>(from_kernel.data()), 2, 2 * kBlockSize);

      for (uint32_t low = 0; low < kBlockSize; ++low) {
        const uint32_t magnitude = (block << 16) | low;
        if (magnitude > 0x7F800000u) {
          expected[low] = ReferenceNaN(magnitude, mantissa_bits);
        } else {
          // Patterns increase with the magnitude, so `below` only ever moves up.
          const double x = input[low];  // exact; +Inf compares above every entry
          while (below + 1 < values.size() && x >= values[below + 1]) ++below;
          expected[low] = NearestEven(x, values, below);
        }
        expected[kBlockSize + low] = static_cast<uint16_t>(expected[low] | 0x8000u);
      }

      uint32_t differences = 0;
      for (uint32_t i = 0; i < 2 * kBlockSize; ++i) {
        differences |= static_cast<uint32_t>(scalar(input[i]) ^ expected[i]) |
                       static_cast<uint32_t>(from_kernel[i] ^ expected[i]);
      }
      if (differences != 0) {
        for (uint32_t i = 0; i < 2 * kBlockSize; ++i) {
          const uint16_t from_scalar = scalar(input[i]);
          if (from_scalar == expected[i] && from_kernel[i] == expected[i]) continue;
          if (++found <= 10) {
            examples.push_back(absl::StrCat("f32 0x", absl::Hex(std::bit_cast<uint32_t>(input[i])),
                                            ": expected 0x", absl::Hex(expected[i]), ", scalar 0x",
                                            absl::Hex(from_scalar), ", kernel 0x",
                                            absl::Hex(from_kernel[i])));
          }
        }
      }
      checked += 2 * kBlockSize;
    }
    mismatches.Add(found, std::move(examples));
  });

  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "float32 -> " << DTypeName(target) << " (" << ConvertKernelLevelName(level)
            << " kernel): " << checked.load() << " patterns in " << seconds << " s\n";
  EXPECT_EQ(checked.load(), int64_t{1} << 32);
  EXPECT_EQ(mismatches.count, 0);
  for (const std::string& example : mismatches.examples) ADD_FAILURE() << example;
}

// Parameterised by the kernel level; a level this CPU lacks is skipped, saying why.
class ConvertExhaustiveLevelTest : public testing::TestWithParam<ConvertKernelLevel> {
 protected:
  void SetUp() override {
    if (GetParam() > BestConvertKernelLevel()) {
      GTEST_SKIP() << GetConvertKernel(DType::kF32, DType::kF16, GetParam()).status().message();
    }
  }
};

TEST_P(ConvertExhaustiveLevelTest, F32ToBF16MatchesNearestEvenForEveryPattern) {
  CheckEveryF32Pattern(DType::kBF16, 7, &F32ToBF16Bits, GetParam());
}

TEST_P(ConvertExhaustiveLevelTest, F32ToF16MatchesNearestEvenForEveryPattern) {
  CheckEveryF32Pattern(DType::kF16, 10, &F32ToF16Bits, GetParam());
}

// Every 16-bit pattern to f32 (and f64 through the kernel): exact, NaNs quiet with their payload.
void CheckEverySixteenBitPattern(DType source, int mantissa_bits, float (*scalar)(uint16_t),
                                 ConvertKernelLevel level) {
  const int exponent_bits = 15 - mantissa_bits;
  std::vector<uint16_t> input(1 << 16);
  for (uint32_t bits = 0; bits < input.size(); ++bits) input[bits] = static_cast<uint16_t>(bits);
  std::vector<float> to_f32(input.size());
  std::vector<double> to_f64(input.size());
  StatusOr<ConvertKernel> f32_kernel = GetConvertKernel(source, DType::kF32, level);
  StatusOr<ConvertKernel> f64_kernel = GetConvertKernel(source, DType::kF64, level);
  ASSERT_TRUE(f32_kernel.ok() && f64_kernel.ok());
  (*f32_kernel)(reinterpret_cast<const std::byte*>(input.data()), 2,
                reinterpret_cast<std::byte*>(to_f32.data()), 4, 1 << 16);
  (*f64_kernel)(reinterpret_cast<const std::byte*>(input.data()), 2,
                reinterpret_cast<std::byte*>(to_f64.data()), 8, 1 << 16);
  int failures = 0;
  for (uint32_t bits = 0; bits < input.size() && failures < 10; ++bits) {
    const uint32_t magnitude = bits & 0x7FFFu;
    const uint32_t inf_bits = ((1u << exponent_bits) - 1) << mantissa_bits;
    const bool negative = (bits & 0x8000u) != 0;
    uint32_t expected_f32;
    uint64_t expected_f64;
    if (magnitude > inf_bits) {
      const uint64_t payload = magnitude & ((1u << mantissa_bits) - 1);
      expected_f32 = (negative ? 0xFF800000u : 0x7F800000u) | 0x00400000u |
                     static_cast<uint32_t>(payload << (23 - mantissa_bits));
      expected_f64 = (negative ? 0xFFF0000000000000u : 0x7FF0000000000000u) | 0x0008000000000000u |
                     (payload << (52 - mantissa_bits));
    } else {
      double value = magnitude == inf_bits
                         ? std::numeric_limits<double>::infinity()
                         : DecodeMagnitude(magnitude, exponent_bits, mantissa_bits);
      if (negative) value = -value;
      expected_f64 = std::bit_cast<uint64_t>(value);
      expected_f32 = std::bit_cast<uint32_t>(static_cast<float>(value));  // exact: fits in f32
    }
    const uint32_t from_scalar = std::bit_cast<uint32_t>(scalar(static_cast<uint16_t>(bits)));
    const uint32_t from_kernel = std::bit_cast<uint32_t>(to_f32[bits]);
    const uint64_t from_f64_kernel = std::bit_cast<uint64_t>(to_f64[bits]);
    if (from_scalar != expected_f32 || from_kernel != expected_f32 ||
        from_f64_kernel != expected_f64) {
      ++failures;
      ADD_FAILURE() << DTypeName(source) << " 0x" << std::hex << bits << ": expected f32 0x"
                    << expected_f32 << ", scalar 0x" << from_scalar << ", kernel 0x" << from_kernel
                    << "; expected f64 0x" << expected_f64 << ", kernel 0x" << from_f64_kernel;
    }
  }
  EXPECT_EQ(failures, 0);
}

TEST_P(ConvertExhaustiveLevelTest, F16ToF32IsExactForEveryPattern) {
  CheckEverySixteenBitPattern(DType::kF16, 10, &F16BitsToF32, GetParam());
}

TEST_P(ConvertExhaustiveLevelTest, BF16ToF32IsExactForEveryPattern) {
  CheckEverySixteenBitPattern(DType::kBF16, 7, &BF16BitsToF32, GetParam());
}

INSTANTIATE_TEST_SUITE_P(Levels, ConvertExhaustiveLevelTest,
                         testing::Values(ConvertKernelLevel::kPortable, ConvertKernelLevel::kAvx2,
                                         ConvertKernelLevel::kAvx512),
                         [](const testing::TestParamInfo<ConvertKernelLevel>& info) {
                           return std::string(ConvertKernelLevelName(info.param));
                         });

// Widening then narrowing gives back every non-NaN pattern (NaNs come back quiet).
TEST(ConvertExhaustiveTest, SixteenBitToF32AndBackIsTheIdentity) {
  int failures = 0;
  for (uint32_t bits = 0; bits < (1u << 16) && failures < 10; ++bits) {
    const auto h = static_cast<uint16_t>(bits);
    const bool f16_nan = (bits & 0x7FFFu) > 0x7C00u;
    const bool bf16_nan = (bits & 0x7FFFu) > 0x7F80u;
    const uint16_t f16_back = F32ToF16Bits(F16BitsToF32(h));
    const uint16_t bf16_back = F32ToBF16Bits(BF16BitsToF32(h));
    if (f16_back != (f16_nan ? (h | 0x0200u) : h)) {
      ++failures;
      ADD_FAILURE() << "f16 0x" << std::hex << bits << " came back as 0x" << f16_back;
    }
    if (bf16_back != (bf16_nan ? (h | 0x0040u) : h)) {
      ++failures;
      ADD_FAILURE() << "bf16 0x" << std::hex << bits << " came back as 0x" << bf16_back;
    }
  }
  EXPECT_EQ(failures, 0);
}

}  // namespace
}  // namespace ferry
