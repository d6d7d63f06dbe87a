#include "old_copy.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <utility>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "fmt/format.h"

namespace ferry::bench {

void OldTemporary::Free::operator()(std::byte* memory) const { std::free(memory); }

StatusOr<OldTemporary> OldTemporary::Allocate(DType dtype, absl::Span<const int64_t> dims) {
  constexpr size_t kHugePage = size_t{2} << 20;
  OldTemporary temporary;
  const int64_t elements = HostView::Dense(nullptr, dtype, dims).num_elements();
  const auto bytes = static_cast<size_t>(elements * DTypeSize(dtype));
  const size_t alignment = bytes >= kHugePage ? kHugePage : 64;
  const size_t rounded = (std::max<size_t>(bytes, 1) + alignment - 1) / alignment * alignment;
  temporary.memory_.reset(static_cast<std::byte*>(std::aligned_alloc(alignment, rounded)));
  if (temporary.memory_ == nullptr) {
    return ResourceExhaustedError(fmt::format("no memory for a {}-byte temporary", bytes));
  }
  if (alignment == kHugePage) madvise(temporary.memory_.get(), rounded, MADV_HUGEPAGE);
  temporary.view_ = MutableHostView::Dense(temporary.memory_.get(), dtype, dims);
  temporary.bytes_ = static_cast<int64_t>(rounded);
  return temporary;
}

StatusOr<std::shared_ptr<const TensorSource>> OldTemporary::ToSource(OldTemporary temporary,
                                                                     std::string name) {
  const std::byte* begin = temporary.memory_.get();
  const int64_t size = temporary.bytes_;
  const HostView view = temporary.view_;
  auto owner = std::make_shared<OldTemporary>(std::move(temporary));
  return TensorSource::Borrow(view, begin, size, std::move(owner), std::move(name));
}

Status OldCopyConvert(const HostView& src, const MutableHostView& dst) {
  FERRY_ASSIGN_OR_RETURN(ConvertKernel kernel,
                         GetConvertKernel(src.dtype, dst.dtype, ConvertKernelLevel::kPortable));
  const int64_t elements = src.num_elements();
  if (elements == 0) return OkStatus();
  const size_t rank = src.dims.size();
  if (rank == 0) {
    kernel(static_cast<const std::byte*>(src.data), 0, static_cast<std::byte*>(dst.data), 0, 1);
    return OkStatus();
  }
  const int64_t row = src.dims[rank - 1];
  std::vector<int64_t> index(rank, 0);
  int64_t src_offset = 0, dst_offset = 0;
  for (int64_t done = 0; done < elements; done += row) {
    kernel(static_cast<const std::byte*>(src.data) + src_offset, src.byte_strides[rank - 1],
           static_cast<std::byte*>(dst.data) + dst_offset, dst.byte_strides[rank - 1], row);
    for (size_t d = rank - 1; d-- > 0;) {  // the odometer over the outer dims
      src_offset += src.byte_strides[d];
      dst_offset += dst.byte_strides[d];
      if (++index[d] < src.dims[d]) break;
      src_offset -= src.dims[d] * src.byte_strides[d];
      dst_offset -= src.dims[d] * dst.byte_strides[d];
      index[d] = 0;
    }
  }
  return OkStatus();
}

}  // namespace ferry::bench
