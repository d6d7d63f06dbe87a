// The AVX-512 level's kernels: 16 elements per block. Compiled with -mavx512f -mavx512bw
// -mavx512vl (plus the AVX2 level's flags; CMakeLists.txt) and called only on CPUs that have them.
//
// f32 -> bf16 uses integer rounding, not AVX512_BF16's VCVTNEPS2BF16: that instruction treats
// subnormal inputs as zero (0x807FFFFF gives 0x8000 where the rounding rule gives 0x8080). Its
// NaN rule, (u >> 16) | 0x40, is ours; the integer form costs a few more instructions per block
// on a loop bound by memory bandwidth.

#include "src/core/convert_simd.h"

#if defined(__x86_64__)

// GCC 12 reports -Wmaybe-uninitialized and -Wuninitialized inside its own AVX-512 intrinsics,
// which start from _mm512_undefined_*() (GCC bug 105593, fixed in later releases): the warnings
// are about the header's code.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include <cstddef>
#include <cstdint>

#include "src/core/convert_simd_rows.h"

namespace ferry::convert_internal {
namespace {

struct Avx512 {
  static constexpr int64_t kLanes = 16;
  using Lanes = __m512;

  static Lanes LoadF32(const std::byte* src) { return _mm512_loadu_ps(src); }

  // VCVTPH2PS is exact and quiets a NaN keeping its payload, as F16BitsToF32 does.
  static Lanes LoadF16(const std::byte* src) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
  }

  static Lanes LoadBF16(const std::byte* src) {
    const __m512i wide =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src)));
    const __m512i bits = _mm512_slli_epi32(wide, 16);
    const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7F800000));
    return _mm512_castsi512_ps(
        _mm512_mask_or_epi32(bits, is_nan, bits, _mm512_set1_epi32(0x00400000)));
  }

  static Lanes Concatenate(__m256 low, __m256 high) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(low)),
                                               _mm256_castps_pd(high), 1));
  }

  // Eight doubles to eight floats with one hardware rounding (what static_cast does).
  static Lanes LoadF64(const std::byte* src) {
    const double* in = reinterpret_cast<const double*>(src);
    return Concatenate(_mm512_cvtpd_ps(_mm512_loadu_pd(in)),
                       _mm512_cvtpd_ps(_mm512_loadu_pd(in + 8)));
  }

  // F64ToF32RoundToOdd (convert.cc) on eight doubles: the nearest float, stepped back toward zero
  // when it rounded away, with the last bit set when anything was lost. NaN stays the nearest.
  static __m256 RoundToOdd(__m512d value) {
    const __m256 nearest = _mm512_cvtpd_ps(value);
    const __m512d back = _mm512_cvtps_pd(nearest);
    // Ordered and unequal: false for NaN, like `back != value && value == value`.
    const __mmask8 inexact = _mm512_cmp_pd_mask(back, value, _CMP_NEQ_OQ);
    const __mmask8 away = _mm512_cmp_pd_mask(_mm512_abs_pd(back), _mm512_abs_pd(value), _CMP_GT_OQ);
    const __m256i one = _mm256_set1_epi32(1);
    __m256i bits = _mm256_castps_si256(nearest);
    bits = _mm256_mask_sub_epi32(bits, away, bits, one);
    bits = _mm256_mask_or_epi32(bits, inexact, bits, one);
    return _mm256_castsi256_ps(bits);
  }

  static Lanes LoadF64RoundToOdd(const std::byte* src) {
    const double* in = reinterpret_cast<const double*>(src);
    return Concatenate(RoundToOdd(_mm512_loadu_pd(in)), RoundToOdd(_mm512_loadu_pd(in + 8)));
  }

  static void StoreF32(std::byte* dst, Lanes lanes) { _mm512_storeu_ps(dst, lanes); }

  static void StreamLine(std::byte* dst, const std::byte* src) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(dst),
                        _mm512_load_si512(reinterpret_cast<const __m512i*>(src)));
  }
  static void FenceStreams() { _mm_sfence(); }

  // VCVTPS2PH rounds to nearest even by its immediate (whatever MXCSR says), keeps subnormal
  // results, and turns a NaN into sign | 0x7E00 | the top payload bits: F32ToF16Bits exactly.
  static void StoreF16(std::byte* dst, Lanes lanes) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst),
                        _mm512_cvtps_ph(lanes, _MM_FROUND_TO_NEAREST_INT));
  }

  // F32ToBF16Bits on sixteen lanes: (u + 0x7FFF + ((u >> 16) & 1)) >> 16, NaN (u >> 16) | 0x40.
  static void StoreBF16(std::byte* dst, Lanes lanes) {
    const __m512i bits = _mm512_castps_si512(lanes);
    const __m512i high = _mm512_srli_epi32(bits, 16);
    const __m512i odd = _mm512_and_si512(high, _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7FFF)), odd), 16);
    const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
    const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(magnitude, _mm512_set1_epi32(0x7F800000));
    const __m512i result = _mm512_mask_or_epi32(rounded, is_nan, high, _mm512_set1_epi32(0x0040));
    // VPMOVDW keeps the low 16 bits of each lane, which hold the whole result.
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), _mm512_cvtepi32_epi16(result));
  }

  static void StoreF64(std::byte* dst, Lanes lanes) {
    double* out = reinterpret_cast<double*>(dst);
    const __m512d wide = _mm512_castps_pd(lanes);
    _mm512_storeu_pd(out, _mm512_cvtps_pd(_mm512_castps512_ps256(lanes)));
    _mm512_storeu_pd(out + 8, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(wide, 1))));
  }
};

}  // namespace

SimdRowKernel Avx512RowKernel(SimdFloat from, SimdFloat to) { return KernelFor<Avx512>(from, to); }

namespace {

template <bool kStream>
inline void Store16(std::byte* dst, __m512 lanes) {
  if constexpr (kStream) {
    _mm512_stream_ps(reinterpret_cast<float*>(dst), lanes);
  } else {
    _mm512_storeu_ps(reinterpret_cast<float*>(dst), lanes);
  }
}

// A 16x16 block of 4-byte elements in sixteen registers: interleave pairs of columns (32-bit
// unpack), then pairs of pairs (64-bit unpack): u[4m + c] then holds, in its 128-bit lane L,
// element 4L + c of columns 4m..4m+3. Two rounds of 128-bit lane shuffles gather each element's
// four lanes into one register: destination row 4L + c.
struct Avx512TransposeBlock {
  template <bool kStream>
  static void Transpose(const std::byte* src, int64_t src_column_stride, std::byte* dst,
                        int64_t dst_row_stride) {
    __m512 column[16];
    for (int64_t j = 0; j < 16; ++j) {
      column[j] = _mm512_loadu_ps(reinterpret_cast<const float*>(src + j * src_column_stride));
    }
    __m512 pairs[16];
    for (int64_t j = 0; j < 16; j += 2) {
      pairs[j] = _mm512_unpacklo_ps(column[j], column[j + 1]);
      pairs[j + 1] = _mm512_unpackhi_ps(column[j], column[j + 1]);
    }
    __m512 quads[16];
    for (int64_t m = 0; m < 16; m += 4) {
      const __m512d a = _mm512_castps_pd(pairs[m]);
      const __m512d b = _mm512_castps_pd(pairs[m + 1]);
      const __m512d c = _mm512_castps_pd(pairs[m + 2]);
      const __m512d d = _mm512_castps_pd(pairs[m + 3]);
      quads[m] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
      quads[m + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
      quads[m + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
      quads[m + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int64_t c = 0; c < 4; ++c) {
      // Lanes (0, 2) and (1, 3) of columns 0-3 and 4-7 (low), and of 8-11 and 12-15 (high).
      const __m512 low_even = _mm512_shuffle_f32x4(quads[c], quads[4 + c], 0x88);
      const __m512 low_odd = _mm512_shuffle_f32x4(quads[c], quads[4 + c], 0xDD);
      const __m512 high_even = _mm512_shuffle_f32x4(quads[8 + c], quads[12 + c], 0x88);
      const __m512 high_odd = _mm512_shuffle_f32x4(quads[8 + c], quads[12 + c], 0xDD);
      Store16<kStream>(dst + c * dst_row_stride, _mm512_shuffle_f32x4(low_even, high_even, 0x88));
      Store16<kStream>(dst + (4 + c) * dst_row_stride,
                       _mm512_shuffle_f32x4(low_odd, high_odd, 0x88));
      Store16<kStream>(dst + (8 + c) * dst_row_stride,
                       _mm512_shuffle_f32x4(low_even, high_even, 0xDD));
      Store16<kStream>(dst + (12 + c) * dst_row_stride,
                       _mm512_shuffle_f32x4(low_odd, high_odd, 0xDD));
    }
  }
  static void FenceStreams() { _mm_sfence(); }
};

// Every other element of 2, 4 or 8 bytes: two 64-byte loads, the even elements picked across
// both by one two-source permute (VPERMT2W/D/Q), one 64-byte store.
template <int64_t kElementSize>
struct Avx512GatherEveryOtherN {
  static constexpr int64_t kSize = kElementSize;
  static constexpr int64_t kStepBytes = 64;
  template <bool kStream>
  static void Step(const std::byte* src, std::byte* dst) {
    const __m512i a = _mm512_loadu_si512(src);
    const __m512i b = _mm512_loadu_si512(src + 64);
    __m512i even;
    if constexpr (kElementSize == 2) {
      even = _mm512_permutex2var_epi16(
          a,
          _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32, 30, 28,
                           26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0),
          b);
    } else if constexpr (kElementSize == 4) {
      even = _mm512_permutex2var_epi32(
          a, _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0), b);
    } else {
      even = _mm512_permutex2var_epi64(a, _mm512_set_epi64(14, 12, 10, 8, 6, 4, 2, 0), b);
    }
    Store16<kStream>(dst, _mm512_castsi512_ps(even));
  }
  static void FenceStreams() { _mm_sfence(); }
};

}  // namespace

TransposeBandFn Avx512TransposeBand4() { return &TransposeBand<Avx512TransposeBlock>; }

GatherEveryOtherFn Avx512GatherEveryOther(int64_t size) {
  switch (size) {
    case 2:
      return &GatherEveryOther<Avx512GatherEveryOtherN<2>>;
    case 4:
      return &GatherEveryOther<Avx512GatherEveryOtherN<4>>;
    case 8:
      return &GatherEveryOther<Avx512GatherEveryOtherN<8>>;
    default:
      return nullptr;
  }
}

}  // namespace ferry::convert_internal

#else  // not x86-64

namespace ferry::convert_internal {
SimdRowKernel Avx512RowKernel(SimdFloat, SimdFloat) { return nullptr; }
TransposeBandFn Avx512TransposeBand4() { return nullptr; }
GatherEveryOtherFn Avx512GatherEveryOther(int64_t) { return nullptr; }
}  // namespace ferry::convert_internal

#endif
