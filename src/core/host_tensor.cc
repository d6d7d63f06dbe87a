#include "ferry/core/host_tensor.h"

#include <cstdlib>
#include <new>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry {

void HostTensor::AlignedFree::operator()(std::byte* p) const { std::free(p); }

StatusOr<HostTensor> HostTensor::Allocate(DType dtype, absl::Span<const int64_t> dims) {
  FERRY_ASSIGN_OR_RETURN(int64_t count, CheckedNumElements(dims));
  int64_t size_bytes;
  if (__builtin_mul_overflow(count, DTypeSize(dtype), &size_bytes)) {
    return InvalidArgumentError("host tensor size in bytes overflows int64");
  }
  HostTensor tensor;
  tensor.dtype_ = dtype;
  tensor.dims_.assign(dims.begin(), dims.end());
  tensor.size_bytes_ = size_bytes;
  // aligned_alloc needs a size that is a multiple of the alignment, and never 0.
  const size_t rounded =
      (static_cast<size_t>(size_bytes) + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
  void* memory = std::aligned_alloc(kHostAlignment, rounded == 0 ? kHostAlignment : rounded);
  if (memory == nullptr) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate {} bytes of host memory", size_bytes));
  }
  tensor.data_.reset(static_cast<std::byte*>(memory));
  return tensor;
}

}  // namespace ferry
