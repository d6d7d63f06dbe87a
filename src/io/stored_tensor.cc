#include "src/io/stored_tensor.h"

#include <utility>

#include "absl/algorithm/container.h"
#include "ferry/runtime/tensor_source.h"
#include "fmt/format.h"
#include "src/io/file_error.h"

namespace ferry::io_internal {
namespace {

Dims ColumnMajorByteStrides(const Dims& dims, int64_t element_size) {
  Dims strides(dims.size());
  int64_t stride = element_size;
  for (size_t i = 0; i < dims.size(); ++i) {
    strides[i] = stride;
    // The byte count was checked against the file, so this cannot overflow for a non-empty
    // tensor; an empty one may have huge other dims, and any stride is valid for it.
    if (dims[i] > 0 && stride <= INT64_MAX / dims[i]) stride *= dims[i];
  }
  return strides;
}

}  // namespace

StatusOr<int64_t> CheckedTensorBytes(absl::Span<const int64_t> dims, int64_t element_size) {
  // numpy's PyArray_NewFromDescr: zero dims are skipped, every other dim multiplies the element
  // size with an overflow check, and a zero dim makes the size 0 only afterwards.
  const bool empty = absl::c_linear_search(dims, 0);
  int64_t nonzero_bytes = element_size;
  for (int64_t dim : dims) {
    if (dim < 0) return InvalidArgumentError(fmt::format("shape has a negative dim {}", dim));
    if (dim != 0 && __builtin_mul_overflow(nonzero_bytes, dim, &nonzero_bytes)) {
      return InvalidArgumentError(fmt::format(
          "{}{}-byte elements span more than 2^63 - 1 bytes (numpy refuses such a shape: \"array "
          "is too big\")",
          empty ? "even with its zero dims left out, its " : "its ", element_size));
    }
  }
  return empty ? 0 : nonzero_bytes;
}

StatusOr<TensorFileEntry> MakeTensorEntry(const StoredTensor& tensor, const std::byte* region_begin,
                                          int64_t region_size,
                                          std::shared_ptr<const void> keep_alive, bool zero_copy,
                                          int64_t file_offset, std::string_view file_name,
                                          const MappedFile* mapped_file) {
  const int64_t element_size = DTypeSize(tensor.dtype);
  Dims strides = tensor.fortran_order ? ColumnMajorByteStrides(tensor.dims, element_size)
                                      : RowMajorByteStrides(tensor.dims, element_size);
  // The source's name goes into every transfer error about it: escaped here, once, because the
  // tensor name came from the file and may hold terminal control characters.
  std::string source_name = fmt::format("{}:{}", EscapeForMessage(file_name, kQuotedPathLength),
                                        EscapeForMessage(tensor.name, kQuotedNameLength));

  TensorFileEntry entry;
  entry.name = tensor.name;
  HostView view(tensor.data, tensor.dtype, tensor.dims, std::move(strides));
  // Big-endian elements stay in the file as they are: the copy-convert reverses them as it reads.
  view.byte_swapped = tensor.big_endian;
  entry.byte_swapped = !view.IsNativeByteOrder();
  std::function<Status()> read_check;
  if (mapped_file != nullptr && mapped_file->is_mapped() && file_offset >= 0) {
    // The file outlives the source (keep_alive holds it), and the check runs on a live source.
    read_check = [mapped_file, file_offset, size = tensor.num_bytes] {
      return mapped_file->CheckRangeIntact(file_offset, size);
    };
  }
  auto source = TensorSource::Borrow(view, region_begin, region_size, std::move(keep_alive),
                                     std::move(source_name), std::move(read_check));
  // The parsers checked the byte range already; a failure here is a bug, reported, not hidden.
  if (!source.ok()) return WithContext(source.status(), TensorContext(file_name, tensor.name));
  entry.source = std::move(source).value();
  entry.zero_copy = zero_copy;
  entry.file_offset = file_offset;
  return entry;
}

}  // namespace ferry::io_internal
