// Every pair of dtypes, on random values and random strides (negative, zero, unaligned), against
// a naive reference written here from the rules in docs/conversions.md: values are decoded into
// long double (exact for every source), rounded to the target format with an explicit
// round-to-nearest-even, and encoded again. Set FERRY_TEST_SEED to replay a run.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ferry/core/convert.h"
#include "ferry/core/dtype.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

static_assert(std::endian::native == std::endian::little);
static_assert(std::numeric_limits<long double>::digits >= 64,
              "the reference needs a long double that holds every int64 and uint64 exactly");

// An IEEE binary format: exponent and explicit mantissa widths.
struct Format {
  int exponent_bits;
  int mantissa_bits;
  int Bias() const { return (1 << (exponent_bits - 1)) - 1; }
  int TotalBits() const { return 1 + exponent_bits + mantissa_bits; }
};
constexpr Format kF16Format{5, 10};
constexpr Format kBF16Format{8, 7};
constexpr Format kF32Format{8, 23};
constexpr Format kF64Format{11, 52};

// A real number as the reference sees it. NaNs keep their sign and payload (left-aligned to bit
// 63, so that the payload's leading bits line up whatever the format).
struct Real {
  long double value = 0;
  bool is_nan = false;
  uint64_t nan_payload = 0;
};

struct Value {
  bool is_integer = false;
  __int128 integer = 0;  // when is_integer (bool and integer dtypes)
  Real real;
  Real imag;  // 0 for real dtypes
};

Real DecodeFloat(uint64_t bits, Format format) {
  const int m = format.mantissa_bits;
  const bool negative = (bits >> (format.TotalBits() - 1)) & 1;
  const uint64_t exponent = (bits >> m) & ((uint64_t{1} << format.exponent_bits) - 1);
  const uint64_t mantissa = bits & ((uint64_t{1} << m) - 1);
  Real real;
  if (exponent == (uint64_t{1} << format.exponent_bits) - 1) {
    if (mantissa == 0) {
      real.value = std::numeric_limits<long double>::infinity();
    } else {
      real.is_nan = true;
      real.nan_payload = mantissa << (64 - m);
      real.value = std::numeric_limits<long double>::quiet_NaN();
    }
  } else if (exponent == 0) {
    real.value = std::ldexp(static_cast<long double>(mantissa), 1 - format.Bias() - m);
  } else {
    real.value = std::ldexp(static_cast<long double>(mantissa + (uint64_t{1} << m)),
                            static_cast<int>(exponent) - format.Bias() - m);
  }
  if (negative) real.value = -real.value;
  return real;
}

// Rounds to nearest, ties to even, into `format`; overflow gives Inf. NaN: quiet, sign kept,
// payload truncated to the leading bits.
uint64_t EncodeFloat(const Real& real, Format format) {
  const int m = format.mantissa_bits;
  const uint64_t sign = std::signbit(real.value) ? uint64_t{1} << (format.TotalBits() - 1) : 0;
  const uint64_t exponent_mask = ((uint64_t{1} << format.exponent_bits) - 1) << m;
  if (real.is_nan) {
    return sign | exponent_mask | (real.nan_payload >> (64 - m)) | (uint64_t{1} << (m - 1));
  }
  const long double magnitude = std::fabs(real.value);
  if (std::isinf(magnitude)) return sign | exponent_mask;
  if (magnitude == 0) return sign;
  int frexp_exponent = 0;
  std::frexp(magnitude, &frexp_exponent);  // magnitude in [2^(e-1), 2^e)
  const int min_exponent = 1 - format.Bias();
  int exponent = std::max(frexp_exponent - 1, min_exponent);
  // magnitude / ulp, where ulp = 2^(exponent - m): exact in long double.
  const long double scaled = std::ldexp(magnitude, m - exponent);
  long double integral = std::floor(scaled);
  const long double fraction = scaled - integral;
  if (fraction > 0.5L || (fraction == 0.5L && std::fmod(integral, 2.0L) == 1.0L)) integral += 1;
  uint64_t significand = static_cast<uint64_t>(integral);
  if (significand == uint64_t{1} << (m + 1)) {  // rounded up into the next binade
    significand >>= 1;
    exponent += 1;
  }
  if (significand < (uint64_t{1} << m)) return sign | significand;  // subnormal or zero
  if (exponent > format.Bias()) return sign | exponent_mask;        // overflow
  const auto biased = static_cast<uint64_t>(exponent + format.Bias());
  return sign | (biased << m) | (significand - (uint64_t{1} << m));
}

bool IsFloat(DType d) { return GetDTypeInfo(d).kind == DTypeKind::kFloat; }
bool IsComplex(DType d) { return GetDTypeInfo(d).kind == DTypeKind::kComplex; }
bool IsInteger(DType d) {
  const DTypeKind kind = GetDTypeInfo(d).kind;
  return kind == DTypeKind::kSignedInt || kind == DTypeKind::kUnsignedInt;
}

Format FormatOf(DType d) {
  switch (d) {
    case DType::kF16:
      return kF16Format;
    case DType::kBF16:
      return kBF16Format;
    case DType::kF32:
    case DType::kC64:
      return kF32Format;
    default:
      return kF64Format;
  }
}

uint64_t LoadBits(const std::byte* p, int64_t size) {
  uint64_t bits = 0;
  std::memcpy(&bits, p, static_cast<size_t>(size));  // little-endian
  return bits;
}
void StoreBits(uint64_t bits, std::byte* p, int64_t size) {
  std::memcpy(p, &bits, static_cast<size_t>(size));
}

Value Decode(DType dtype, const std::byte* p) {
  Value value;
  const int64_t size = DTypeSize(dtype);
  if (dtype == DType::kBool) {
    value.is_integer = true;
    value.integer = LoadBits(p, 1) != 0 ? 1 : 0;
  } else if (IsInteger(dtype)) {
    value.is_integer = true;
    const uint64_t bits = LoadBits(p, size);
    const int width = static_cast<int>(size * 8);
    if (GetDTypeInfo(dtype).kind == DTypeKind::kSignedInt && ((bits >> (width - 1)) & 1)) {
      value.integer = static_cast<__int128>(bits) - (static_cast<__int128>(1) << width);
    } else {
      value.integer = bits;
    }
  } else if (IsFloat(dtype)) {
    value.real = DecodeFloat(LoadBits(p, size), FormatOf(dtype));
  } else {
    value.real = DecodeFloat(LoadBits(p, size / 2), FormatOf(dtype));
    value.imag = DecodeFloat(LoadBits(p + size / 2, size / 2), FormatOf(dtype));
  }
  if (value.is_integer) value.real.value = static_cast<long double>(value.integer);  // exact
  return value;
}

// Writes what docs/conversions.md says `value` becomes in `dtype`.
void EncodeExpected(const Value& value, DType dtype, std::byte* p) {
  const int64_t size = DTypeSize(dtype);
  if (dtype == DType::kBool) {
    const bool non_zero = value.is_integer ? value.integer != 0
                                           : (value.real.is_nan || value.real.value != 0 ||
                                              value.imag.is_nan || value.imag.value != 0);
    StoreBits(non_zero ? 1 : 0, p, 1);
  } else if (IsInteger(dtype)) {
    __int128 integer = 0;
    if (value.is_integer) {
      integer = value.integer;  // wraps: only the low bytes are stored
    } else if (!value.real.is_nan) {
      const bool is_signed = GetDTypeInfo(dtype).kind == DTypeKind::kSignedInt;
      const int width = static_cast<int>(size * 8);
      const __int128 max = is_signed ? (static_cast<__int128>(1) << (width - 1)) - 1
                                     : (static_cast<__int128>(1) << width) - 1;
      const __int128 min = is_signed ? -(static_cast<__int128>(1) << (width - 1)) : 0;
      const long double truncated = std::trunc(value.real.value);
      if (truncated >= static_cast<long double>(max)) {
        integer = max;
      } else if (truncated <= static_cast<long double>(min)) {
        integer = min;
      } else {
        integer = static_cast<__int128>(truncated);
      }
    }
    StoreBits(static_cast<uint64_t>(integer), p, size);
  } else if (IsFloat(dtype)) {
    StoreBits(EncodeFloat(value.real, FormatOf(dtype)), p, size);
  } else {
    StoreBits(EncodeFloat(value.real, FormatOf(dtype)), p, size / 2);
    StoreBits(EncodeFloat(value.imag, FormatOf(dtype)), p + size / 2, size / 2);
  }
}

// ---------------------------------------------------------------------------------------------
// Random inputs: raw bit patterns, special values, moderate numbers and near-ties.

long double RandomInterestingReal(std::mt19937_64& rng) {
  static const long double kSpecials[] = {0.0L,
                                          -0.0L,
                                          1.0L,
                                          -1.0L,
                                          0.5L,
                                          1.5L,
                                          2.5L,
                                          -2.5L,
                                          127.5L,
                                          -128.5L,
                                          255.0L,
                                          255.5L,
                                          256.0L,
                                          -129.0L,
                                          32767.5L,
                                          65504.0L,
                                          65519.0L,
                                          65520.0L,
                                          65535.0L,
                                          65536.0L,
                                          0x1p31L,
                                          -0x1p31L,
                                          0x1p31L - 0.5L,
                                          0x1p32L,
                                          0x1p63L,
                                          -0x1p63L,
                                          0x1p64L,
                                          -0x1p64L,
                                          1e30L,
                                          -1e30L,
                                          0x1p-14L,
                                          0x1p-24L,
                                          0x1p-25L,
                                          0x1p-133L,
                                          0x1p-134L,
                                          0x1p-149L,
                                          1e-300L,
                                          1e300L,
                                          0x1.FFp127L,
                                          std::numeric_limits<long double>::infinity(),
                                          -std::numeric_limits<long double>::infinity()};
  const int choice = static_cast<int>(rng() % 3);
  if (choice == 0) return kSpecials[rng() % std::size(kSpecials)];
  if (choice == 1) {
    // A random integer of random width, scaled by a small power of two.
    const int width = static_cast<int>(rng() % 65);
    const uint64_t magnitude = width == 0 ? 0 : rng() >> (64 - width);
    const long double signed_value =
        (rng() & 1) ? -static_cast<long double>(magnitude) : static_cast<long double>(magnitude);
    return std::ldexp(signed_value, static_cast<int>(rng() % 25) - 12);
  }
  // Near a midpoint of bf16 or f16: a random f32 with a tie pattern in its low bits, nudged by a
  // relative 2^-30..2^-50 (lost again when the source itself is too narrow).
  uint32_t bits = static_cast<uint32_t>(rng());
  if (rng() & 1) {
    bits = (bits & 0xFFFF0000u) | 0x8000u;
  } else {
    // f16's range: exponents 2^-24 .. 2^15.
    const uint32_t exponent = 103 + static_cast<uint32_t>(rng() % 40);
    bits = (bits & 0x807FE000u) | (exponent << 23) | 0x1000u;
  }
  const Real tie = DecodeFloat(bits, kF32Format);
  if (tie.is_nan || std::isinf(tie.value)) return tie.value;
  const int nudge = static_cast<int>(rng() % 3) - 1;
  return tie.value * (1.0L + nudge * std::ldexp(1.0L, -30 - static_cast<int>(rng() % 21)));
}

void GenerateFloatBits(std::mt19937_64& rng, DType part_dtype, std::byte* p) {
  const Format format = FormatOf(part_dtype);
  const int64_t size = format.TotalBits() / 8;
  uint64_t bits = 0;
  if (rng() % 3 == 0) {
    bits = rng();  // any pattern: NaNs with payloads, Infs, subnormals, huge and tiny values
  } else {
    Real real;
    real.value = RandomInterestingReal(rng);
    bits = EncodeFloat(real, format);
  }
  StoreBits(bits, p, size);
}

void GenerateElement(std::mt19937_64& rng, DType dtype, std::byte* p) {
  const int64_t size = DTypeSize(dtype);
  if (dtype == DType::kBool) {
    StoreBits(rng() % 8 == 0 ? rng() & 0xFF : rng() & 1, p, 1);  // mostly 0/1, some other bytes
  } else if (IsInteger(dtype)) {
    const int type_bits = static_cast<int>(8 * size);
    uint64_t bits;
    if (size >= 2 && rng() % 4 == 0) {
      // At or next to a bf16 (8 significant bits) or f16 (11) rounding tie: a leading 1 and
      // random kept bits, the tie bit, then maybe one sticky bit further down.
      const int keep = (rng() & 1) ? 8 : 11;
      const int width = keep + 2 + static_cast<int>(rng() % (type_bits - keep - 1));
      bits = (uint64_t{1} << (width - 1)) |
             ((rng() & ((uint64_t{1} << (keep - 1)) - 1)) << (width - keep)) |
             (uint64_t{1} << (width - keep - 1));
      if (rng() & 1) bits |= uint64_t{1} << (rng() % (width - keep - 1));
    } else {
      const int width = 1 + static_cast<int>(rng() % 64);
      bits = rng() >> (64 - width);
    }
    if (rng() & 1) bits = 0 - bits;
    StoreBits(bits, p, size);
  } else if (IsFloat(dtype) && !GetDTypeInfo(dtype).storage_only) {
    GenerateFloatBits(rng, dtype, p);
  } else if (IsComplex(dtype)) {
    const DType part = dtype == DType::kC64 ? DType::kF32 : DType::kF64;
    GenerateFloatBits(rng, part, p);
    GenerateFloatBits(rng, part, p + size / 2);
  } else {
    StoreBits(rng(), p, size);  // float8: raw bytes
  }
}

// A random stride for elements of `size` bytes: mostly dense, else negative, zero, spread or
// unaligned. Destination strides never make two writes overlap (0 is fine: the last one wins).
int64_t RandomStride(std::mt19937_64& rng, int64_t size) {
  switch (rng() % 8) {
    case 0:
      return -size;
    case 1:
      return 0;
    case 2:
      return 2 * size;
    case 3:
      return -3 * size;
    case 4:
      return size + 1 + static_cast<int64_t>(rng() % 5);  // unaligned elements
    default:
      return size;
  }
}

// A buffer holding `count` elements at `stride` from a base somewhere inside it.
struct StridedBuffer {
  std::vector<std::byte> bytes;
  int64_t base = 0;
  std::byte* At(int64_t i, int64_t stride) { return bytes.data() + base + i * stride; }
};
StridedBuffer MakeBuffer(std::mt19937_64& rng, int64_t count, int64_t stride, int64_t size) {
  const int64_t span = count == 0 ? 0 : (count - 1) * stride;
  const int64_t low = std::min<int64_t>(0, span);
  const int64_t high = std::max<int64_t>(0, span) + size;
  const int64_t slack = static_cast<int64_t>(rng() % 8);  // misaligns the base
  StridedBuffer buffer;
  buffer.bytes.resize(static_cast<size_t>(high - low + 2 * slack));
  buffer.base = slack - low;
  return buffer;
}

uint64_t SeedFromEnvironmentOrRandom() {
  if (const char* text = std::getenv("FERRY_TEST_SEED")) return std::strtoull(text, nullptr, 0);
  return std::random_device{}();
}

TEST(ConvertRandomTest, StridedConversionOfEveryPairMatchesNaiveReference) {
  const uint64_t seed = SeedFromEnvironmentOrRandom();
  std::cout << "ConvertRandomTest seed: " << seed << " (set FERRY_TEST_SEED to replay)\n";
  SCOPED_TRACE(absl::StrCat("seed ", seed));
  std::mt19937_64 rng(seed);
  int pairs_checked = 0;
  int64_t elements_checked = 0;
  for (DType from : AllDTypes()) {
    for (DType to : AllDTypes()) {
      StatusOr<ConvertKernel> kernel = GetConvertKernel(from, to);
      if (!kernel.ok()) continue;  // the refusals are checked in convert_test.cc
      ++pairs_checked;
      const int64_t src_size = DTypeSize(from);
      const int64_t dst_size = DTypeSize(to);
      int failures = 0;
      for (int trial = 0; trial < 40 && failures < 5; ++trial) {
        // Mostly short rows; some long dense ones to reach vectorised loops and their tails.
        const int64_t count = trial % 10 == 0 ? 500 + static_cast<int64_t>(rng() % 600)
                                              : static_cast<int64_t>(rng() % 40);
        const int64_t src_stride = trial % 10 == 0 ? src_size : RandomStride(rng, src_size);
        const int64_t dst_stride = trial % 10 == 0 ? dst_size : RandomStride(rng, dst_size);
        StridedBuffer src = MakeBuffer(rng, count, src_stride, src_size);
        for (std::byte& byte : src.bytes) byte = static_cast<std::byte>(rng());
        for (int64_t i = 0; i < count; ++i) GenerateElement(rng, from, src.At(i, src_stride));
        StridedBuffer dst = MakeBuffer(rng, count, dst_stride, dst_size);
        for (std::byte& byte : dst.bytes) byte = static_cast<std::byte>(rng());
        StridedBuffer expected = dst;

        for (int64_t i = 0; i < count; ++i) {
          if (from == to) {  // same dtype: a bit copy
            std::memcpy(expected.At(i, dst_stride), src.At(i, src_stride),
                        static_cast<size_t>(src_size));
          } else {
            EncodeExpected(Decode(from, src.At(i, src_stride)), to, expected.At(i, dst_stride));
          }
        }
        (*kernel)(src.At(0, src_stride), src_stride, dst.At(0, dst_stride), dst_stride, count);
        elements_checked += count;

        if (dst.bytes == expected.bytes) continue;
        ++failures;
        // Name the first wrong element (or report the damage outside the elements).
        std::string detail = "bytes outside the written elements changed";
        for (int64_t i = 0; i < count; ++i) {
          const std::byte* got = dst.At(i, dst_stride);
          const std::byte* want = expected.At(i, dst_stride);
          if (std::memcmp(got, want, static_cast<size_t>(dst_size)) != 0) {
            const int64_t last = dst_stride == 0 ? count - 1 : i;
            detail = absl::StrCat(
                "element ", last, ": source bits 0x",
                absl::Hex(LoadBits(src.At(last, src_stride), std::min<int64_t>(src_size, 8))),
                ", got 0x", absl::Hex(LoadBits(got, std::min<int64_t>(dst_size, 8))), ", want 0x",
                absl::Hex(LoadBits(want, std::min<int64_t>(dst_size, 8))));
            break;
          }
        }
        ADD_FAILURE() << DTypeName(from) << " -> " << DTypeName(to) << ", count " << count
                      << ", src stride " << src_stride << ", dst stride " << dst_stride << ": "
                      << detail;
      }
    }
  }
  EXPECT_EQ(pairs_checked, 15 * 15 - 2 * 12 + 2);
  EXPECT_GT(elements_checked, 100000);
}

// The reference itself, on values whose answers are known, so that a broken reference cannot
// make the comparison above vacuous.
TEST(ConvertRandomTest, NaiveReferenceRoundsKnownValuesCorrectly) {
  Real real;
  real.value = 1.0L + 0x1p-8L + 0x1p-30L;
  EXPECT_EQ(EncodeFloat(real, kBF16Format), 0x3F81u);
  real.value = 1.0L + 0x1p-8L;
  EXPECT_EQ(EncodeFloat(real, kBF16Format), 0x3F80u);
  real.value = 65520.0L;
  EXPECT_EQ(EncodeFloat(real, kF16Format), 0x7C00u);
  real.value = -65519.0L;
  EXPECT_EQ(EncodeFloat(real, kF16Format), 0xFBFFu);
  real.value = 3 * 0x1p-25L;
  EXPECT_EQ(EncodeFloat(real, kF16Format), 0x0002u);
  real.value = 0x1p-14L - 0x1p-26L;
  EXPECT_EQ(EncodeFloat(real, kF16Format), 0x0400u);
  real.value = -0.0L;
  EXPECT_EQ(EncodeFloat(real, kF32Format), 0x80000000u);
  real.value = 0x1p-1074L;
  EXPECT_EQ(EncodeFloat(real, kF64Format), 0x1u);
  EXPECT_EQ(DecodeFloat(0x0001, kF16Format).value, 0x1p-24L);
  EXPECT_EQ(DecodeFloat(0xFBFF, kF16Format).value, -65504.0L);
  const Real nan = DecodeFloat(0xFFA00000u, kF32Format);
  EXPECT_TRUE(nan.is_nan);
  EXPECT_EQ(EncodeFloat(nan, kBF16Format), 0xFFE0u);
  EXPECT_EQ(EncodeFloat(nan, kF64Format), 0xFFFC000000000000u);
}

}  // namespace
}  // namespace ferry
