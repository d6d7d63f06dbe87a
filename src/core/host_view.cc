#include "ferry/core/host_view.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/container/inlined_vector.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry {

Dims RowMajorByteStrides(absl::Span<const int64_t> dims, int64_t element_size) {
  Dims strides(dims.size());
  int64_t stride = element_size;
  for (size_t i = dims.size(); i-- > 0;) {
    strides[i] = stride;
    // Saturate rather than overflow: such a view fails validation on its num_elements anyway.
    if (dims[i] > 0 && stride <= INT64_MAX / dims[i]) stride *= dims[i];
  }
  return strides;
}

StatusOr<int64_t> CheckedNumElements(absl::Span<const int64_t> dims) {
  int64_t count = 1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0) {
      return InvalidArgumentError(fmt::format("dim {} is negative ({})", i, dims[i]));
    }
    if (__builtin_mul_overflow(count, dims[i], &count)) {
      return InvalidArgumentError(fmt::format("the number of elements of dims [{}] overflows int64",
                                              fmt::join(dims, ", ")));
    }
  }
  return count;
}

int64_t SaturatedNumElements(absl::Span<const int64_t> dims) {
  for (int64_t dim : dims) {
    if (dim <= 0) return 0;
  }
  int64_t count = 1;
  for (int64_t dim : dims) {
    if (__builtin_mul_overflow(count, dim, &count)) return INT64_MAX;
  }
  return count;
}

template <typename Pointer>
bool BasicHostView<Pointer>::IsRowMajorDense() const {
  if (byte_strides.size() != dims.size()) return false;
  int64_t expected = element_size();
  for (size_t i = dims.size(); i-- > 0;) {
    if (dims[i] != 1 && byte_strides[i] != expected) return false;
    // An overflow means no dense memory holds the view (a zero-stride view of huge dims).
    if (__builtin_mul_overflow(expected, dims[i], &expected)) return false;
  }
  return true;
}

template <typename Pointer>
StatusOr<AddressedBytes> BasicHostView<Pointer>::ComputeAddressedBytes(
    std::string_view tensor_name) const {
  // A DType cast from an arbitrary integer is refused here, at every view's boundary, before
  // anything looks its size up.
  if (static_cast<int>(dtype) >= kNumDTypes) {
    return InvalidArgumentError(
        fmt::format("tensor '{}' has no valid dtype: value {} is none of ferry's {} dtypes",
                    tensor_name, static_cast<int>(dtype), kNumDTypes));
  }
  if (byte_strides.size() != dims.size()) {
    return InvalidArgumentError(fmt::format("tensor '{}' has {} dims but {} byte strides",
                                            tensor_name, dims.size(), byte_strides.size()));
  }
  auto count = CheckedNumElements(dims);
  if (!count.ok()) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': {}", tensor_name, std::string(count.status().message())));
  }
  int64_t size_bytes;
  if (__builtin_mul_overflow(*count, element_size(), &size_bytes)) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': its size in bytes overflows int64", tensor_name));
  }
  if (*count == 0) return AddressedBytes{};
  // The lowest and highest element offsets: each dim adds (dim - 1) * stride to one side.
  int64_t low = 0;
  int64_t high = 0;
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t span;
    if (__builtin_mul_overflow(dims[i] - 1, byte_strides[i], &span) ||
        __builtin_add_overflow(span > 0 ? high : low, span, span > 0 ? &high : &low)) {
      return InvalidArgumentError(fmt::format(
          "tensor '{}': dim {} (size {}, byte stride {}) addresses bytes beyond the int64 range",
          tensor_name, i, dims[i], byte_strides[i]));
    }
  }
  int64_t end;
  if (__builtin_add_overflow(high, element_size(), &end)) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': addressed bytes overflow int64", tensor_name));
  }
  return AddressedBytes{low, end};
}

template <typename Pointer>
bool BasicHostView<Pointer>::ElementsAreDistinct() const {
  if (SaturatedNumElements(dims) <= 1) return true;
  absl::InlinedVector<std::pair<uint64_t, int64_t>, 6> strided;  // |stride|, dim
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] <= 1) continue;
    const int64_t stride = byte_strides[i];
    const uint64_t magnitude =
        stride < 0 ? uint64_t{0} - static_cast<uint64_t>(stride) : static_cast<uint64_t>(stride);
    strided.emplace_back(magnitude, dims[i]);
  }
  std::sort(strided.begin(), strided.end());
  // `covered`: the bytes, from the lowest, that the dims already placed address (one element's).
  auto covered = static_cast<uint64_t>(element_size());
  for (const auto& [stride, dim] : strided) {
    if (stride < covered) return false;
    // A validated view's extent fits in int64, so this does not overflow.
    covered += stride * static_cast<uint64_t>(dim - 1);
  }
  return true;
}

template <typename Pointer>
Status BasicHostView<Pointer>::ValidateWithin(const void* region_begin, int64_t region_size,
                                              std::string_view tensor_name) const {
  FERRY_ASSIGN_OR_RETURN(AddressedBytes addressed, ComputeAddressedBytes(tensor_name));
  if (addressed.begin == addressed.end) return OkStatus();
  if (region_size < 0) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': memory region has a negative size", tensor_name));
  }
  const auto data_address = reinterpret_cast<uintptr_t>(data);
  const auto region_address = reinterpret_cast<uintptr_t>(region_begin);
  if (data == nullptr || data_address < region_address ||
      data_address - region_address > static_cast<uint64_t>(region_size)) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': data pointer lies outside its memory region of {} bytes",
                    tensor_name, region_size));
  }
  const int64_t offset = static_cast<int64_t>(data_address - region_address);
  // Name the dim responsible for leaving the region, for a useful message.
  auto blame = [&](bool below) {
    int64_t worst = -1;
    int64_t worst_span = 0;
    for (size_t i = 0; i < dims.size(); ++i) {
      const int64_t span = (dims[i] - 1) * byte_strides[i];
      if (below ? span < worst_span : span > worst_span) {
        worst = static_cast<int64_t>(i);
        worst_span = span;
      }
    }
    if (worst < 0) return std::string("its element size");
    return fmt::format("dim {} (size {}, byte stride {})", worst, dims[worst], byte_strides[worst]);
  };
  if (offset + addressed.begin < 0) {
    return InvalidArgumentError(fmt::format(
        "tensor '{}': {} reaches {} bytes before the start of its {}-byte memory region",
        tensor_name, blame(/*below=*/true), -(offset + addressed.begin), region_size));
  }
  if (addressed.end > region_size - offset) {
    return InvalidArgumentError(
        fmt::format("tensor '{}': {} reaches byte {} of its {}-byte memory region", tensor_name,
                    blame(/*below=*/false), offset + addressed.end, region_size));
  }
  return OkStatus();
}

template <typename Pointer>
std::string BasicHostView<Pointer>::DebugString() const {
  return fmt::format("{}[{}] byte_strides=[{}]{}", DTypeName(dtype), fmt::join(dims, ","),
                     fmt::join(byte_strides, ","), IsNativeByteOrder() ? "" : " byte_swapped");
}

template struct BasicHostView<const void*>;
template struct BasicHostView<void*>;

}  // namespace ferry
