// .npz: a zip archive of NAME.npy members (numpy.savez stores them, savez_compressed deflates
// them). Stored members are parsed in place and borrowed zero-copy from the mapping; deflated ones
// are inflated once into memory owned by their source.
#include "src/io/npz.h"

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/io/tensor_writer.h"
#include "fmt/format.h"
#include "src/io/file_error.h"
#include "src/io/npy.h"
#include "src/io/output_file.h"
#include "src/io/row_major_chunks.h"
#include "src/io/utf8.h"
#include "src/io/zip.h"

namespace ferry::io_internal {
namespace {

constexpr std::string_view kNpySuffix = ".npy";

// Parses the .npy in `bytes` (inside [region_begin, region_begin + region_size), kept valid by
// `keep_alive`) and makes the member's entry.
StatusOr<TensorFileEntry> MakeMemberEntry(std::string tensor_name,
                                          absl::Span<const std::byte> bytes,
                                          const std::byte* region_begin, int64_t region_size,
                                          std::shared_ptr<const void> keep_alive, bool zero_copy,
                                          int64_t file_offset, std::string_view file_name,
                                          std::string_view context,
                                          const MappedFile* mapped_file = nullptr) {
  FERRY_ASSIGN_OR_RETURN(NpyArray array, ParseNpy(bytes, context));
  StoredTensor tensor;
  tensor.name = std::move(tensor_name);
  tensor.dtype = array.dtype;
  tensor.dims = array.dims;
  tensor.fortran_order = array.fortran_order;
  tensor.big_endian = array.big_endian;
  tensor.data = bytes.data() + array.data_offset;
  tensor.num_bytes = array.data_bytes;
  return MakeTensorEntry(tensor, region_begin, region_size, std::move(keep_alive), zero_copy,
                         file_offset < 0 ? -1 : file_offset + array.data_offset, file_name,
                         mapped_file);
}

}  // namespace

StatusOr<ParsedTensors> ParseNpz(const std::shared_ptr<const MappedFile>& file,
                                 const TensorFileOptions& options) {
  const std::string& file_name = file->display_name();
  const std::string context = FileContext(file_name);
  FERRY_ASSIGN_OR_RETURN(std::vector<ZipMember> members, ReadZipDirectory(file->bytes(), context));

  ParsedTensors parsed;
  parsed.data_begin = 0;
  parsed.data_end = file->size();
  parsed.tensors.reserve(members.size());
  for (const ZipMember& member : members) {
    const std::string member_context = MemberContext(context, member.name);
    const std::string_view name = member.name;
    if (name.size() <= kNpySuffix.size() ||
        name.substr(name.size() - kNpySuffix.size()) != kNpySuffix) {
      return MalformedError(member_context, "an .npz holds only NAME.npy members");
    }
    std::string tensor_name(name.substr(0, name.size() - kNpySuffix.size()));
    // An unselected member is left unread (not inflated, its header not parsed).
    if (options.selector != nullptr && !options.selector->Selects(tensor_name)) continue;
    const absl::Span<const std::byte> stored = file->bytes().subspan(
        static_cast<size_t>(member.data_offset), static_cast<size_t>(member.compressed_size));
    if (member.method == kZipStored) {
      if (options.verify_stored_crc32 && Crc32(stored) != member.crc32) {
        return MalformedError(member_context, fmt::format("CRC-32 mismatch: the data has {:08x}, "
                                                          "the archive says {:08x}",
                                                          Crc32(stored), member.crc32));
      }
      FERRY_ASSIGN_OR_RETURN(
          TensorFileEntry entry,
          MakeMemberEntry(std::move(tensor_name), stored, file->data(), file->size(), file,
                          /*zero_copy=*/true, member.data_offset, file_name, member_context,
                          file.get()));
      parsed.tensors.push_back(std::move(entry));
      continue;
    }
    // Deflated: inflate the whole member (header and data) into one 64-byte aligned buffer; the
    // data then starts at the header's length, a multiple of 64 for numpy's files.
    auto buffer = HostTensor::Allocate(DType::kU8, {member.uncompressed_size});
    if (!buffer.ok()) return WithContext(buffer.status(), member_context);
    auto owned = std::make_shared<HostTensor>(std::move(buffer).value());
    const absl::Span<std::byte> out(owned->data(), static_cast<size_t>(owned->size_bytes()));
    FERRY_RETURN_IF_ERROR(InflateMember(stored, out, member.crc32, member_context));
    FERRY_ASSIGN_OR_RETURN(TensorFileEntry entry,
                           MakeMemberEntry(std::move(tensor_name), out, owned->data(),
                                           owned->size_bytes(), owned, /*zero_copy=*/false,
                                           /*file_offset=*/-1, file_name, member_context));
    parsed.tensors.push_back(std::move(entry));
  }
  return parsed;
}

}  // namespace ferry::io_internal

namespace ferry {

Status WriteNpz(const std::string& path, absl::Span<const NamedTensor> tensors, bool compressed) {
  std::set<std::string_view> names;
  std::vector<std::string> headers;
  headers.reserve(tensors.size());
  for (const NamedTensor& tensor : tensors) {
    const std::string context = fmt::format("cannot write '{}': tensor '{}'", path, tensor.name);
    if (tensor.name.empty()) {
      return InvalidArgumentError(
          fmt::format("cannot write '{}': a tensor has an empty name", path));
    }
    if (io_internal::FindInvalidUtf8(tensor.name) >= 0) {
      return InvalidArgumentError(fmt::format("{}: the name is not valid UTF-8", context));
    }
    if (!names.insert(tensor.name).second) {
      return InvalidArgumentError(fmt::format("{}: the name is used twice", context));
    }
    auto header = io_internal::EncodeNpyHeader(tensor.view.dtype, tensor.view.dims);
    if (!header.ok()) {
      return InvalidArgumentError(
          fmt::format("{}: {}", context, io_internal::MessageOf(header.status())));
    }
    if (auto addressed = tensor.view.ComputeAddressedBytes(tensor.name); !addressed.ok()) {
      return InvalidArgumentError(
          fmt::format("cannot write '{}': {}", path, io_internal::MessageOf(addressed.status())));
    }
    headers.push_back(std::move(header).value());
  }

  FERRY_ASSIGN_OR_RETURN(io_internal::OutputFile file, io_internal::OutputFile::Create(path));
  io_internal::ZipWriter zip(&file);
  for (size_t i = 0; i < tensors.size(); ++i) {
    FERRY_RETURN_IF_ERROR(zip.BeginMember(tensors[i].name + ".npy", compressed));
    FERRY_RETURN_IF_ERROR(
        zip.AppendMemberData(reinterpret_cast<const std::byte*>(headers[i].data()),
                             static_cast<int64_t>(headers[i].size())));
    FERRY_RETURN_IF_ERROR(io_internal::ForEachRowMajorChunk(
        tensors[i].view, io_internal::kDefaultChunkBytes,
        [&](const std::byte* bytes, int64_t size) { return zip.AppendMemberData(bytes, size); }));
    FERRY_RETURN_IF_ERROR(zip.EndMember());
  }
  FERRY_RETURN_IF_ERROR(zip.Finish());
  return file.Commit();
}

}  // namespace ferry
