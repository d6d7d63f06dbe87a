// Element conversions between dtypes (the rules are in docs/conversions.md).
//
// - Floats round to nearest even, exactly once, whatever the path (f64 -> bf16 is not
//   f64 -> f32 -> bf16). NaN stays a quiet NaN of the same sign; overflow gives +-Inf;
//   subnormals are rounded, never flushed.
// - Integers narrow by wrapping (two's complement); float -> int truncates toward zero and
//   saturates, NaN -> 0; anything -> bool is `!= 0`; bool -> anything is 0 or 1;
//   real -> complex has imaginary part 0; complex -> real is refused.
//
// All functions are thread-safe, and pure except for the kernel level, which depends on the CPU
// and on FERRY_CONVERT_KERNELS (both read once).
#pragma once

#include <cstdint>
#include <string_view>

#include "ferry/core/dtype.h"
#include "ferry/core/status.h"

namespace ferry {

// Scalar reference conversions for the 16-bit float formats (bit patterns in, bit patterns out).
// Narrowing rounds once to nearest even (the F64 forms directly from the f64 value, not through
// f32), overflows to +-Inf and keeps subnormals; widening is exact. A NaN comes out as a quiet NaN
// of the same sign with the leading payload bits kept. The kernels give the same results.
uint16_t F32ToBF16Bits(float value);
uint16_t F32ToF16Bits(float value);
float BF16BitsToF32(uint16_t bits);
float F16BitsToF32(uint16_t bits);
uint16_t F64ToBF16Bits(double value);
uint16_t F64ToF16Bits(double value);

// Converts `count` elements. Element i is read at `src + i * src_stride_bytes` (as `from`) and
// written at `dst + i * dst_stride_bytes` (as `to`). Strides are in bytes and may be negative,
// zero (with a zero destination stride the last element wins) or not a multiple of the element
// size: elements need no alignment. Source and destination must not overlap. A `count` <= 0
// touches no memory (the pointers may then be null).
using ConvertKernel = void (*)(const std::byte* src, int64_t src_stride_bytes, std::byte* dst,
                               int64_t dst_stride_bytes, int64_t count);

// The instruction sets a kernel may use, in increasing order. Every level gives bit-identical
// results (the rules above, on every input); a higher one is only faster. The float pairs among
// f16, bf16, f32 and f64 have vectorised kernels at kAvx2 and kAvx512; other pairs use the portable
// kernel at every level.
enum class ConvertKernelLevel {
  kPortable,  // plain C++, compiled for the baseline of the target: runs on any CPU
  kAvx2,      // x86-64 with AVX2, F16C and FMA
  kAvx512,    // x86-64 with AVX-512 F, BW and VL (and the AVX2 level's features)
};

// "portable", "avx2" or "avx512". The returned view is valid forever.
std::string_view ConvertKernelLevelName(ConvertKernelLevel level);

// The level named `name` (as ConvertKernelLevelName spells it), or InvalidArgument.
StatusOr<ConvertKernelLevel> ConvertKernelLevelFromName(std::string_view name);

// The highest level this CPU and operating system support (on other architectures than x86-64,
// kPortable). Detected once, on the first call.
ConvertKernelLevel BestConvertKernelLevel();

// The level GetConvertKernel(from, to) uses: BestConvertKernelLevel(), lowered to the level named
// by the setting FERRY_CONVERT_KERNELS (portable, avx2 or avx512; ferry/core/settings.h) when it
// is set, not empty, and lower. A level the CPU lacks is never used: FERRY_CONVERT_KERNELS=avx512
// on an AVX2 machine means avx2. The setting is read on the first call and again after each
// SetSetting or ClearSetting; any other value is InvalidArgument naming the variable, on every
// call until it is changed.
StatusOr<ConvertKernelLevel> ActiveConvertKernelLevel();

// The kernel converting `from` to `to`, or the error of CheckConvertible(from, to), or the error
// of ActiveConvertKernelLevel(). Same-dtype pairs return a plain copy kernel (valid for
// storage-only types too). The kernel is a plain function, valid for the life of the process.
StatusOr<ConvertKernel> GetConvertKernel(DType from, DType to);

// The same at a chosen level, whatever FERRY_CONVERT_KERNELS says, for tests and benchmarks.
// A level above BestConvertKernelLevel() is FailedPrecondition, saying what it needs; a value
// outside the enum is InvalidArgument.
StatusOr<ConvertKernel> GetConvertKernel(DType from, DType to, ConvertKernelLevel level);

}  // namespace ferry
