#include "src/io/stored_tensor.h"

#include <utility>

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

StatusOr<TensorFileEntry> MakeTensorEntry(const StoredTensor& tensor, const std::byte* region_begin,
                                          int64_t region_size,
                                          std::shared_ptr<const void> keep_alive, bool zero_copy,
                                          int64_t file_offset, std::string_view file_name) {
  const int64_t element_size = DTypeSize(tensor.dtype);
  Dims strides = tensor.fortran_order ? ColumnMajorByteStrides(tensor.dims, element_size)
                                      : RowMajorByteStrides(tensor.dims, element_size);
  std::string source_name = fmt::format("{}:{}", file_name, tensor.name);

  TensorFileEntry entry;
  entry.name = tensor.name;
  HostView view(tensor.data, tensor.dtype, tensor.dims, std::move(strides));
  // Big-endian elements stay in the file as they are: the copy-convert reverses them as it reads.
  view.byte_swapped = tensor.big_endian;
  entry.byte_swapped = !view.IsNativeByteOrder();
  auto source = TensorSource::Borrow(view, region_begin, region_size, std::move(keep_alive),
                                     std::move(source_name));
  // The parsers checked the byte range already; a failure here is a bug, reported, not hidden.
  if (!source.ok()) return WithContext(source.status(), TensorContext(file_name, tensor.name));
  entry.source = std::move(source).value();
  entry.zero_copy = zero_copy;
  entry.file_offset = file_offset;
  return entry;
}

}  // namespace ferry::io_internal
