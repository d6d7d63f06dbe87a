#include "ferry/core/host_tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry {

std::byte* AllocateHostMemory(int64_t size_bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t size = static_cast<size_t>(std::max<int64_t>(size_bytes, 1));
  const size_t alignment = size >= kHugePage ? kHugePage : kHostAlignment;
  // aligned_alloc needs a size that is a multiple of the alignment.
  const size_t rounded = (size + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);
  if (memory != nullptr && alignment == kHugePage) {
    madvise(memory, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
  }
  return static_cast<std::byte*>(memory);
}

void FreeHostMemory(std::byte* memory) { std::free(memory); }

void HostTensor::AlignedFree::operator()(std::byte* p) const { FreeHostMemory(p); }

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
  std::byte* memory = AllocateHostMemory(size_bytes);
  if (memory == nullptr) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate {} bytes of host memory", size_bytes));
  }
  tensor.data_.reset(memory);
  return tensor;
}

}  // namespace ferry
