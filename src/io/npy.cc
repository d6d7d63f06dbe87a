#include "src/io/npy.h"

#include <cstring>
#include <string>
#include <vector>

#include "ferry/io/tensor_writer.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/io/file_error.h"
#include "src/io/little_endian.h"
#include "src/io/output_file.h"
#include "src/io/row_major_chunks.h"
#include "src/io/utf8.h"

namespace ferry::io_internal {
namespace {

constexpr char kNpyMagic[] = "\x93NUMPY";
constexpr int64_t kNpyMagicSize = 6;
constexpr int64_t kNpyAlignment = 64;

std::string ShapeText(const Dims& dims) {
  if (dims.size() == 1) return fmt::format("({},)", dims[0]);
  return fmt::format("({})", fmt::join(dims, ", "));
}

std::string SupportedDescrs() {
  std::vector<std::string_view> descrs;
  for (DType dtype : AllDTypes()) {
    const std::string_view descr = GetDTypeInfo(dtype).numpy_descr;
    if (!descr.empty()) descrs.push_back(descr.substr(1));
  }
  return fmt::format("{}", fmt::join(descrs, ", "));
}

// The dtype of a descr, and whether its data is big-endian.
Status ParseDescr(std::string_view descr, NpyArray& array) {
  std::string_view rest = descr;
  char byte_order = '=';
  if (!rest.empty() && (rest[0] == '<' || rest[0] == '>' || rest[0] == '|' || rest[0] == '=')) {
    byte_order = rest[0];
    rest.remove_prefix(1);
  }
  if (!rest.empty() && rest[0] == 'O') {
    return InvalidArgumentError(
        fmt::format("descr '{}' is an object array (pickled Python "
                    "objects), which ferry does not load",
                    Printable(descr)));
  }
  auto dtype = rest.empty() ? StatusOr<DType>(InvalidArgumentError(""))
                            : DTypeFromNumpyDescr(fmt::format("<{}", rest));
  if (!dtype.ok()) {
    return InvalidArgumentError(
        fmt::format("unsupported descr '{}' (ferry reads {}, in either "
                    "byte order)",
                    Printable(descr), SupportedDescrs()));
  }
  array.dtype = *dtype;
  array.big_endian = byte_order == '>' && DTypeSize(*dtype) > 1;
  return OkStatus();
}

// The tensor name of a .npy file: its base name without ".npy".
std::string StemOf(std::string_view path) {
  if (const size_t slash = path.rfind('/'); slash != std::string_view::npos) {
    path.remove_prefix(slash + 1);
  }
  if (path.size() > 4 && path.substr(path.size() - 4) == ".npy") path.remove_suffix(4);
  return path.empty() ? std::string("array") : std::string(path);
}

}  // namespace

StatusOr<NpyArray> ParseNpy(absl::Span<const std::byte> bytes, std::string_view context) {
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size < kNpyMagicSize + 4) {
    return MalformedError(context, fmt::format("{} bytes is too small for a .npy file", size));
  }
  if (std::memcmp(bytes.data(), kNpyMagic, kNpyMagicSize) != 0) {
    return MalformedError(context, "does not start with the .npy magic \"\\x93NUMPY\"");
  }
  const int major = static_cast<int>(bytes[6]);
  const int minor = static_cast<int>(bytes[7]);
  int64_t header_begin;
  int64_t header_size;
  if (major == 1 && minor == 0) {
    header_begin = 10;
    header_size = LoadLittleEndian<uint16_t>(bytes.data() + 8);
  } else if ((major == 2 || major == 3) && minor == 0) {
    if (size < 12) {
      return MalformedError(context, fmt::format("{} bytes is too small for a version {}.0 .npy "
                                                 "file",
                                                 size, major));
    }
    header_begin = 12;
    header_size = LoadLittleEndian<uint32_t>(bytes.data() + 8);
  } else {
    return MalformedError(context, fmt::format("unsupported .npy format version {}.{} (ferry reads "
                                               "1.0, 2.0 and 3.0)",
                                               major, minor));
  }
  if (header_size > size - header_begin) {
    return MalformedError(context, fmt::format("the header length {} reaches past the end of the "
                                               "{} bytes",
                                               header_size, size));
  }
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + header_begin),
                                static_cast<size_t>(header_size));
  // Versions 1.0 and 2.0 are latin-1 (any byte is a character); 3.0 is UTF-8.
  if (major == 3) {
    if (const int64_t invalid = FindInvalidUtf8(header); invalid >= 0) {
      return MalformedError(context, fmt::format("the version 3.0 header is not valid UTF-8 (at "
                                                 "header byte {})",
                                                 invalid));
    }
  }
  auto dict = ParseNpyHeaderDict(header, /*python2_long_suffixes=*/major < 3);
  if (!dict.ok()) return WithContext(dict.status(), context);

  NpyArray array;
  if (Status status = ParseDescr(dict->descr, array); !status.ok()) {
    return WithContext(status, context);
  }
  array.dims = dict->shape;
  array.fortran_order = dict->fortran_order;
  array.data_offset = header_begin + header_size;
  auto data_bytes = CheckedTensorBytes(array.dims, DTypeSize(array.dtype));
  if (!data_bytes.ok()) {
    return MalformedError(
        context, fmt::format("the byte size of shape {} overflows: {}", ShapeText(array.dims),
                             MessageOf(data_bytes.status())));
  }
  array.data_bytes = *data_bytes;
  const int64_t available = size - array.data_offset;
  if (array.data_bytes > available) {
    return MalformedError(context, fmt::format("shape {} of '{}' needs {} bytes of data, but only "
                                               "{} follow the header (truncated?)",
                                               ShapeText(array.dims), Printable(dict->descr),
                                               array.data_bytes, available));
  }
  if (array.data_bytes < available) {
    return MalformedError(context, fmt::format("{} bytes follow the array data (several arrays "
                                               "appended to one .npy file are not supported)",
                                               available - array.data_bytes));
  }
  return array;
}

StatusOr<ParsedTensors> ParseNpyFile(const std::shared_ptr<const MappedFile>& file) {
  const std::string& file_name = file->display_name();
  FERRY_ASSIGN_OR_RETURN(NpyArray array, ParseNpy(file->bytes(), FileContext(file_name)));
  StoredTensor tensor;
  tensor.name = StemOf(file_name);
  tensor.dtype = array.dtype;
  tensor.dims = array.dims;
  tensor.fortran_order = array.fortran_order;
  tensor.big_endian = array.big_endian;
  tensor.data = file->data() + array.data_offset;
  tensor.num_bytes = array.data_bytes;
  ParsedTensors parsed;
  FERRY_ASSIGN_OR_RETURN(
      TensorFileEntry entry,
      MakeTensorEntry(tensor, file->data(), file->size(), file,
                      /*zero_copy=*/true, array.data_offset, file_name, file.get()));
  parsed.tensors.push_back(std::move(entry));
  parsed.data_begin = array.data_offset;
  parsed.data_end = file->size();
  return parsed;
}

StatusOr<std::string> EncodeNpyHeader(DType dtype, absl::Span<const int64_t> dims) {
  const std::string_view descr = GetDTypeInfo(dtype).numpy_descr;
  if (descr.empty()) {
    return InvalidArgumentError(fmt::format("numpy has no dtype for {}", DTypeName(dtype)));
  }
  // numpy's own spelling: keys sorted, ", " after every item, the shape as Python's tuple repr.
  std::string dict = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr,
                                 ShapeText(Dims(dims.begin(), dims.end())));
  // Pad with spaces and end with '\n' so that the data starts at a multiple of 64 bytes; use
  // version 2.0 (a 4-byte length) only when the header does not fit 65535 bytes.
  for (const auto& [major, prefix_size] : {std::pair{1, int64_t{10}}, {2, int64_t{12}}}) {
    const int64_t unpadded = prefix_size + static_cast<int64_t>(dict.size()) + 1;
    const int64_t total = (unpadded + kNpyAlignment - 1) / kNpyAlignment * kNpyAlignment;
    const int64_t header_size = total - prefix_size;
    if (major == 1 && header_size > 0xFFFF) continue;
    std::string out(kNpyMagic, kNpyMagicSize);
    out.push_back(static_cast<char>(major));
    out.push_back('\0');
    if (major == 1) {
      AppendLittleEndian<uint16_t>(out, static_cast<uint16_t>(header_size));
    } else {
      AppendLittleEndian<uint32_t>(out, static_cast<uint32_t>(header_size));
    }
    out += dict;
    out.append(static_cast<size_t>(total - static_cast<int64_t>(out.size()) - 1), ' ');
    out.push_back('\n');
    return out;
  }
  return InvalidArgumentError("the .npy header does not fit 4 GiB");
}

}  // namespace ferry::io_internal

namespace ferry {

Status WriteNpy(const std::string& path, const HostView& view) {
  auto header = io_internal::EncodeNpyHeader(view.dtype, view.dims);
  if (!header.ok()) {
    return InvalidArgumentError(
        fmt::format("cannot write '{}': {}", path, io_internal::MessageOf(header.status())));
  }
  if (auto addressed = view.ComputeAddressedBytes(path); !addressed.ok()) return addressed.status();
  FERRY_ASSIGN_OR_RETURN(io_internal::OutputFile file, io_internal::OutputFile::Create(path));
  FERRY_RETURN_IF_ERROR(file.Write(header->data(), static_cast<int64_t>(header->size())));
  FERRY_RETURN_IF_ERROR(io_internal::ForEachRowMajorChunk(
      view, io_internal::kDefaultChunkBytes,
      [&](const std::byte* bytes, int64_t size) { return file.Write(bytes, size); }));
  return file.Commit();
}

}  // namespace ferry
