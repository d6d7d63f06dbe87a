// The fused strided copy-convert: reads any HostView once, converts each element on the way and
// writes any MutableHostView, in a single pass with no intermediate buffer.
//
// A CopyConvertPlan is made once per transfer and then run in pieces: `CopyElements(begin, end)`
// copies the elements with row-major (logical) indices in [begin, end), so callers can split a
// transfer into chunks, pipeline them and run disjoint chunks on different threads at once.
#pragma once

#include <cstdint>

#include "absl/container/inlined_vector.h"
#include "ferry/core/convert.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"

namespace ferry {

class CopyConvertPlan {
 public:
  // An empty plan (no elements); assign a created one to use it.
  CopyConvertPlan() = default;

  // Validates that `src` and `dst` have the same dims and that src.dtype converts to dst.dtype
  // (CheckConvertible). A byte-swapped `src` is reversed on the way, in the same pass; `dst`
  // must be native (InvalidArgument otherwise). Both views must already be valid against their
  // memory; the plan keeps only their pointers, so that memory must outlive every Copy call. Dims
  // that are contiguous together in both views are collapsed and size-1 dims dropped before the
  // loop is chosen.
  static StatusOr<CopyConvertPlan> Create(const HostView& src, const MutableHostView& dst);
  // The same with the kernels of a chosen level instead of ActiveConvertKernelLevel() (tests and
  // benchmarks): FailedPrecondition for a level above BestConvertKernelLevel().
  static StatusOr<CopyConvertPlan> Create(const HostView& src, const MutableHostView& dst,
                                          ConvertKernelLevel level);

  int64_t num_elements() const { return num_elements_; }
  // Elements in one innermost row of the collapsed loop (a chunk boundary that is a multiple of
  // this keeps whole rows together).
  int64_t row_elements() const { return row_elements_; }
  // True when both sides are dense and the copy is one contiguous run.
  bool is_contiguous() const { return is_contiguous_; }
  bool is_conversion() const { return src_dtype_ != dst_dtype_; }
  DType src_dtype() const { return src_dtype_; }
  DType dst_dtype() const { return dst_dtype_; }

  // Copies the elements whose row-major indices lie in [begin, end). Thread-safe for
  // disjoint ranges. Requires 0 <= begin <= end <= num_elements(). When the destination is
  // row-major dense, the range's destination bytes not yet resident in memory are first faulted
  // in (PrefaultForWriting: nothing for a range under 256 KiB or memory written before).
  void CopyElements(int64_t begin, int64_t end) const;
  void CopyAll() const { CopyElements(0, num_elements_); }

 private:
  static constexpr int64_t kCacheLineBytes = 64;
  static constexpr int64_t kTileColumns = 16;     // converting tiles (gathered first)
  static constexpr int64_t kCopyTileColumns = 8;  // same-dtype tiles (strided copy)

  // Copies `rows` whole rows (a multiple of tile_rows_) starting at these byte offsets: a
  // transposed band where the level has one, the columns it leaves through CopyTile.
  void CopyTiles(int64_t src_offset, int64_t dst_offset, int64_t rows) const;
  // Copies tile_rows_ whole rows starting at these byte offsets, from column `first_column` on,
  // column block by column block.
  void CopyTile(int64_t src_offset, int64_t dst_offset, int64_t first_column) const;
  // One innermost run: the every-other-element gather where it applies, else CopyRun.
  void CopyRow(const std::byte* src, int64_t src_step, std::byte* dst, int64_t dst_step,
               int64_t count) const;
  // The kernel over `count` elements; for a byte-swapped source, block by block through a small
  // buffer in which each block is first reversed.
  void CopyRun(const std::byte* src, int64_t src_step, std::byte* dst, int64_t dst_step,
               int64_t count) const;

  const std::byte* src_ = nullptr;
  std::byte* dst_ = nullptr;
  DType src_dtype_ = DType::kF32;
  DType dst_dtype_ = DType::kF32;
  ConvertKernel kernel_ = nullptr;
  int64_t num_elements_ = 0;
  int64_t row_elements_ = 1;
  bool is_contiguous_ = false;
  int64_t tile_rows_ = 1;  // > 1: rows are copied in tiles of this many (see CopyTile)
  int64_t swap_unit_ = 1;  // > 1: the source is byte-swapped in units of this many bytes
  // The destination is row-major dense: elements [begin, end) write exactly the bytes from
  // dst_ + begin * element size to dst_ + end * element size.
  bool dst_dense_ = false;
  // Destination lines go out with non-temporal stores where a same-dtype vector path writes whole
  // ones: the destination is at least kStreamMinBytes (convert_simd.h) in all.
  bool stream_ = false;
  // A vector transpose of bands of 4-byte elements for same-dtype tiles whose rows are contiguous
  // in the source and whose columns are contiguous in the destination; null when the level has
  // none or the views do not fit.
  void (*transpose_band_)(const std::byte*, int64_t, std::byte*, int64_t, int64_t, int64_t,
                          bool) = nullptr;
  // A vector gather for same-dtype rows read every other element (a [::2] slice) into dense
  // destination rows; null when the level has none or the views do not fit.
  void (*gather_every_other_)(const std::byte*, int64_t, std::byte*, int64_t, int64_t, int64_t,
                              bool) = nullptr;
  // Collapsed loop, outermost first; the last entry is the innermost (row) dim.
  absl::InlinedVector<int64_t, 6> dims_;
  absl::InlinedVector<int64_t, 6> src_strides_;
  absl::InlinedVector<int64_t, 6> dst_strides_;
};

// Plans and runs the whole copy on the calling thread.
Status CopyConvert(const HostView& src, const MutableHostView& dst);

}  // namespace ferry
