// The AVX2 level's kernels: 8 elements per block, f16 through F16C, bf16 with integer rounding.
// Compiled with -mavx2 -mf16c -mfma (CMakeLists.txt) and called only on CPUs that have them.

#include "src/core/convert_simd.h"

#if defined(__x86_64__)

#include <immintrin.h>

#include <cstddef>
#include <cstdint>

#include "src/core/convert_simd_rows.h"

namespace ferry::convert_internal {
namespace {

struct Avx2 {
  static constexpr int64_t kLanes = 8;
  using Lanes = __m256;

  static Lanes LoadF32(const std::byte* src) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(src));
  }

  // VCVTPH2PS is exact and quiets a NaN keeping its payload, as F16BitsToF32 does.
  static Lanes LoadF16(const std::byte* src) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
  }

  static Lanes LoadBF16(const std::byte* src) {
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    const __m256i bits = _mm256_slli_epi32(wide, 16);
    const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
    const __m256i quiet = _mm256_and_si256(is_nan, _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(_mm256_or_si256(bits, quiet));
  }

  // Four doubles to four floats with one hardware rounding (what static_cast does).
  static Lanes LoadF64(const std::byte* src) {
    const __m128 low = _mm256_cvtpd_ps(_mm256_loadu_pd(reinterpret_cast<const double*>(src)));
    const __m128 high = _mm256_cvtpd_ps(_mm256_loadu_pd(reinterpret_cast<const double*>(src) + 4));
    return _mm256_set_m128(high, low);
  }

  // F64ToF32RoundToOdd (convert.cc) on four doubles: the nearest float, stepped back toward zero
  // when it rounded away, with the last bit set when anything was lost. NaN stays the nearest.
  static __m128 RoundToOdd(__m256d value) {
    const __m128 nearest = _mm256_cvtpd_ps(value);
    const __m256d back = _mm256_cvtps_pd(nearest);
    const __m256d sign = _mm256_set1_pd(-0.0);
    // Ordered and unequal: false for NaN, like `back != value && value == value`.
    const __m256d inexact = _mm256_cmp_pd(back, value, _CMP_NEQ_OQ);
    const __m256d away =
        _mm256_cmp_pd(_mm256_andnot_pd(sign, back), _mm256_andnot_pd(sign, value), _CMP_GT_OQ);
    // The masks have 64-bit lanes; their low halves are the 32-bit masks.
    const __m256i low_halves = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    const __m128i inexact32 = _mm256_castsi256_si128(
        _mm256_permutevar8x32_epi32(_mm256_castpd_si256(inexact), low_halves));
    const __m128i away32 =
        _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(_mm256_castpd_si256(away), low_halves));
    __m128i bits = _mm_castps_si128(nearest);
    bits = _mm_add_epi32(bits, away32);  // minus one where it rounded away
    bits = _mm_or_si128(bits, _mm_and_si128(inexact32, _mm_set1_epi32(1)));
    return _mm_castsi128_ps(bits);
  }

  static Lanes LoadF64RoundToOdd(const std::byte* src) {
    const __m128 low = RoundToOdd(_mm256_loadu_pd(reinterpret_cast<const double*>(src)));
    const __m128 high = RoundToOdd(_mm256_loadu_pd(reinterpret_cast<const double*>(src) + 4));
    return _mm256_set_m128(high, low);
  }

  static void StreamLine(std::byte* dst, const std::byte* src) {
    for (int half = 0; half < 2; ++half) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(dst + 32 * half),
                          _mm256_load_si256(reinterpret_cast<const __m256i*>(src + 32 * half)));
    }
  }
  static void FenceStreams() { _mm_sfence(); }

  static void StoreF32(std::byte* dst, Lanes lanes) {
    _mm256_storeu_ps(reinterpret_cast<float*>(dst), lanes);
  }

  // VCVTPS2PH rounds to nearest even by its immediate (whatever MXCSR says), keeps subnormal
  // results, and turns a NaN into sign | 0x7E00 | the top payload bits: F32ToF16Bits exactly.
  static void StoreF16(std::byte* dst, Lanes lanes) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst),
                     _mm256_cvtps_ph(lanes, _MM_FROUND_TO_NEAREST_INT));
  }

  // F32ToBF16Bits on eight lanes: (u + 0x7FFF + ((u >> 16) & 1)) >> 16, NaN (u >> 16) | 0x40.
  static void StoreBF16(std::byte* dst, Lanes lanes) {
    const __m256i bits = _mm256_castps_si256(lanes);
    const __m256i high = _mm256_srli_epi32(bits, 16);
    const __m256i odd = _mm256_and_si256(high, _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7FFF)), odd), 16);
    const __m256i nan = _mm256_or_si256(high, _mm256_set1_epi32(0x0040));
    const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
    const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7F800000));
    const __m256i result = _mm256_blendv_epi8(rounded, nan, is_nan);
    // Every lane holds a value below 2^16, so the saturating pack keeps it.
    const __m128i packed =
        _mm_packus_epi32(_mm256_castsi256_si128(result), _mm256_extracti128_si256(result, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), packed);
  }

  static void StoreF64(std::byte* dst, Lanes lanes) {
    double* out = reinterpret_cast<double*>(dst);
    _mm256_storeu_pd(out, _mm256_cvtps_pd(_mm256_castps256_ps128(lanes)));
    _mm256_storeu_pd(out + 4, _mm256_cvtps_pd(_mm256_extractf128_ps(lanes, 1)));
  }
};

}  // namespace

SimdRowKernel Avx2RowKernel(SimdFloat from, SimdFloat to) { return KernelFor<Avx2>(from, to); }

namespace {

// The classic in-register 8x8 transpose of eight rows of eight 4-byte elements: interleave pairs
// of rows (unpack), then pairs of pairs (shuffle), then swap the 128-bit halves (permute2f128).
// On return, c[i] holds what was column i.
inline void Transpose8x8(__m256 c[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(c[0], c[1]);
  const __m256 t1 = _mm256_unpackhi_ps(c[0], c[1]);
  const __m256 t2 = _mm256_unpacklo_ps(c[2], c[3]);
  const __m256 t3 = _mm256_unpackhi_ps(c[2], c[3]);
  const __m256 t4 = _mm256_unpacklo_ps(c[4], c[5]);
  const __m256 t5 = _mm256_unpackhi_ps(c[4], c[5]);
  const __m256 t6 = _mm256_unpacklo_ps(c[6], c[7]);
  const __m256 t7 = _mm256_unpackhi_ps(c[6], c[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 u7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  c[0] = _mm256_permute2f128_ps(u0, u4, 0x20);
  c[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  c[2] = _mm256_permute2f128_ps(u2, u6, 0x20);
  c[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  c[4] = _mm256_permute2f128_ps(u0, u4, 0x31);
  c[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  c[6] = _mm256_permute2f128_ps(u2, u6, 0x31);
  c[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

template <bool kStream>
inline void Store8(std::byte* dst, __m256 lanes) {
  if constexpr (kStream) {
    _mm256_stream_ps(reinterpret_cast<float*>(dst), lanes);
  } else {
    _mm256_storeu_ps(reinterpret_cast<float*>(dst), lanes);
  }
}

// A 16x16 block as four 8x8 ones: for each half of the destination rows, the left and right
// 8x8 blocks are transposed first, so that each destination row's 64 bytes are stored together.
struct Avx2TransposeBlock {
  template <bool kStream>
  static void Transpose(const std::byte* src, int64_t src_column_stride, std::byte* dst,
                        int64_t dst_row_stride) {
    for (int64_t row_half = 0; row_half < 2; ++row_half) {
      __m256 left[8];
      __m256 right[8];
      for (int64_t j = 0; j < 8; ++j) {
        const std::byte* column = src + 32 * row_half;
        left[j] = _mm256_loadu_ps(reinterpret_cast<const float*>(column + j * src_column_stride));
        right[j] =
            _mm256_loadu_ps(reinterpret_cast<const float*>(column + (j + 8) * src_column_stride));
      }
      Transpose8x8(left);
      Transpose8x8(right);
      for (int64_t i = 0; i < 8; ++i) {
        std::byte* row = dst + (8 * row_half + i) * dst_row_stride;
        Store8<kStream>(row, left[i]);
        Store8<kStream>(row + 32, right[i]);
      }
    }
  }
  static void FenceStreams() { _mm_sfence(); }
};

// Every other element of 4 or 8 bytes: two 32-byte loads; the even elements of each 128-bit
// half are picked (4 bytes: shuffle; 8 bytes: unpack), then the 64-bit pairs put in order
// (permute4x64).
template <int64_t kElementSize>
struct Avx2GatherEveryOtherN {
  static constexpr int64_t kSize = kElementSize;
  static constexpr int64_t kStepBytes = 32;
  template <bool kStream>
  static void Step(const std::byte* src, std::byte* dst) {
    __m256d even;
    if constexpr (kElementSize == 4) {
      const __m256 a = _mm256_loadu_ps(reinterpret_cast<const float*>(src));
      const __m256 b = _mm256_loadu_ps(reinterpret_cast<const float*>(src + 32));
      even = _mm256_castps_pd(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    } else {
      const __m256d a = _mm256_loadu_pd(reinterpret_cast<const double*>(src));
      const __m256d b = _mm256_loadu_pd(reinterpret_cast<const double*>(src + 32));
      even = _mm256_unpacklo_pd(a, b);
    }
    Store8<kStream>(dst, _mm256_castpd_ps(_mm256_permute4x64_pd(even, _MM_SHUFFLE(3, 1, 2, 0))));
  }
  static void FenceStreams() { _mm_sfence(); }
};

}  // namespace

TransposeBandFn Avx2TransposeBand4() { return &TransposeBand<Avx2TransposeBlock>; }

GatherEveryOtherFn Avx2GatherEveryOther(int64_t size) {
  switch (size) {
    case 4:
      return &GatherEveryOther<Avx2GatherEveryOtherN<4>>;
    case 8:
      return &GatherEveryOther<Avx2GatherEveryOtherN<8>>;
    default:
      return nullptr;
  }
}

}  // namespace ferry::convert_internal

#else  // not x86-64

namespace ferry::convert_internal {
SimdRowKernel Avx2RowKernel(SimdFloat, SimdFloat) { return nullptr; }
TransposeBandFn Avx2TransposeBand4() { return nullptr; }
GatherEveryOtherFn Avx2GatherEveryOther(int64_t) { return nullptr; }
}  // namespace ferry::convert_internal

#endif
