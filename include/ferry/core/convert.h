// Element conversions between dtypes (the rules are in docs/conversions.md).
//
// - Floats round to nearest even, exactly once, whatever the path (f64 -> bf16 is not
//   f64 -> f32 -> bf16). NaN stays a quiet NaN of the same sign; overflow gives +-Inf;
//   subnormals are rounded, never flushed.
// - Integers narrow by wrapping (two's complement); float -> int truncates toward zero and
//   saturates, NaN -> 0; anything -> bool is `!= 0`; bool -> anything is 0 or 1;
//   real -> complex has imaginary part 0; complex -> real is refused.
//
// All functions are pure and thread-safe.
#pragma once

#include <cstdint>

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

// The kernel converting `from` to `to`, or the error of CheckConvertible(from, to).
// Same-dtype pairs return a plain copy kernel (valid for storage-only types too).
StatusOr<ConvertKernel> GetConvertKernel(DType from, DType to);

}  // namespace ferry
