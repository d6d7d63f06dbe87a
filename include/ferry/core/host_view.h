// HostView / MutableHostView: a tensor in host memory seen through its real byte strides.
//
// A view does not own memory; whoever builds one guarantees that the memory stays valid while the
// view is used (ownership lives one layer up, in runtime/TensorSource). Views are plain values,
// cheap to copy, and safe to read from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/container/inlined_vector.h"
#include "absl/types/span.h"
#include "ferry/core/dtype.h"
#include "ferry/core/status.h"

namespace ferry {

using Dims = absl::InlinedVector<int64_t, 6>;

// Row-major (C order) byte strides for `dims` with elements of `element_size` bytes.
Dims RowMajorByteStrides(absl::Span<const int64_t> dims, int64_t element_size);

// Number of elements of `dims`, or InvalidArgument on a negative dim or int64 overflow.
StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> dims);

// The number of elements of `dims`, defined for any dims (a view not validated yet, a device
// buffer's shape): exact when it fits int64; 0 when a dim is 0 or negative, even where the others
// would overflow; INT64_MAX when the product overflows. Such a view then fails validation.
int64_t SaturatedNumElements(absl::Span<const int64_t> dims);

// a * b for a, b >= 0, INT64_MAX when the product overflows.
inline int64_t SaturatedProduct(int64_t a, int64_t b) {
  int64_t product;
  return __builtin_mul_overflow(a, b, &product) ? INT64_MAX : product;
}

// The bytes a view addresses, relative to its data pointer: [begin, end).
// An empty view (some dim is 0) addresses nothing: begin == end == 0.
struct AddressedBytes {
  int64_t begin = 0;
  int64_t end = 0;
};

template <typename Pointer>
struct BasicHostView {
  static_assert(std::is_same_v<Pointer, const void*> || std::is_same_v<Pointer, void*>);

  // Points at the element with all indices 0; with negative strides other elements lie below it.
  Pointer data = nullptr;
  DType dtype = DType::kF32;
  Dims dims;
  // One per dim, in bytes; any sign; 0 broadcasts along that dim.
  Dims byte_strides;
  // The elements are stored in the other byte order than the host's (a big-endian file on a
  // little-endian host): each element (each part of a complex) has its bytes reversed. Only
  // sources may be swapped: the copy-convert reverses them as it reads, in the same pass, so
  // such a view never takes a raw-memory path (memcpy, aliasing, a device's direct write).
  // Destinations (MutableHostView) are always native.
  bool byte_swapped = false;

  BasicHostView() = default;
  BasicHostView(Pointer data, DType dtype, Dims dims, Dims byte_strides)
      : data(data), dtype(dtype), dims(std::move(dims)), byte_strides(std::move(byte_strides)) {}
  // A mutable view converts to a read-only one.
  template <typename Other, typename = std::enable_if_t<std::is_same_v<Pointer, const void*> &&
                                                        std::is_same_v<Other, void*>>>
  BasicHostView(const BasicHostView<Other>& other)  // NOLINT(google-explicit-constructor)
      : data(other.data),
        dtype(other.dtype),
        dims(other.dims),
        byte_strides(other.byte_strides),
        byte_swapped(other.byte_swapped) {}

  // A dense row-major view of `dims` at `data`.
  static BasicHostView Dense(Pointer data, DType dtype, absl::Span<const int64_t> dims) {
    return BasicHostView(data, dtype, Dims(dims.begin(), dims.end()),
                         RowMajorByteStrides(dims, DTypeSize(dtype)));
  }

  int64_t rank() const { return static_cast<int64_t>(dims.size()); }
  int64_t element_size() const { return DTypeSize(dtype); }
  // Exact for a validated view; saturated for any other (SaturatedNumElements).
  int64_t num_elements() const { return SaturatedNumElements(dims); }
  // Bytes of the dense tensor with the same dims and dtype (saturated as num_elements is).
  int64_t dense_size_bytes() const { return SaturatedProduct(num_elements(), element_size()); }
  // True when the strides are exactly the row-major ones (size-1 dims may have any stride). False
  // for a view whose dense size overflows int64 (no memory holds it densely), so it is safe to ask
  // before validation.
  bool IsRowMajorDense() const;
  // True when the bytes in memory are the elements as the host reads them: not byte_swapped, or
  // a dtype without byte order (1-byte elements). Raw-memory paths need this.
  bool IsNativeByteOrder() const { return !byte_swapped || DTypeSize(dtype) == 1; }
  // True when no two elements share a byte, by the nested-strides rule: with the dims of size > 1
  // ordered by |stride|, each stride clears everything the smaller ones address. Sufficient, not
  // necessary: interleaved layouts whose elements are distinct (strides 2 and 3 elements over dims
  // 3 and 2) answer false too. Call on a validated view (ComputeAddressedBytes).
  bool ElementsAreDistinct() const;

  // Checks the view's own consistency: as many strides as dims, no negative dim, and the
  // addressed byte range computable without int64 overflow. Errors name `tensor_name`,
  // the dim and the stride.
  StatusOr<AddressedBytes> ComputeAddressedBytes(std::string_view tensor_name) const;

  // Validate() + every addressed byte lies inside [region_begin, region_begin + region_size).
  Status ValidateWithin(const void* region_begin, int64_t region_size,
                        std::string_view tensor_name) const;

  std::string DebugString() const;
};

using HostView = BasicHostView<const void*>;
using MutableHostView = BasicHostView<void*>;

extern template struct BasicHostView<const void*>;
extern template struct BasicHostView<void*>;

}  // namespace ferry
