// Byte reversal of elements stored in the other byte order (big-endian tensor files), for the
// copy-convert plan, which reverses a small block of a byte-swapped source at a time, in cache,
// just before converting it: the source is still read once. Complex elements are reversed part
// by part (a big-endian complex64 is two big-endian float32).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/core/dtype.h"

namespace ferry {

// The unit whose bytes a big-endian element reverses: the element size, or half of it for complex
// types. 1 means the dtype has no byte order (nothing to swap).
int64_t ByteSwapUnit(DType dtype);

// Copies `num_units` units of `unit_size` bytes (1, 2, 4, 8 or 16) from `src` to `dst`, reversing
// the bytes of each unit. `src` == `dst` swaps in place; otherwise the ranges must not overlap.
// Neither pointer needs any alignment.
void ByteSwapCopy(const std::byte* src, std::byte* dst, int64_t num_units, int64_t unit_size);

}  // namespace ferry
