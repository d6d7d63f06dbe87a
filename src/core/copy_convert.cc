#include "ferry/core/copy_convert.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "ferry/core/prefault.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/core/byte_swap.h"
#include "src/core/convert_simd.h"
#include "src/core/exact_denormals.h"

namespace ferry {

StatusOr<CopyConvertPlan> CopyConvertPlan::Create(const HostView& src, const MutableHostView& dst) {
  FERRY_ASSIGN_OR_RETURN(const ConvertKernelLevel level, ActiveConvertKernelLevel());
  return Create(src, dst, level);
}

StatusOr<CopyConvertPlan> CopyConvertPlan::Create(const HostView& src, const MutableHostView& dst,
                                                  ConvertKernelLevel level) {
  if (src.dims != dst.dims) {
    return InvalidArgumentError(fmt::format("copy from dims [{}] into dims [{}]: the dims differ",
                                            fmt::join(src.dims, ","), fmt::join(dst.dims, ",")));
  }
  if (src.byte_strides.size() != src.dims.size() || dst.byte_strides.size() != dst.dims.size()) {
    return InvalidArgumentError("copy-convert: every dim needs a byte stride");
  }
  if (!dst.IsNativeByteOrder()) {
    return InvalidArgumentError("copy-convert: the destination must be in the host's byte order");
  }
  // Every product of a dim and a stride below is then known to fit int64.
  FERRY_RETURN_IF_ERROR(src.ComputeAddressedBytes("copy-convert source").status());
  FERRY_RETURN_IF_ERROR(dst.ComputeAddressedBytes("copy-convert destination").status());
  FERRY_ASSIGN_OR_RETURN(ConvertKernel kernel, GetConvertKernel(src.dtype, dst.dtype, level));

  CopyConvertPlan plan;
  plan.src_ = static_cast<const std::byte*>(src.data);
  plan.dst_ = static_cast<std::byte*>(dst.data);
  plan.src_dtype_ = src.dtype;
  plan.dst_dtype_ = dst.dtype;
  plan.kernel_ = kernel;
  plan.num_elements_ = src.num_elements();
  plan.dst_dense_ = dst.IsRowMajorDense();
  if (!src.IsNativeByteOrder()) plan.swap_unit_ = ByteSwapUnit(src.dtype);

  // Drop size-1 dims (their strides never matter), then merge each dim into its inner neighbour
  // when both views step over it exactly as if the two were one dim.
  for (size_t i = 0; i < src.dims.size(); ++i) {
    if (src.dims[i] == 1) continue;
    const int64_t size = src.dims[i];
    // (dim - 1) * stride fits (validated above); dim * stride may not, and then cannot match.
    int64_t src_span = 0;
    int64_t dst_span = 0;
    const bool spans_fit = !__builtin_mul_overflow(src.byte_strides[i], size, &src_span) &&
                           !__builtin_mul_overflow(dst.byte_strides[i], size, &dst_span);
    if (!plan.dims_.empty() && spans_fit && plan.src_strides_.back() == src_span &&
        plan.dst_strides_.back() == dst_span) {
      plan.dims_.back() *= size;
      plan.src_strides_.back() = src.byte_strides[i];
      plan.dst_strides_.back() = dst.byte_strides[i];
      continue;
    }
    plan.dims_.push_back(size);
    plan.src_strides_.push_back(src.byte_strides[i]);
    plan.dst_strides_.push_back(dst.byte_strides[i]);
  }
  if (plan.dims_.empty()) {  // a scalar, or only size-1 dims
    plan.dims_.push_back(1);
    plan.src_strides_.push_back(DTypeSize(src.dtype));
    plan.dst_strides_.push_back(DTypeSize(dst.dtype));
  }
  plan.row_elements_ = plan.num_elements_ == 0 ? 1 : plan.dims_.back();
  // Tiles pay off when rows are read with a large source stride while the dim above them is
  // nearly contiguous in the source (a transpose): then group as many rows as share a cache line.
  const size_t rank = plan.dims_.size();
  if (rank >= 2) {
    const int64_t inner_stride = std::abs(plan.src_strides_[rank - 1]);
    const int64_t outer_stride = std::abs(plan.src_strides_[rank - 2]);
    if (inner_stride >= kCacheLineBytes && outer_stride < inner_stride &&
        outer_stride < kCacheLineBytes && outer_stride > 0) {
      plan.tile_rows_ = std::min<int64_t>(kCacheLineBytes / outer_stride, plan.dims_[rank - 2]);
    }
  }
  const int64_t element_size = DTypeSize(src.dtype);
  plan.stream_ = plan.num_elements_ * DTypeSize(dst.dtype) >= convert_internal::kStreamMinBytes;
  const bool plain_copy = src.dtype == dst.dtype && plan.swap_unit_ == 1;
  if (plain_copy && element_size == 4 && plan.tile_rows_ % convert_internal::kTransposeBlock == 0 &&
      plan.src_strides_[rank - 2] == 4 && plan.dst_strides_[rank - 1] == 4) {
    if (level >= ConvertKernelLevel::kAvx512) {
      plan.transpose_band_ = convert_internal::Avx512TransposeBand4();
    } else if (level >= ConvertKernelLevel::kAvx2) {
      plan.transpose_band_ = convert_internal::Avx2TransposeBand4();
    }
  }
  if (plain_copy && plan.src_strides_[rank - 1] == 2 * element_size &&
      plan.dst_strides_[rank - 1] == element_size) {
    if (level >= ConvertKernelLevel::kAvx512) {
      plan.gather_every_other_ = convert_internal::Avx512GatherEveryOther(element_size);
    } else if (level >= ConvertKernelLevel::kAvx2) {
      plan.gather_every_other_ = convert_internal::Avx2GatherEveryOther(element_size);
    }
  }
  plan.is_contiguous_ = plan.dims_.size() == 1 && plan.src_strides_[0] == DTypeSize(src.dtype) &&
                        plan.dst_strides_[0] == DTypeSize(dst.dtype) && plan.swap_unit_ == 1;
  return plan;
}

void CopyConvertPlan::CopyElements(int64_t begin, int64_t end) const {
  if (begin >= end) return;
  if (dst_dense_) {
    const int64_t element_size = DTypeSize(dst_dtype_);
    PrefaultForWriting(dst_ + begin * element_size, (end - begin) * element_size);
  }
  // Exact whatever the calling thread's mode (a plugin's thread may flush denormals).
  const internal::ScopedExactDenormals exact_denormals;
  const size_t rank = dims_.size();
  const int64_t row = dims_[rank - 1];
  const int64_t src_step = src_strides_[rank - 1];
  const int64_t dst_step = dst_strides_[rank - 1];

  // The multi-index of the row holding `begin`, and that row's start addresses.
  absl::InlinedVector<int64_t, 6> index(rank, 0);
  int64_t row_number = begin / row;
  int64_t column = begin % row;
  // Byte offsets from the data pointers (kept as integers: intermediate odometer positions may
  // point outside the tensor, which pointer arithmetic must never do).
  int64_t src_row = 0;
  int64_t dst_row = 0;
  for (size_t d = rank - 1; d-- > 0;) {
    index[d] = row_number % dims_[d];
    row_number /= dims_[d];
    src_row += index[d] * src_strides_[d];
    dst_row += index[d] * dst_strides_[d];
  }

  auto advance_row = [&] {  // the odometer over the outer dims
    for (size_t d = rank - 1; d-- > 0;) {
      src_row += src_strides_[d];
      dst_row += dst_strides_[d];
      if (++index[d] < dims_[d]) break;
      src_row -= dims_[d] * src_strides_[d];
      dst_row -= dims_[d] * dst_strides_[d];
      index[d] = 0;
    }
  };

  int64_t remaining = end - begin;
  while (true) {
    if (tile_rows_ > 1 && column == 0) {
      // As many whole tiles as the range holds before the tiled dim wraps around.
      const int64_t tiles = std::min(remaining / (tile_rows_ * row),
                                     (dims_[rank - 2] - index[rank - 2]) / tile_rows_);
      if (tiles > 0) {
        const int64_t rows = tiles * tile_rows_;
        CopyTiles(src_row, dst_row, rows);
        remaining -= rows * row;
        if (remaining == 0) return;
        for (int64_t i = 0; i < rows; ++i) advance_row();
        continue;
      }
    }
    if (gather_every_other_ != nullptr && column == 0 && rank >= 2 && remaining >= 2 * row) {
      // Whole rows of a [::2] slice, several at a time, as far as the dim above them goes.
      const int64_t rows = std::min(remaining / row, dims_[rank - 2] - index[rank - 2]);
      gather_every_other_(src_ + src_row, src_strides_[rank - 2], dst_ + dst_row,
                          dst_strides_[rank - 2], rows, row, stream_);
      remaining -= rows * row;
      if (remaining == 0) return;
      for (int64_t i = 0; i < rows; ++i) advance_row();
      continue;
    }
    const int64_t count = std::min(row - column, remaining);
    CopyRow(src_ + src_row + column * src_step, src_step, dst_ + dst_row + column * dst_step,
            dst_step, count);
    remaining -= count;
    if (remaining == 0) return;
    column = 0;
    advance_row();
  }
}

namespace {

// Gathers a `rows` x `columns` block of elements of kSize bytes, element (i, j) at
// `src + i * row_step + j * column_step`, into `block` (row-major, `kBlockColumns` per row).
// Reads go down the columns: with a small row_step each column is one run of the source.
template <int64_t kSize>
void GatherBlock(const std::byte* src, int64_t row_step, int64_t column_step, int64_t rows,
                 int64_t columns, std::byte* block, int64_t block_columns) {
  for (int64_t j = 0; j < columns; ++j) {
    const std::byte* column = src + j * column_step;
    for (int64_t i = 0; i < rows; ++i) {
      std::memcpy(block + (i * block_columns + j) * kSize, column + i * row_step, kSize);
    }
  }
}

using GatherBlockFn = void (*)(const std::byte*, int64_t, int64_t, int64_t, int64_t, std::byte*,
                               int64_t);

GatherBlockFn GatherBlockForSize(int64_t size) {
  switch (size) {
    case 1:
      return &GatherBlock<1>;
    case 2:
      return &GatherBlock<2>;
    case 4:
      return &GatherBlock<4>;
    case 8:
      return &GatherBlock<8>;
    default:
      return &GatherBlock<16>;
  }
}

}  // namespace

void CopyConvertPlan::CopyTiles(int64_t src_offset, int64_t dst_offset, int64_t rows) const {
  const size_t rank = dims_.size();
  const int64_t row = dims_[rank - 1];
  const int64_t src_step = src_strides_[rank - 1];
  const int64_t dst_row_step = dst_strides_[rank - 2];
  int64_t first_column = 0;
  if (transpose_band_ != nullptr) {
    // Whole blocks in vector registers; the columns left over go the tile way below.
    first_column = row / convert_internal::kTransposeBlock * convert_internal::kTransposeBlock;
    std::byte* dst = dst_ + dst_offset;
    const bool aligned = reinterpret_cast<uintptr_t>(dst) % kCacheLineBytes == 0 &&
                         dst_row_step % kCacheLineBytes == 0;
    transpose_band_(src_ + src_offset, src_step, dst, dst_row_step, rows, first_column,
                    stream_ && aligned);
    if (first_column == row) return;
  }
  const int64_t src_row_step = src_strides_[rank - 2];
  for (int64_t i = 0; i < rows; i += tile_rows_) {
    CopyTile(src_offset + i * src_row_step, dst_offset + i * dst_row_step, first_column);
  }
}

void CopyConvertPlan::CopyTile(int64_t src_offset, int64_t dst_offset, int64_t first_column) const {
  // tile_rows_ rows that lie next to each other in the source (their dim has a small source
  // stride: a transpose) are copied together, kTileColumns columns at a time: the block is first
  // gathered into a small buffer in L1 reading each source cache line once, down the columns,
  // then every row of the block is converted out of it as one dense run (the vector kernels),
  // so destination rows are written in whole runs too.
  const size_t rank = dims_.size();
  const int64_t row = dims_[rank - 1];
  const int64_t src_step = src_strides_[rank - 1];
  const int64_t dst_step = dst_strides_[rank - 1];
  const int64_t src_row_step = src_strides_[rank - 2];
  const int64_t dst_row_step = dst_strides_[rank - 2];
  if (src_dtype_ == dst_dtype_ && swap_unit_ == 1) {
    // A plain copy: the strided copy kernel straight from the source, row by row, kCopyTileColumns
    // columns at a time (measured faster here than gathering first: the gather only pays off when
    // a conversion kernel can then run dense).
    for (int64_t column = first_column; column < row; column += kCopyTileColumns) {
      const int64_t count = std::min(kCopyTileColumns, row - column);
      for (int64_t i = 0; i < tile_rows_; ++i) {
        kernel_(src_ + src_offset + i * src_row_step + column * src_step, src_step,
                dst_ + dst_offset + i * dst_row_step + column * dst_step, dst_step, count);
      }
    }
    return;
  }
  const int64_t element_size = DTypeSize(src_dtype_);
  // tile_rows_ <= kCacheLineBytes (1-byte elements); elements are at most 16 bytes.
  alignas(64) std::byte block[kCacheLineBytes * kTileColumns * 16];
  const GatherBlockFn gather = GatherBlockForSize(element_size);
  for (int64_t column = first_column; column < row; column += kTileColumns) {
    const int64_t count = std::min(kTileColumns, row - column);
    gather(src_ + src_offset + column * src_step, src_row_step, src_step, tile_rows_, count, block,
           kTileColumns);
    for (int64_t i = 0; i < tile_rows_; ++i) {
      CopyRun(block + i * kTileColumns * element_size, element_size,
              dst_ + dst_offset + i * dst_row_step + column * dst_step, dst_step, count);
    }
  }
}

void CopyConvertPlan::CopyRow(const std::byte* src, int64_t src_step, std::byte* dst,
                              int64_t dst_step, int64_t count) const {
  if (gather_every_other_ != nullptr) {  // Create checked the steps
    gather_every_other_(src, 0, dst, 0, 1, count, stream_);
    return;
  }
  CopyRun(src, src_step, dst, dst_step, count);
}

void CopyConvertPlan::CopyRun(const std::byte* src, int64_t src_step, std::byte* dst,
                              int64_t dst_step, int64_t count) const {
  if (swap_unit_ == 1) {
    kernel_(src, src_step, dst, dst_step, count);
    return;
  }
  // Reverse a block of elements into a buffer that stays in L1, then convert it from there.
  constexpr int64_t kBlockBytes = 4096;
  alignas(64) std::byte block[kBlockBytes];
  const int64_t element_size = DTypeSize(src_dtype_);
  const int64_t units_per_element = element_size / swap_unit_;
  const int64_t block_elements = kBlockBytes / element_size;
  for (int64_t done = 0; done < count; done += block_elements) {
    const int64_t n = std::min(block_elements, count - done);
    const std::byte* from = src + done * src_step;
    if (src_step == element_size) {
      ByteSwapCopy(from, block, n * units_per_element, swap_unit_);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        ByteSwapCopy(from + i * src_step, block + i * element_size, units_per_element, swap_unit_);
      }
    }
    kernel_(block, element_size, dst + done * dst_step, dst_step, n);
  }
}

Status CopyConvert(const HostView& src, const MutableHostView& dst) {
  FERRY_ASSIGN_OR_RETURN(CopyConvertPlan plan, CopyConvertPlan::Create(src, dst));
  plan.CopyAll();
  return OkStatus();
}

}  // namespace ferry
