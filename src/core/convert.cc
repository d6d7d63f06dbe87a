// Element conversions. The rules (docs/conversions.md) are implemented once, as one-element
// functions composed per pair by ConvertElement; the kernels are templates that apply it along a
// strided row, so that every one of the 225 numeric pairs follows the same rules by construction.
// These are the scalar reference and the portable kernel level; the vector levels
// (convert_avx2.cc, convert_avx512.cc) must match them bit for bit, and GetConvertKernel picks
// among them (the level detection is in convert_level.cc).
//
// The hardware conversions used here (f64 <-> f32, integer -> f32/f64) rely on the default
// floating-point environment: round to nearest even, no FTZ/DAZ (see docs/conversions.md).

#include "ferry/core/convert.h"

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <utility>

#include "ferry/core/dtype.h"
#include "ferry/core/status.h"
#include "fmt/format.h"
#include "src/core/convert_simd.h"

namespace ferry {
namespace {

// ---------------------------------------------------------------------------------------------
// The 16-bit float conversions.
//
// f16 has two formulations of each direction: the exported scalar functions branch (fastest one
// value at a time), and the *BranchFree forms used by the kernels compute every case and select,
// so that dense loops vectorise. tests/exhaustive checks both on every input.

// `condition ? if_true : if_false` without a branch. With the default -ftrapping-math, GCC will
// not if-convert a `?:` that skips a float operation (it might raise a flag), so the loops
// around the 16-bit conversions would not vectorise; bit masks keep them straight-line.
inline uint32_t SelectBits(bool condition, uint32_t if_true, uint32_t if_false) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (if_true & mask) | (if_false & ~mask);
}

inline uint16_t F32ToBF16BitsInline(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  // Rounding a NaN would carry into the exponent (0x7F800001 -> Inf); keep its sign and top
  // payload bits and set the quiet bit instead.
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

inline uint16_t F32ToF16BitsBranchFree(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t magnitude = u & 0x7FFFFFFFu;
  // The comparisons use a signed copy (the magnitude fits): SSE2 has no unsigned 32-bit compare,
  // and with a signed one the loop vectorises.
  const auto signed_magnitude = static_cast<int32_t>(magnitude);
  // Normal f16 results (|x| >= 2^-14): drop 13 mantissa bits with round-to-nearest-even and
  // rebias the exponent (127 - 15 = 112, i.e. 0x38000000 in f32 bits). A carry out of the
  // mantissa correctly bumps the exponent.
  const uint32_t normal = (magnitude + 0x0FFFu + ((magnitude >> 13) & 1u) - 0x38000000u) >> 13;
  // Subnormal f16 results (|x| < 2^-14): adding 0.5 puts |x| / 2^-24 into the low mantissa bits
  // of a float in [0.5, 1), whose unit in the last place is 2^-24; the add itself rounds to
  // nearest even. Values up to 2^-25 round to 0, and the top of the range rounds to 2^-14.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(magnitude) + 0.5f) - 0x3F000000u;
  uint32_t result = SelectBits(signed_magnitude < 0x38800000, subnormal, normal);
  // 65520 = 0x477FF000 is the midpoint between 65504 and 2^16: from there on, Inf.
  result = SelectBits(signed_magnitude >= 0x477FF000, 0x7C00u, result);
  // NaN: quiet, with the top payload bits.
  const uint32_t nan = 0x7E00u | ((magnitude >> 13) & 0x03FFu);
  result = SelectBits(signed_magnitude > 0x7F800000, nan, result);
  return static_cast<uint16_t>(sign | result);
}

inline float BF16BitsToF32Inline(uint16_t bits) {
  const bool is_nan = (bits & 0x7FFFu) > 0x7F80u;
  const uint32_t u = static_cast<uint32_t>(bits | (is_nan ? 0x0040u : 0u)) << 16;
  return std::bit_cast<float>(u);
}

inline float F16BitsToF32BranchFree(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x03FFu;
  const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
  // Zero or subnormal: mantissa * 2^-24, exact in f32 (a normal f32 unless 0).
  // (Converted as signed: SSE2 vectorises only signed int -> float.)
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(static_cast<float>(static_cast<int32_t>(mantissa)) * 0x1p-24f);
  // Inf, or NaN made quiet.
  const uint32_t inf_or_nan = 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  const uint32_t u =
      SelectBits(exponent == 0x1F, inf_or_nan, SelectBits(exponent == 0, subnormal, normal));
  return std::bit_cast<float>(sign | u);
}

// f64 -> f32 rounding to odd: truncate toward zero, and set the last bit if anything was lost.
// Rounding the result again to a format with at least 2 fewer significant bits gives the same
// answer as rounding the f64 directly (f32 has 24 bits; bf16 8 and f16 11, subnormals included,
// since f32's grid is finer than theirs everywhere in their range).
inline float F64ToF32RoundToOdd(double value) {
  const float nearest = static_cast<float>(value);
  uint32_t u = std::bit_cast<uint32_t>(nearest);
  const double back = static_cast<double>(nearest);
  if (back != value && value == value) {
    // Rounded away from zero (possibly to Inf): step back to the truncated neighbour.
    if (std::fabs(back) > std::fabs(value)) --u;
    u |= 1u;
  }
  return std::bit_cast<float>(u);
}

inline uint16_t F64ToBF16BitsInline(double value) {
  return F32ToBF16BitsInline(F64ToF32RoundToOdd(value));
}
inline uint16_t F64ToF16BitsBranchFree(double value) {
  return F32ToF16BitsBranchFree(F64ToF32RoundToOdd(value));
}

// An integer magnitude to f64 rounding to odd (exact below 2^53), for the same reason: a 64-bit
// integer must reach bf16 or f16 with a single rounding.
inline double U64ToF64RoundToOdd(uint64_t magnitude) {
  const int excess = std::bit_width(magnitude) - 53;
  if (excess <= 0) return static_cast<double>(magnitude);
  const uint64_t lost_mask = (uint64_t{1} << excess) - 1;
  const uint64_t sticky = (magnitude & lost_mask) != 0 ? 1u : 0u;
  // At most 53 significant bits remain, so this conversion is exact.
  return static_cast<double>(((magnitude >> excess) | sticky) << excess);
}

template <typename Int>
inline double IntToF64RoundToOdd(Int value) {
  if constexpr (std::is_signed_v<Int>) {
    const uint64_t magnitude =
        value < 0 ? uint64_t{0} - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
    const double rounded = U64ToF64RoundToOdd(magnitude);
    return value < 0 ? -rounded : rounded;
  } else {
    return U64ToF64RoundToOdd(value);
  }
}

// Float to integer: truncate toward zero, saturate at the type's limits, NaN -> 0.
template <typename Int, typename Float>
inline Int FloatToInt(Float value) {
  constexpr int kValueBits = std::numeric_limits<Int>::digits;  // excludes the sign bit
  // Both bounds are powers of two (or 0), exact in every float type.
  constexpr Float kUpperExclusive =
      static_cast<Float>(static_cast<double>(uint64_t{1} << (kValueBits - 1)) * 2.0);
  constexpr Float kLower = static_cast<Float>(std::numeric_limits<Int>::min());
  if (!(value == value)) return 0;
  if (value >= kUpperExclusive) return std::numeric_limits<Int>::max();
  if (value <= kLower) return std::numeric_limits<Int>::min();
  return static_cast<Int>(value);  // (kLower, kUpperExclusive): in range after truncation
}

// ---------------------------------------------------------------------------------------------
// Per-dtype storage and the one-element conversion between any two numeric dtypes.

template <typename Part>
struct Complex {
  Part real;
  Part imag;
};

template <DType D>
struct Traits;
#define FERRY_DTYPE_TRAITS_(dtype, storage) \
  template <>                               \
  struct Traits<dtype> {                    \
    using Storage = storage;                \
  }
FERRY_DTYPE_TRAITS_(DType::kBool, uint8_t);  // any non-zero byte reads as true
FERRY_DTYPE_TRAITS_(DType::kS8, int8_t);
FERRY_DTYPE_TRAITS_(DType::kS16, int16_t);
FERRY_DTYPE_TRAITS_(DType::kS32, int32_t);
FERRY_DTYPE_TRAITS_(DType::kS64, int64_t);
FERRY_DTYPE_TRAITS_(DType::kU8, uint8_t);
FERRY_DTYPE_TRAITS_(DType::kU16, uint16_t);
FERRY_DTYPE_TRAITS_(DType::kU32, uint32_t);
FERRY_DTYPE_TRAITS_(DType::kU64, uint64_t);
FERRY_DTYPE_TRAITS_(DType::kF16, uint16_t);   // bits
FERRY_DTYPE_TRAITS_(DType::kBF16, uint16_t);  // bits
FERRY_DTYPE_TRAITS_(DType::kF32, float);
FERRY_DTYPE_TRAITS_(DType::kF64, double);
FERRY_DTYPE_TRAITS_(DType::kC64, Complex<float>);
FERRY_DTYPE_TRAITS_(DType::kC128, Complex<double>);
#undef FERRY_DTYPE_TRAITS_

template <DType D>
using StorageOf = typename Traits<D>::Storage;

constexpr bool IsInteger(DType d) { return d >= DType::kS8 && d <= DType::kU64; }
constexpr bool IsHalf(DType d) { return d == DType::kF16 || d == DType::kBF16; }
constexpr bool IsComplex(DType d) { return d == DType::kC64 || d == DType::kC128; }
constexpr DType PartOf(DType d) { return d == DType::kC64 ? DType::kF32 : DType::kF64; }

// A 16-bit float widened to f32 (exact); other values unchanged.
template <DType From>
inline auto Widen(StorageOf<From> value) {
  if constexpr (From == DType::kF16) {
    return F16BitsToF32BranchFree(value);
  } else if constexpr (From == DType::kBF16) {
    return BF16BitsToF32Inline(value);
  } else {
    return value;
  }
}

template <DType From>
inline bool IsNonZero(StorageOf<From> value) {
  if constexpr (From == DType::kBool || IsInteger(From)) {
    return value != 0;
  } else if constexpr (IsHalf(From)) {
    return (value & 0x7FFFu) != 0;  // NaN is non-zero; -0 is zero
  } else if constexpr (From == DType::kF32) {
    return (std::bit_cast<uint32_t>(value) & 0x7FFFFFFFu) != 0;
  } else if constexpr (From == DType::kF64) {
    return (std::bit_cast<uint64_t>(value) & 0x7FFFFFFFFFFFFFFFu) != 0;
  } else {
    return IsNonZero<PartOf(From)>(value.real) || IsNonZero<PartOf(From)>(value.imag);
  }
}

// `value` with a NaN made quiet; other values unchanged.
template <DType D>
inline StorageOf<D> QuietNaN(StorageOf<D> value) {
  if constexpr (D == DType::kF32) {
    const uint32_t u = std::bit_cast<uint32_t>(value);
    const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
    return std::bit_cast<float>(is_nan ? (u | 0x00400000u) : u);
  } else if constexpr (D == DType::kF64) {
    const uint64_t u = std::bit_cast<uint64_t>(value);
    const bool is_nan = (u & 0x7FFFFFFFFFFFFFFFu) > 0x7FF0000000000000u;
    return std::bit_cast<double>(is_nan ? (u | 0x0008000000000000u) : u);
  } else {
    return value;
  }
}

// A real, non-bool value to a real float dtype.
template <DType From, DType To>
inline StorageOf<To> ToFloat(StorageOf<From> value) {
  if constexpr (IsInteger(From)) {
    if constexpr (To == DType::kF32 || To == DType::kF64) {
      return static_cast<StorageOf<To>>(value);  // one hardware rounding
    } else {
      // Up to 16 bits: exact in f32; wider: exact (32-bit) or rounded to odd (64-bit) in f64.
      if constexpr (sizeof(value) <= 2) {
        const float exact = static_cast<float>(value);
        return To == DType::kF16 ? F32ToF16BitsBranchFree(exact) : F32ToBF16BitsInline(exact);
      } else {
        const double wide = IntToF64RoundToOdd(value);
        return To == DType::kF16 ? F64ToF16BitsBranchFree(wide) : F64ToBF16BitsInline(wide);
      }
    }
  } else {
    const auto wide = Widen<From>(value);  // float or double, exact
    if constexpr (To == DType::kF32 || To == DType::kF64) {
      return static_cast<StorageOf<To>>(wide);  // widening is exact; f64 -> f32 rounds once
    } else if constexpr (From == DType::kF64) {
      return To == DType::kF16 ? F64ToF16BitsBranchFree(wide) : F64ToBF16BitsInline(wide);
    } else {
      return To == DType::kF16 ? F32ToF16BitsBranchFree(wide) : F32ToBF16BitsInline(wide);
    }
  }
}

template <DType From, DType To>
inline StorageOf<To> ConvertElement(StorageOf<From> value) {
  static_assert(!(IsComplex(From) && !IsComplex(To) && To != DType::kBool),
                "complex to real is refused by CheckConvertible");
  if constexpr (From == To) {
    // Only reached for the real part of real -> complex (f32 -> c64, f64 -> c128): a conversion,
    // so NaNs come out quiet like every other conversion's. (Same-dtype kernels copy bits.)
    return QuietNaN<From>(value);
  } else if constexpr (To == DType::kBool) {
    return IsNonZero<From>(value) ? 1 : 0;
  } else if constexpr (From == DType::kBool) {
    return ConvertElement<DType::kU8, To>(value != 0 ? 1 : 0);
  } else if constexpr (IsComplex(To)) {
    using Part = StorageOf<PartOf(To)>;
    if constexpr (IsComplex(From)) {
      return {ConvertElement<PartOf(From), PartOf(To)>(value.real),
              ConvertElement<PartOf(From), PartOf(To)>(value.imag)};
    } else {
      return {ConvertElement<From, PartOf(To)>(value), Part{0}};
    }
  } else if constexpr (IsInteger(To)) {
    if constexpr (IsInteger(From)) {
      return static_cast<StorageOf<To>>(value);  // modulo 2^bits (C++20)
    } else {
      return FloatToInt<StorageOf<To>>(Widen<From>(value));
    }
  } else {
    return ToFloat<From, To>(value);
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels.

// Dense rows are converted in batches of a constant number of elements through pointers that do
// not alias (the kernel contract), so that the vectoriser needs neither a remainder loop nor an
// overlap check; GCC's -O2 cost model vectorises only such loops.
constexpr int64_t kBatch = 32;

template <DType From, DType To>
inline void ConvertBatch(const std::byte* __restrict src, std::byte* __restrict dst) {
  using Source = StorageOf<From>;
  using Target = StorageOf<To>;
  for (int64_t i = 0; i < kBatch; ++i) {
    Source value;
    std::memcpy(&value, src + i * static_cast<int64_t>(sizeof(Source)), sizeof(Source));
    const Target converted = ConvertElement<From, To>(value);
    std::memcpy(dst + i * static_cast<int64_t>(sizeof(Target)), &converted, sizeof(Target));
  }
}

template <DType From, DType To>
void ConvertRow(const std::byte* src, int64_t src_stride_bytes, std::byte* dst,
                int64_t dst_stride_bytes, int64_t count) {
  using Source = StorageOf<From>;
  using Target = StorageOf<To>;
  constexpr int64_t kSourceSize = sizeof(Source);
  constexpr int64_t kTargetSize = sizeof(Target);
  if (src_stride_bytes == kSourceSize && dst_stride_bytes == kTargetSize) {
    // Dense: whole batches, then the rest.
    int64_t i = 0;
    for (; i + kBatch <= count; i += kBatch) {
      ConvertBatch<From, To>(src + i * kSourceSize, dst + i * kTargetSize);
    }
    for (; i < count; ++i) {
      Source value;
      std::memcpy(&value, src + i * kSourceSize, sizeof(Source));
      const Target converted = ConvertElement<From, To>(value);
      std::memcpy(dst + i * kTargetSize, &converted, sizeof(Target));
    }
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    Source value;
    std::memcpy(&value, src + i * src_stride_bytes, sizeof(Source));
    const Target converted = ConvertElement<From, To>(value);
    std::memcpy(dst + i * dst_stride_bytes, &converted, sizeof(Target));
  }
}

// Dense copies of convert_internal::kStreamMinBytes or more go out with non-temporal stores
// (SSE2, part of every x86-64). glibc's memcpy streams only above ~3/4 of the L3 cache, and a
// transfer copies in chunks smaller than that.
void CopyBytes(std::byte* dst, const std::byte* src, int64_t bytes) {
#if defined(__x86_64__)
  if (bytes >= convert_internal::kStreamMinBytes) {
    const int64_t head = static_cast<int64_t>((64 - reinterpret_cast<uintptr_t>(dst) % 64) % 64);
    std::memcpy(dst, src, static_cast<size_t>(head));
    int64_t done = head;
    for (; done + 64 <= bytes; done += 64) {
      const auto* from = reinterpret_cast<const __m128i*>(src + done);
      auto* to = reinterpret_cast<__m128i*>(dst + done);
      const __m128i a = _mm_loadu_si128(from);
      const __m128i b = _mm_loadu_si128(from + 1);
      const __m128i c = _mm_loadu_si128(from + 2);
      const __m128i d = _mm_loadu_si128(from + 3);
      _mm_stream_si128(to, a);
      _mm_stream_si128(to + 1, b);
      _mm_stream_si128(to + 2, c);
      _mm_stream_si128(to + 3, d);
    }
    _mm_sfence();  // the streamed lines are ordered before whatever signals the copy's end
    std::memcpy(dst + done, src + done, static_cast<size_t>(bytes - done));
    return;
  }
#endif
  std::memcpy(dst, src, static_cast<size_t>(bytes));
}

template <int64_t kSize>
void CopyRow(const std::byte* src, int64_t src_stride_bytes, std::byte* dst,
             int64_t dst_stride_bytes, int64_t count) {
  if (count <= 0) return;  // also keeps null pointers away from memcpy
  if (src_stride_bytes == kSize && dst_stride_bytes == kSize) {
    CopyBytes(dst, src, count * kSize);
    return;
  }
  for (int64_t i = 0; i < count; ++i) {
    std::memcpy(dst + i * dst_stride_bytes, src + i * src_stride_bytes, kSize);
  }
}

ConvertKernel CopyKernelForSize(int64_t size) {
  switch (size) {
    case 1:
      return &CopyRow<1>;
    case 2:
      return &CopyRow<2>;
    case 4:
      return &CopyRow<4>;
    case 8:
      return &CopyRow<8>;
    case 16:
      return &CopyRow<16>;
    default:
      return nullptr;
  }
}

// The 15 numeric dtypes are the first 15 enumerators.
constexpr int kNumNumericDTypes = 15;
static_assert(static_cast<int>(DType::kC128) == kNumNumericDTypes - 1);

template <int kFrom, int kTo>
constexpr ConvertKernel MakeKernel() {
  constexpr auto from = static_cast<DType>(kFrom);
  constexpr auto to = static_cast<DType>(kTo);
  if constexpr (kFrom == kTo) {
    return nullptr;  // served by the copy kernels
  } else if constexpr (IsComplex(from) && !IsComplex(to) && to != DType::kBool) {
    return nullptr;  // refused by CheckConvertible
  } else {
    return &ConvertRow<from, to>;
  }
}

template <int kFrom, int... kTos>
constexpr std::array<ConvertKernel, kNumNumericDTypes> MakeKernelRow(
    std::integer_sequence<int, kTos...>) {
  return {MakeKernel<kFrom, kTos>()...};
}

template <int... kFroms>
constexpr std::array<std::array<ConvertKernel, kNumNumericDTypes>, kNumNumericDTypes>
MakeKernelTable(std::integer_sequence<int, kFroms...>) {
  return {MakeKernelRow<kFroms>(std::make_integer_sequence<int, kNumNumericDTypes>())...};
}

constexpr auto kKernels = MakeKernelTable(std::make_integer_sequence<int, kNumNumericDTypes>());

// The vector kernels (convert_simd.h) have their own function type, spelled the same.
static_assert(std::is_same_v<ConvertKernel, convert_internal::SimdRowKernel>);

std::optional<convert_internal::SimdFloat> SimdFloatOf(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return convert_internal::SimdFloat::kF16;
    case DType::kBF16:
      return convert_internal::SimdFloat::kBF16;
    case DType::kF32:
      return convert_internal::SimdFloat::kF32;
    case DType::kF64:
      return convert_internal::SimdFloat::kF64;
    default:
      return std::nullopt;
  }
}

}  // namespace

uint16_t F32ToBF16Bits(float value) { return F32ToBF16BitsInline(value); }
float BF16BitsToF32(uint16_t bits) { return BF16BitsToF32Inline(bits); }
uint16_t F64ToBF16Bits(double value) { return F64ToBF16BitsInline(value); }

uint16_t F32ToF16Bits(float value) {
  const uint32_t u = std::bit_cast<uint32_t>(value);
  const auto sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t magnitude = u & 0x7FFFFFFFu;
  if (magnitude < 0x38800000u) {  // below 2^-14: subnormal or zero (see the branch-free form)
    const uint32_t rounded =
        std::bit_cast<uint32_t>(std::bit_cast<float>(magnitude) + 0.5f) - 0x3F000000u;
    return static_cast<uint16_t>(sign | rounded);
  }
  if (magnitude < 0x477FF000u) {  // below 65520: normal
    const uint32_t rounded = (magnitude + 0x0FFFu + ((magnitude >> 13) & 1u) - 0x38000000u) >> 13;
    return static_cast<uint16_t>(sign | rounded);
  }
  if (magnitude <= 0x7F800000u) return static_cast<uint16_t>(sign | 0x7C00u);    // Inf
  return static_cast<uint16_t>(sign | 0x7E00u | ((magnitude >> 13) & 0x03FFu));  // quiet NaN
}

float F16BitsToF32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x03FFu;
  uint32_t magnitude;
  if (exponent == 0) {
    magnitude = std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f);  // exact
  } else if (exponent == 0x1F) {
    magnitude = 0x7F800000u | (mantissa << 13) | (mantissa != 0 ? 0x00400000u : 0u);
  } else {
    magnitude = ((exponent + 112u) << 23) | (mantissa << 13);
  }
  return std::bit_cast<float>(sign | magnitude);
}

uint16_t F64ToF16Bits(double value) { return F32ToF16Bits(F64ToF32RoundToOdd(value)); }

StatusOr<ConvertKernel> GetConvertKernel(DType from, DType to, ConvertKernelLevel level) {
  FERRY_RETURN_IF_ERROR(CheckConvertible(from, to));  // also rejects out-of-range values
  if (level != ConvertKernelLevel::kPortable && level != ConvertKernelLevel::kAvx2 &&
      level != ConvertKernelLevel::kAvx512) {
    return InvalidArgumentError(
        fmt::format("invalid conversion kernel level {}", static_cast<int>(level)));
  }
  if (level > BestConvertKernelLevel()) {
    return FailedPreconditionError(fmt::format(
        "the {} conversion kernels need {}; this machine's best level is {}",
        ConvertKernelLevelName(level),
        level == ConvertKernelLevel::kAvx2
            ? "an x86-64 CPU with AVX2, F16C and FMA"
            : "an x86-64 CPU with AVX-512 F, BW and VL, AVX2, F16C and FMA, and an OS that saves "
              "the AVX-512 registers",
        ConvertKernelLevelName(BestConvertKernelLevel())));
  }
  if (from == to) return CopyKernelForSize(DTypeSize(from));  // a memcpy at every level

  const std::optional<convert_internal::SimdFloat> simd_from = SimdFloatOf(from);
  const std::optional<convert_internal::SimdFloat> simd_to = SimdFloatOf(to);
  if (simd_from.has_value() && simd_to.has_value()) {
    if (level >= ConvertKernelLevel::kAvx512) {
      return convert_internal::Avx512RowKernel(*simd_from, *simd_to);
    }
    if (level >= ConvertKernelLevel::kAvx2) {
      return convert_internal::Avx2RowKernel(*simd_from, *simd_to);
    }
  }
  const ConvertKernel kernel = kKernels[static_cast<size_t>(from)][static_cast<size_t>(to)];
  if (kernel == nullptr) {
    return InternalError(
        fmt::format("no kernel converting {} to {}", DTypeName(from), DTypeName(to)));
  }
  return kernel;
}

StatusOr<ConvertKernel> GetConvertKernel(DType from, DType to) {
  FERRY_ASSIGN_OR_RETURN(const ConvertKernelLevel level, ActiveConvertKernelLevel());
  return GetConvertKernel(from, to, level);
}

}  // namespace ferry
