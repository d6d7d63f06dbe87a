#include "src/io/row_major_chunks.h"

#include <algorithm>
#include <memory>
#include <new>

#include "ferry/core/copy_convert.h"
#include "fmt/format.h"

namespace ferry::io_internal {

Status ForEachRowMajorChunk(const HostView& view, int64_t max_chunk_bytes,
                            absl::FunctionRef<Status(const std::byte*, int64_t)> consume) {
  FERRY_RETURN_IF_ERROR(view.ComputeAddressedBytes("tensor").status());
  const int64_t element_size = view.element_size();
  const int64_t total_bytes = view.dense_size_bytes();
  if (total_bytes == 0) return OkStatus();
  // Whole elements per chunk, at least one.
  max_chunk_bytes = std::max(max_chunk_bytes / element_size, int64_t{1}) * element_size;
  const auto* base = static_cast<const std::byte*>(view.data);

  if (view.IsRowMajorDense() && view.IsNativeByteOrder()) {
    for (int64_t offset = 0; offset < total_bytes; offset += max_chunk_bytes) {
      FERRY_RETURN_IF_ERROR(
          consume(base + offset, std::min(max_chunk_bytes, total_bytes - offset)));
    }
    return OkStatus();
  }

  // Blocks: the longest suffix of dims that fits a chunk, dims[suffix:], preceded by a piece of
  // dim `suffix - 1` as long as still fits. Each block is a strided sub-view that the fused copy
  // writes densely into the buffer; blocks come in row-major order, so they are appended until
  // the next one would not fit.
  const int64_t rank = view.rank();
  int64_t suffix = rank;
  int64_t suffix_bytes = element_size;
  while (suffix > 0 && view.dims[suffix - 1] <= max_chunk_bytes / suffix_bytes) {
    suffix_bytes *= view.dims[suffix - 1];
    --suffix;
  }
  const int64_t buffer_size = std::min(max_chunk_bytes, total_bytes);
  std::unique_ptr<std::byte[]> buffer(new (std::nothrow) std::byte[buffer_size]);
  if (buffer == nullptr) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate a {}-byte write buffer", buffer_size));
  }
  if (suffix == 0) {  // the whole tensor fits one chunk
    FERRY_RETURN_IF_ERROR(
        CopyConvert(view, MutableHostView::Dense(buffer.get(), view.dtype, view.dims)));
    return consume(buffer.get(), total_bytes);
  }

  const int64_t split = suffix - 1;  // the dim cut into pieces
  const int64_t split_dim = view.dims[split];
  const int64_t piece = max_chunk_bytes / suffix_bytes;  // >= 1, and < split_dim
  Dims block_dims(view.dims.begin() + split, view.dims.end());
  Dims block_strides(view.byte_strides.begin() + split, view.byte_strides.end());
  Dims outer_index(static_cast<size_t>(split), 0);  // odometer over dims[:split]
  int64_t fill = 0;
  while (true) {
    int64_t outer_offset = 0;
    for (int64_t i = 0; i < split; ++i) outer_offset += outer_index[i] * view.byte_strides[i];
    for (int64_t start = 0; start < split_dim; start += piece) {
      block_dims[0] = std::min(piece, split_dim - start);
      const int64_t block_bytes = block_dims[0] * suffix_bytes;
      if (fill + block_bytes > buffer_size) {
        FERRY_RETURN_IF_ERROR(consume(buffer.get(), fill));
        fill = 0;
      }
      const HostView block(base + outer_offset + start * view.byte_strides[split], view.dtype,
                           block_dims, block_strides);
      FERRY_RETURN_IF_ERROR(
          CopyConvert(block, MutableHostView::Dense(buffer.get() + fill, view.dtype, block_dims)));
      fill += block_bytes;
    }
    // Next outer index; done when the odometer wraps around.
    int64_t dim = split - 1;
    while (dim >= 0 && ++outer_index[dim] == view.dims[dim]) outer_index[dim--] = 0;
    if (dim < 0) break;
  }
  if (fill > 0) FERRY_RETURN_IF_ERROR(consume(buffer.get(), fill));
  return OkStatus();
}

}  // namespace ferry::io_internal
