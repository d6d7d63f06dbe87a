#include "ferry/core/copy_convert.h"

#include <cstring>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry {

StatusOr<CopyConvertPlan> CopyConvertPlan::Create(const HostView& src, const MutableHostView& dst) {
  if (src.dims != dst.dims) {
    return InvalidArgumentError(fmt::format("copy from dims [{}] into dims [{}]: the dims differ",
                                            fmt::join(src.dims, ","), fmt::join(dst.dims, ",")));
  }
  if (src.byte_strides.size() != src.dims.size() || dst.byte_strides.size() != dst.dims.size()) {
    return InvalidArgumentError("copy-convert: every dim needs a byte stride");
  }
  FERRY_ASSIGN_OR_RETURN(ConvertKernel kernel, GetConvertKernel(src.dtype, dst.dtype));

  CopyConvertPlan plan;
  plan.src_ = static_cast<const std::byte*>(src.data);
  plan.dst_ = static_cast<std::byte*>(dst.data);
  plan.src_dtype_ = src.dtype;
  plan.dst_dtype_ = dst.dtype;
  plan.kernel_ = kernel;
  plan.num_elements_ = src.num_elements();

  // Drop size-1 dims (their strides never matter), then merge each dim into its inner neighbour
  // when both views step over it exactly as if the two were one dim.
  for (size_t i = 0; i < src.dims.size(); ++i) {
    if (src.dims[i] == 1) continue;
    const int64_t size = src.dims[i];
    if (!plan.dims_.empty() && plan.src_strides_.back() == src.byte_strides[i] * size &&
        plan.dst_strides_.back() == dst.byte_strides[i] * size) {
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
  plan.is_contiguous_ = plan.dims_.size() == 1 && plan.src_strides_[0] == DTypeSize(src.dtype) &&
                        plan.dst_strides_[0] == DTypeSize(dst.dtype);
  return plan;
}

void CopyConvertPlan::CopyElements(int64_t begin, int64_t end) const {
  if (begin >= end) return;
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

  int64_t remaining = end - begin;
  while (true) {
    const int64_t count = std::min(row - column, remaining);
    kernel_(src_ + src_row + column * src_step, src_step, dst_ + dst_row + column * dst_step,
            dst_step, count);
    remaining -= count;
    if (remaining == 0) return;
    column = 0;
    // Advance the odometer over the outer dims.
    for (size_t d = rank - 1; d-- > 0;) {
      src_row += src_strides_[d];
      dst_row += dst_strides_[d];
      if (++index[d] < dims_[d]) break;
      src_row -= dims_[d] * src_strides_[d];
      dst_row -= dims_[d] * dst_strides_[d];
      index[d] = 0;
    }
  }
}

Status CopyConvert(const HostView& src, const MutableHostView& dst) {
  FERRY_ASSIGN_OR_RETURN(CopyConvertPlan plan, CopyConvertPlan::Create(src, dst));
  plan.CopyAll();
  return OkStatus();
}

}  // namespace ferry
