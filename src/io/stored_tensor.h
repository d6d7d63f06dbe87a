// StoredTensor: how one tensor's bytes lie in a file, and the TensorFileEntry that reads them.
// Shared by the three format parsers, so that zero-copy borrowing, Fortran strides and big-endian
// swapping are done in one place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/dtype.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"
#include "ferry/io/mapped_file.h"
#include "ferry/io/tensor_file.h"

namespace ferry::io_internal {

struct StoredTensor {
  std::string name;
  DType dtype = DType::kF32;
  Dims dims;
  // Column-major element order (.npy fortran_order): the view gets column-major byte strides.
  bool fortran_order = false;
  // The bytes of each element (each part, for complex) are big-endian.
  bool big_endian = false;
  // The tensor's bytes: dims' product times the element size, already checked to lie inside the
  // region that `keep_alive` keeps valid.
  const std::byte* data = nullptr;
  int64_t num_bytes = 0;
};

// The bytes a tensor of `dims` with `element_size`-byte elements holds, under numpy's rule for
// what a shape may be, which every format follows: the product of the non-zero dims times the
// element size fits int64 even when another dim is zero. numpy refuses a larger shape ("array is
// too big"), so no reader of the file could hold it as an array, and its row-major byte strides
// would not fit int64 either. Otherwise InvalidArgument saying so, without context or shape; the
// caller adds them.
StatusOr<int64_t> CheckedTensorBytes(absl::Span<const int64_t> dims, int64_t element_size);

// Makes the entry for `tensor`, whose bytes lie inside [region_begin, region_begin + region_size)
// and stay valid while `keep_alive` lives. The data is borrowed (the source holds `keep_alive`),
// big-endian data too: its view is marked byte_swapped and the copy-convert reverses the bytes
// as it reads them. `zero_copy`
// says whether the region is the mapped file itself (false for decompressed members), and
// `file_offset` where the bytes lie in the file (-1 when they do not). `file_name` is used in
// the source's name and in errors. `mapped_file`, when the region is that file's mapping (and
// `keep_alive` holds it): the source's CheckRead answers DataLoss when the file was truncated
// under the tensor's bytes (a transfer that read them got zeros).
StatusOr<TensorFileEntry> MakeTensorEntry(const StoredTensor& tensor, const std::byte* region_begin,
                                          int64_t region_size,
                                          std::shared_ptr<const void> keep_alive, bool zero_copy,
                                          int64_t file_offset, std::string_view file_name,
                                          const MappedFile* mapped_file = nullptr);

// What each format parser returns to ParseTensorFile.
struct ParsedTensors {
  std::vector<TensorFileEntry> tensors;
  std::map<std::string, std::string> metadata;
  // The bytes that hold tensor data, for Prefetch.
  int64_t data_begin = 0;
  int64_t data_end = 0;
};

}  // namespace ferry::io_internal
