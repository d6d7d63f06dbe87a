// The vectorised conversion kernels behind GetConvertKernel's levels
// (include/ferry/core/convert.h). Each level's kernels live in their own file, compiled with that
// level's instruction-set flags; GetConvertKernel (convert.cc) calls into a file only after
// checking that the CPU has its level.
//
// This header includes no ferry or abseil header on purpose: the per-level files are compiled
// with -mavx2 or -mavx512f, and any code they contain, static initialisers and inline functions
// of included headers too, may use those instructions. Keeping them to intrinsics and <cstring>
// keeps such code out of them (see also convert_simd_rows.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::convert_internal {

// Dense rows of at least this many destination bytes, copies (convert.cc) and vector conversions
// alike, are written with non-temporal stores from their first 64-byte boundary: far larger than
// the caches, their lines would only evict the source's, and a streamed line costs no
// read-for-ownership (~30% faster f64 -> f32 here). Shorter rows stay cached, as whoever writes a
// small piece usually reads it soon.
inline constexpr int64_t kStreamMinBytes = int64_t{1} << 20;

// The float formats the vector kernels convert between.
enum class SimdFloat { kF16, kBF16, kF32, kF64 };

// The same function type as ferry::ConvertKernel, with the same contract.
using SimdRowKernel = void (*)(const std::byte* src, int64_t src_stride_bytes, std::byte* dst,
                               int64_t dst_stride_bytes, int64_t count);

// The level's kernel converting `from` to `to` (different formats), or nullptr when `from == to`.
// Dense rows run in vector registers; strided rows are gathered into a small dense buffer,
// converted, and scattered. On other architectures than x86-64 both return nullptr. Call only
// when BestConvertKernelLevel() reaches the level: the kernels use its instructions.
SimdRowKernel Avx2RowKernel(SimdFloat from, SimdFloat to);
SimdRowKernel Avx512RowKernel(SimdFloat from, SimdFloat to);

// Copies a band of `rows` x `columns` 4-byte elements (a bit copy: any 4-byte dtype) and transposes
// it: element (i, j) is read at `src + j * src_column_stride + 4 * i` (each source column is `rows`
// consecutive elements) and written at `dst + i * dst_row_stride + 4 * j`. `rows` and `columns`
// must be multiples of kTransposeBlock. The source is read strip by strip, kTransposeBlock columns
// at a time, each strip from its first row to its last (long runs the prefetchers follow), through
// kTransposeBlock x kTransposeBlock blocks in vector registers; each block writes whole 64-byte
// destination lines. With `stream`, those lines go out with non-temporal stores, which requires
// `dst` and `dst_row_stride` to be multiples of 64, and the function fences before it returns.
// No other alignment is needed. nullptr on other architectures than x86-64; call only when
// BestConvertKernelLevel() reaches the level.
inline constexpr int64_t kTransposeBlock = 16;
using TransposeBandFn = void (*)(const std::byte* src, int64_t src_column_stride, std::byte* dst,
                                 int64_t dst_row_stride, int64_t rows, int64_t columns,
                                 bool stream);
TransposeBandFn Avx2TransposeBand4();
TransposeBandFn Avx512TransposeBand4();

// Copies `rows` rows of `count` elements of `size` bytes taken every other element: element i
// of row r is read at `src + r * src_row_stride + 2 * size * i` and written at
// `dst + r * dst_row_stride + size * i` (the rows of a `[::2]` slice). With `stream`, the
// destination's whole 64-byte lines go out with non-temporal stores (no alignment needed: the
// ends are stored plainly), fenced before returning. The level's function for `size`, or nullptr
// when the level has none for it (AVX2: 4 and 8; AVX-512: 2, 4 and 8) or on other architectures
// than x86-64.
using GatherEveryOtherFn = void (*)(const std::byte* src, int64_t src_row_stride, std::byte* dst,
                                    int64_t dst_row_stride, int64_t rows, int64_t count,
                                    bool stream);
GatherEveryOtherFn Avx2GatherEveryOther(int64_t size);
GatherEveryOtherFn Avx512GatherEveryOther(int64_t size);

}  // namespace ferry::convert_internal
