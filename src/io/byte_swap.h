// Byte swapping fused with a copy, for big-endian tensor files.
//
// ferry's copy-convert kernels read little-endian (native) elements only. A big-endian .npy array
// is therefore made native once, by ByteSwapCopy, which reads each element once and writes it
// once, swapped: the same cost as the copy that a non-zero-copy source needs anyway. Complex
// elements are swapped part by part (a big-endian complex64 is two big-endian float32).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/core/dtype.h"

namespace ferry::io_internal {

// The unit whose bytes a big-endian element reverses: the element size, or half of it for complex
// types. 1 means the dtype has no byte order (nothing to swap).
int64_t ByteSwapUnit(DType dtype);

// Copies `num_units` units of `unit_size` bytes (1, 2, 4, 8 or 16) from `src` to `dst`, reversing
// the bytes of each unit. `src` == `dst` swaps in place; otherwise the ranges must not overlap.
// Neither pointer needs any alignment.
void ByteSwapCopy(const std::byte* src, std::byte* dst, int64_t num_units, int64_t unit_size);

}  // namespace ferry::io_internal
