// The row loops shared by the vectorised kernel levels (convert_avx2.cc, convert_avx512.cc). A
// level's file defines an `Isa` struct converting one block of `Isa::kLanes` elements between
// memory and f32 lanes, then includes this file, which turns it into dense and strided row kernels
// for the twelve pairs among f16, bf16, f32 and f64.
//
// Everything here has internal linkage on purpose: the two files are compiled with different
// instruction-set flags, and an inline function with external linkage compiled in both would be
// merged by the linker into one copy, possibly the AVX-512 one, which the AVX2 level would then run
// on a CPU without AVX-512. For the same reason these files use no standard-library templates
// that could be emitted out of line (std::min, containers) and include no ferry or abseil header
// (convert_simd.h): only memcpy and intrinsics.
//
// An Isa provides, with `Lanes` holding kLanes f32 values:
//   static Lanes LoadF16(const std::byte*), LoadBF16, LoadF32  -- exact, NaNs made quiet
//   static Lanes LoadF64(const std::byte*)            -- f64 rounded to nearest even (f64 -> f32)
//   static Lanes LoadF64RoundToOdd(const std::byte*)  -- f64 rounded to odd (f64 -> f16/bf16)
//   static void StoreF16(std::byte*, Lanes), StoreBF16, StoreF32, StoreF64
//   static void StreamLine(std::byte* dst, const std::byte* src)  -- one 64-byte line, dst
//       64-byte aligned, with non-temporal stores
//   static void FenceStreams()                        -- orders the streamed lines (sfence)
// Each conversion must give exactly what the scalar reference in convert.cc gives, lane by lane.
//
// The same-dtype loops at the end (transposed bands, every-other-element rows) take their own
// small per-level structs, described where they are used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "src/core/convert_simd.h"

namespace ferry::convert_internal {
namespace {

template <SimdFloat F>
constexpr int64_t kFloatSize = F == SimdFloat::kF64   ? 8
                               : F == SimdFloat::kF32 ? 4
                                                      : 2;

template <typename Isa, SimdFloat From, SimdFloat To>
inline typename Isa::Lanes LoadLanes(const std::byte* src) {
  if constexpr (From == SimdFloat::kF16) {
    return Isa::LoadF16(src);
  } else if constexpr (From == SimdFloat::kBF16) {
    return Isa::LoadBF16(src);
  } else if constexpr (From == SimdFloat::kF32) {
    return Isa::LoadF32(src);
  } else if constexpr (To == SimdFloat::kF32) {
    return Isa::LoadF64(src);
  } else {
    // To a 16-bit format: rounding to odd first keeps the one rounding to nearest even exact,
    // as in the scalar F64ToBF16Bits and F64ToF16Bits.
    return Isa::LoadF64RoundToOdd(src);
  }
}

template <typename Isa, SimdFloat To>
inline void StoreLanes(std::byte* dst, typename Isa::Lanes lanes) {
  if constexpr (To == SimdFloat::kF16) {
    Isa::StoreF16(dst, lanes);
  } else if constexpr (To == SimdFloat::kBF16) {
    Isa::StoreBF16(dst, lanes);
  } else if constexpr (To == SimdFloat::kF32) {
    Isa::StoreF32(dst, lanes);
  } else {
    Isa::StoreF64(dst, lanes);
  }
}

template <typename Isa, SimdFloat From, SimdFloat To>
inline void ConvertBlock(const std::byte* src, std::byte* dst) {
  StoreLanes<Isa, To>(dst, LoadLanes<Isa, From, To>(src));
}

// `count` elements, both sides dense. Whole blocks in place; the last partial block through local
// buffers, so that every element takes the same vector path.
template <typename Isa, SimdFloat From, SimdFloat To>
void ConvertDenseCached(const std::byte* src, std::byte* dst, int64_t count) {
  constexpr int64_t kLanes = Isa::kLanes;
  constexpr int64_t kSourceSize = kFloatSize<From>;
  constexpr int64_t kTargetSize = kFloatSize<To>;
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    ConvertBlock<Isa, From, To>(src + i * kSourceSize, dst + i * kTargetSize);
  }
  if (i < count) {
    const auto rest = static_cast<size_t>(count - i);
    alignas(64) std::byte source[kLanes * kSourceSize] = {};  // zeros in the unused lanes
    alignas(64) std::byte target[kLanes * kTargetSize];
    std::memcpy(source, src + i * kSourceSize, rest * kSourceSize);
    ConvertBlock<Isa, From, To>(source, target);
    std::memcpy(dst + i * kTargetSize, target, rest * kTargetSize);
  }
}

// The same results; long rows are converted a group of blocks at a time into a line-sized buffer
// in L1 and streamed out from there (the same vector conversion, only the stores differ).
template <typename Isa, SimdFloat From, SimdFloat To>
void ConvertDense(const std::byte* src, std::byte* dst, int64_t count) {
  constexpr int64_t kSourceSize = kFloatSize<From>;
  constexpr int64_t kTargetSize = kFloatSize<To>;
  const auto address = reinterpret_cast<uintptr_t>(dst);
  if (count * kTargetSize < kStreamMinBytes || address % kTargetSize != 0) {
    ConvertDenseCached<Isa, From, To>(src, dst, count);
    return;
  }
  // Whole elements up to the first 64-byte boundary, cached.
  const int64_t head = static_cast<int64_t>((64 - address % 64) % 64) / kTargetSize;
  ConvertDenseCached<Isa, From, To>(src, dst, head);
  src += head * kSourceSize;
  dst += head * kTargetSize;
  count -= head;
  constexpr int64_t kBlockBytes = Isa::kLanes * kTargetSize;
  constexpr int64_t kGroupBytes = kBlockBytes >= 64 ? kBlockBytes : 64;
  constexpr int64_t kBlocksPerGroup = kGroupBytes / kBlockBytes;
  constexpr int64_t kGroupElements = kBlocksPerGroup * Isa::kLanes;
  alignas(64) std::byte group[kGroupBytes];
  int64_t i = 0;
  for (; i + kGroupElements <= count; i += kGroupElements) {
    for (int64_t b = 0; b < kBlocksPerGroup; ++b) {
      ConvertBlock<Isa, From, To>(src + (i + b * Isa::kLanes) * kSourceSize,
                                  group + b * kBlockBytes);
    }
    for (int64_t line = 0; line < kGroupBytes; line += 64) {
      Isa::StreamLine(dst + i * kTargetSize + line, group + line);
    }
  }
  Isa::FenceStreams();
  ConvertDenseCached<Isa, From, To>(src + i * kSourceSize, dst + i * kTargetSize, count - i);
}

// The ConvertKernel contract (convert.h): any strides; a count <= 0 touches nothing.
template <typename Isa, SimdFloat From, SimdFloat To>
void ConvertRow(const std::byte* src, int64_t src_stride_bytes, std::byte* dst,
                int64_t dst_stride_bytes, int64_t count) {
  constexpr int64_t kSourceSize = kFloatSize<From>;
  constexpr int64_t kTargetSize = kFloatSize<To>;
  if (count <= 0) return;
  if (src_stride_bytes == kSourceSize && dst_stride_bytes == kTargetSize) {
    ConvertDense<Isa, From, To>(src, dst, count);
    return;
  }
  // Strided: gather a batch into a dense buffer, convert it, scatter the results in order (so
  // that with a zero destination stride the last element still wins).
  constexpr int64_t kBatch = 4 * Isa::kLanes;
  alignas(64) std::byte source[kBatch * kSourceSize];
  alignas(64) std::byte target[kBatch * kTargetSize];
  for (int64_t begin = 0; begin < count; begin += kBatch) {
    const int64_t size = count - begin < kBatch ? count - begin : kBatch;
    for (int64_t j = 0; j < size; ++j) {
      std::memcpy(source + j * kSourceSize, src + (begin + j) * src_stride_bytes, kSourceSize);
    }
    ConvertDense<Isa, From, To>(source, target, size);
    for (int64_t j = 0; j < size; ++j) {
      std::memcpy(dst + (begin + j) * dst_stride_bytes, target + j * kTargetSize, kTargetSize);
    }
  }
}

template <typename Isa, SimdFloat From, SimdFloat To>
constexpr SimdRowKernel RowKernel() {
  if constexpr (From == To) {
    return nullptr;  // same-dtype copies are not conversions
  } else {
    return &ConvertRow<Isa, From, To>;
  }
}

template <typename Isa, SimdFloat From>
SimdRowKernel RowKernelTo(SimdFloat to) {
  switch (to) {
    case SimdFloat::kF16:
      return RowKernel<Isa, From, SimdFloat::kF16>();
    case SimdFloat::kBF16:
      return RowKernel<Isa, From, SimdFloat::kBF16>();
    case SimdFloat::kF32:
      return RowKernel<Isa, From, SimdFloat::kF32>();
    case SimdFloat::kF64:
      return RowKernel<Isa, From, SimdFloat::kF64>();
  }
  return nullptr;
}

// The Isa's kernel for a pair among f16, bf16, f32 and f64; nullptr for the same format twice.
template <typename Isa>
SimdRowKernel KernelFor(SimdFloat from, SimdFloat to) {
  switch (from) {
    case SimdFloat::kF16:
      return RowKernelTo<Isa, SimdFloat::kF16>(to);
    case SimdFloat::kBF16:
      return RowKernelTo<Isa, SimdFloat::kBF16>(to);
    case SimdFloat::kF32:
      return RowKernelTo<Isa, SimdFloat::kF32>(to);
    case SimdFloat::kF64:
      return RowKernelTo<Isa, SimdFloat::kF64>(to);
  }
  return nullptr;
}

// TransposeBandFn (convert_simd.h) around a level's `Block::Transpose<kStream>(src,
// src_column_stride, dst, dst_row_stride)`, which transposes one kTransposeBlock-square block.
// Strip by strip of the source: the blocks of one strip go down its rows, so the strip's
// kTransposeBlock columns are read as that many long sequential runs.
template <typename Block, bool kStream>
void TransposeBandLoop(const std::byte* src, int64_t src_column_stride, std::byte* dst,
                       int64_t dst_row_stride, int64_t rows, int64_t columns) {
  for (int64_t j = 0; j < columns; j += kTransposeBlock) {
    for (int64_t i = 0; i < rows; i += kTransposeBlock) {
      Block::template Transpose<kStream>(src + j * src_column_stride + 4 * i, src_column_stride,
                                         dst + i * dst_row_stride + 4 * j, dst_row_stride);
    }
  }
}

template <typename Block>
void TransposeBand(const std::byte* src, int64_t src_column_stride, std::byte* dst,
                   int64_t dst_row_stride, int64_t rows, int64_t columns, bool stream) {
  if (stream) {
    TransposeBandLoop<Block, true>(src, src_column_stride, dst, dst_row_stride, rows, columns);
    Block::FenceStreams();
  } else {
    TransposeBandLoop<Block, false>(src, src_column_stride, dst, dst_row_stride, rows, columns);
  }
}

// GatherEveryOtherFn (convert_simd.h) around a level's `Gather::Step<kStream>(src, dst)`, which
// writes Gather::kStepBytes (a divisor of 64) of destination from twice that of source, and
// Gather::kSize, the element size. kRows rows at once, interleaved step by step (several read
// streams per core keep more lines in flight than one); their destinations must lie at the same
// offset from a 64-byte boundary. Streamed from that boundary on; the ends, and a destination not
// aligned to the element size, are copied element by element.
template <typename Gather, int64_t kRows>
void GatherEveryOtherLines(const std::byte* const* src, std::byte* const* dst, int64_t count,
                           bool stream) {
  constexpr int64_t kSize = Gather::kSize;
  constexpr int64_t kStepElements = Gather::kStepBytes / kSize;
  constexpr int64_t kLineElements = 64 / kSize;
  const auto address = reinterpret_cast<uintptr_t>(dst[0]);
  int64_t i = 0;
  auto copy_elements = [&](int64_t end) {
    for (int64_t r = 0; r < kRows; ++r) {
      for (int64_t e = i; e < end; ++e)
        std::memcpy(dst[r] + e * kSize, src[r] + 2 * e * kSize, kSize);
    }
    i = end;
  };
  if (stream && address % kSize == 0) {
    const auto head = static_cast<int64_t>((64 - address % 64) % 64) / kSize;
    if (head + kLineElements <= count) {
      copy_elements(head);
      for (; i + kLineElements <= count; i += kLineElements) {
        for (int64_t step = 0; step < kLineElements; step += kStepElements) {
          for (int64_t r = 0; r < kRows; ++r) {
            Gather::template Step<true>(src[r] + 2 * (i + step) * kSize,
                                        dst[r] + (i + step) * kSize);
          }
        }
      }
      Gather::FenceStreams();
    }
  }
  for (; i + kStepElements <= count; i += kStepElements) {
    for (int64_t r = 0; r < kRows; ++r) {
      Gather::template Step<false>(src[r] + 2 * i * kSize, dst[r] + i * kSize);
    }
  }
  copy_elements(count);
}

// kRows rows from row `r` on, as long as kRows of them are left.
template <typename Gather, int64_t kRows>
void GatherEveryOtherRowGroups(const std::byte* src, int64_t src_row_stride, std::byte* dst,
                               int64_t dst_row_stride, int64_t rows, int64_t count, bool stream,
                               int64_t& r) {
  for (; r + kRows <= rows; r += kRows) {
    const std::byte* sources[kRows];
    std::byte* destinations[kRows];
    for (int64_t k = 0; k < kRows; ++k) {
      sources[k] = src + (r + k) * src_row_stride;
      destinations[k] = dst + (r + k) * dst_row_stride;
    }
    GatherEveryOtherLines<Gather, kRows>(sources, destinations, count, stream);
  }
}

// Four rows at a time when their destinations share their offset from a 64-byte boundary (four
// read streams per core were 7-15% faster than two on the [::2, ::2] case here, software
// prefetch slower), then one by one.
template <typename Gather>
void GatherEveryOther(const std::byte* src, int64_t src_row_stride, std::byte* dst,
                      int64_t dst_row_stride, int64_t rows, int64_t count, bool stream) {
  int64_t r = 0;
  if (dst_row_stride % 64 == 0) {
    GatherEveryOtherRowGroups<Gather, 4>(src, src_row_stride, dst, dst_row_stride, rows, count,
                                         stream, r);
  }
  GatherEveryOtherRowGroups<Gather, 1>(src, src_row_stride, dst, dst_row_stride, rows, count,
                                       stream, r);
}

}  // namespace
}  // namespace ferry::convert_internal
