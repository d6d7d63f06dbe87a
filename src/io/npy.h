// The .npy format (numpy lib/format.py, NEP 1): reader rules in docs/files.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/types/span.h"
#include "ferry/core/dtype.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"
#include "ferry/io/mapped_file.h"
#include "src/io/stored_tensor.h"

namespace ferry::io_internal {

// The header dict, as written: {'descr': ..., 'fortran_order': ..., 'shape': (...), }.
struct NpyHeaderDict {
  std::string descr;
  bool fortran_order = false;
  Dims shape;
};

// Parses the header text (without magic, version and length) strictly: a Python dict literal with
// exactly the keys 'descr' (a string), 'fortran_order' (True or False) and 'shape' (a tuple of
// non-negative ints), in any order, with optional trailing commas, surrounded by whitespace.
// Structured (list) descrs are refused with a message saying so. With `python2_long_suffixes`
// (numpy allows them in version 1.0 and 2.0 headers), a shape dim may end in Python 2's long
// suffix, `(3L, 6L)`. Error messages carry no file context; the caller adds it.
StatusOr<NpyHeaderDict> ParseNpyHeaderDict(std::string_view text, bool python2_long_suffixes);

// A parsed and validated .npy: where its data lies and how to read it.
struct NpyArray {
  DType dtype = DType::kF32;
  Dims dims;
  bool fortran_order = false;
  bool big_endian = false;
  int64_t data_offset = 0;  // from the start of the .npy bytes
  int64_t data_bytes = 0;
};

// Parses the .npy held in `bytes` (a whole .npy file or .npz member): magic, version (1.0, 2.0,
// 3.0), header, dtype, and that the data fills the rest exactly. Errors start with `context`.
StatusOr<NpyArray> ParseNpy(absl::Span<const std::byte> bytes, std::string_view context);

// A whole .npy file as one tensor named after the file (its base name without ".npy").
StatusOr<ParsedTensors> ParseNpyFile(const std::shared_ptr<const MappedFile>& file);

// The complete header of a C-order little-endian .npy (magic to the '\n' that ends the padding;
// its length is a multiple of 64). InvalidArgument when numpy has no dtype for `dtype`.
StatusOr<std::string> EncodeNpyHeader(DType dtype, absl::Span<const int64_t> dims);

// `text` with every byte outside printable ASCII written as \xNN, cut to `max_length` bytes: for
// quoting untrusted header text in error messages.
std::string Printable(std::string_view text, size_t max_length = 64);

}  // namespace ferry::io_internal
