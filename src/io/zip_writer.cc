#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "fmt/format.h"
#include "src/io/little_endian.h"
#include "src/io/zip.h"

namespace ferry::io_internal {
namespace {

constexpr uint16_t kVersionZip64 = 45;  // "4.5": zip64 extensions
constexpr uint16_t kVersionMadeByUnix = (3 << 8) | kVersionZip64;
constexpr uint16_t kFlagUtf8Name = 1 << 11;
constexpr uint16_t kDosTime = 0;                          // 00:00:00
constexpr uint16_t kDosDate = (1 << 5) | 1;               // 1980-01-01
constexpr uint32_t kExternalAttributes = 0100644u << 16;  // a regular file, rw-r--r--
constexpr uint32_t kSaturated32 = 0xFFFFFFFF;
constexpr uint16_t kLocalExtraSize = 20;  // zip64 extra: id, size, uncompressed, compressed
constexpr int64_t kDeflateOutputBytes = int64_t{1} << 20;

uint16_t NameFlags(std::string_view name) {
  const bool ascii = std::all_of(name.begin(), name.end(),
                                 [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  return ascii ? 0 : kFlagUtf8Name;
}

uint32_t Clamp32(int64_t value) {
  return value >= int64_t{kSaturated32} ? kSaturated32 : static_cast<uint32_t>(value);
}

}  // namespace

ZipWriter::ZipWriter(OutputFile* file) : file_(file) {}

ZipWriter::~ZipWriter() {
  if (deflater_ != nullptr) {
    deflateEnd(deflater_);
    delete deflater_;
  }
}

Status ZipWriter::BeginMember(std::string_view name, bool deflate) {
  if (in_member_) return FailedPreconditionError("ZipWriter: the previous member is not ended");
  if (name.size() > 0xFFFF) {
    return InvalidArgumentError(
        fmt::format("zip member name of {} bytes is too long", name.size()));
  }
  ZipMember member;
  member.name = std::string(name);
  member.method = deflate ? kZipDeflated : kZipStored;
  member.local_header_offset = file_->position();
  member.data_offset =
      member.local_header_offset + 30 + static_cast<int64_t>(name.size()) + kLocalExtraSize;

  // CRC and sizes are unknown yet: the 32-bit size fields say "see zip64 extra", whose values
  // (and the CRC) EndMember patches in.
  std::string header;
  AppendLittleEndian<uint32_t>(header, 0x04034b50);
  AppendLittleEndian<uint16_t>(header, kVersionZip64);
  AppendLittleEndian<uint16_t>(header, NameFlags(name));
  AppendLittleEndian<uint16_t>(header, member.method);
  AppendLittleEndian<uint16_t>(header, kDosTime);
  AppendLittleEndian<uint16_t>(header, kDosDate);
  AppendLittleEndian<uint32_t>(header, 0);  // CRC-32, patched
  AppendLittleEndian<uint32_t>(header, kSaturated32);
  AppendLittleEndian<uint32_t>(header, kSaturated32);
  AppendLittleEndian<uint16_t>(header, static_cast<uint16_t>(name.size()));
  AppendLittleEndian<uint16_t>(header, kLocalExtraSize);
  header += name;
  AppendLittleEndian<uint16_t>(header, 0x0001);
  AppendLittleEndian<uint16_t>(header, 16);
  AppendLittleEndian<uint64_t>(header, 0);  // uncompressed size, patched
  AppendLittleEndian<uint64_t>(header, 0);  // compressed size, patched
  FERRY_RETURN_IF_ERROR(file_->Write(header.data(), static_cast<int64_t>(header.size())));

  if (deflate) {
    if (deflater_ == nullptr) {
      deflater_ = new z_stream;
      std::memset(deflater_, 0, sizeof(*deflater_));
      // Raw deflate (no zlib header) at zlib's default level, as Python's zipfile writes it.
      if (deflateInit2(deflater_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, -MAX_WBITS, 8,
                       Z_DEFAULT_STRATEGY) != Z_OK) {
        delete deflater_;
        deflater_ = nullptr;
        return ResourceExhaustedError("cannot start zlib's deflate");
      }
      deflate_buffer_.resize(kDeflateOutputBytes);
    } else if (deflateReset(deflater_) != Z_OK) {
      return InternalError("zlib's deflateReset failed");
    }
  }
  members_.push_back(std::move(member));
  in_member_ = true;
  crc32_ = 0;
  uncompressed_size_ = 0;
  return OkStatus();
}

Status ZipWriter::AppendMemberData(const std::byte* data, int64_t size) {
  if (!in_member_) return FailedPreconditionError("ZipWriter: no member is open");
  if (size <= 0) return OkStatus();
  crc32_ = Crc32({data, static_cast<size_t>(size)}, crc32_);
  uncompressed_size_ += size;
  if (members_.back().method == kZipDeflated) return Deflate(data, size, /*finish=*/false);
  return file_->Write(data, size);
}

Status ZipWriter::Deflate(const std::byte* data, int64_t size, bool finish) {
  constexpr int64_t kMaxInputPiece = int64_t{1} << 30;
  int64_t taken = 0;
  while (true) {
    if (deflater_->avail_in == 0 && taken < size) {
      const int64_t piece = std::min(kMaxInputPiece, size - taken);
      deflater_->next_in = reinterpret_cast<Bytef*>(const_cast<std::byte*>(data + taken));
      deflater_->avail_in = static_cast<uInt>(piece);
      taken += piece;
    }
    const bool last_input = taken == size;
    deflater_->next_out = reinterpret_cast<Bytef*>(deflate_buffer_.data());
    deflater_->avail_out = static_cast<uInt>(deflate_buffer_.size());
    const int result = deflate(deflater_, finish && last_input ? Z_FINISH : Z_NO_FLUSH);
    if (result == Z_STREAM_ERROR) return InternalError("zlib's deflate failed");
    const int64_t produced = static_cast<int64_t>(deflate_buffer_.size()) - deflater_->avail_out;
    if (produced > 0) FERRY_RETURN_IF_ERROR(file_->Write(deflate_buffer_.data(), produced));
    if (finish) {
      if (result == Z_STREAM_END) return OkStatus();
    } else if (last_input && deflater_->avail_in == 0 && deflater_->avail_out != 0) {
      return OkStatus();  // all input consumed; deflate keeps the rest for later
    }
  }
}

Status ZipWriter::EndMember() {
  if (!in_member_) return FailedPreconditionError("ZipWriter: no member is open");
  ZipMember& member = members_.back();
  if (member.method == kZipDeflated) FERRY_RETURN_IF_ERROR(Deflate(nullptr, 0, /*finish=*/true));
  member.crc32 = crc32_;
  member.uncompressed_size = uncompressed_size_;
  member.compressed_size = file_->position() - member.data_offset;
  in_member_ = false;

  std::string crc;
  AppendLittleEndian<uint32_t>(crc, member.crc32);
  FERRY_RETURN_IF_ERROR(file_->WriteAt(member.local_header_offset + 14, crc.data(), 4));
  std::string sizes;
  AppendLittleEndian<uint64_t>(sizes, static_cast<uint64_t>(member.uncompressed_size));
  AppendLittleEndian<uint64_t>(sizes, static_cast<uint64_t>(member.compressed_size));
  const int64_t extra_values =
      member.local_header_offset + 30 + static_cast<int64_t>(member.name.size()) + 4;
  return file_->WriteAt(extra_values, sizes.data(), 16);
}

Status ZipWriter::Finish() {
  if (in_member_) FERRY_RETURN_IF_ERROR(EndMember());
  const int64_t directory_offset = file_->position();
  for (const ZipMember& member : members_) {
    // zip64 values, only for the fields that do not fit 32 bits.
    std::string zip64;
    for (int64_t value :
         {member.uncompressed_size, member.compressed_size, member.local_header_offset}) {
      if (value >= int64_t{kSaturated32})
        AppendLittleEndian<uint64_t>(zip64, static_cast<uint64_t>(value));
    }
    std::string extra;
    if (!zip64.empty()) {
      AppendLittleEndian<uint16_t>(extra, 0x0001);
      AppendLittleEndian<uint16_t>(extra, static_cast<uint16_t>(zip64.size()));
      extra += zip64;
    }
    std::string entry;
    AppendLittleEndian<uint32_t>(entry, 0x02014b50);
    AppendLittleEndian<uint16_t>(entry, kVersionMadeByUnix);
    AppendLittleEndian<uint16_t>(entry, kVersionZip64);
    AppendLittleEndian<uint16_t>(entry, NameFlags(member.name));
    AppendLittleEndian<uint16_t>(entry, member.method);
    AppendLittleEndian<uint16_t>(entry, kDosTime);
    AppendLittleEndian<uint16_t>(entry, kDosDate);
    AppendLittleEndian<uint32_t>(entry, member.crc32);
    AppendLittleEndian<uint32_t>(entry, Clamp32(member.compressed_size));
    AppendLittleEndian<uint32_t>(entry, Clamp32(member.uncompressed_size));
    AppendLittleEndian<uint16_t>(entry, static_cast<uint16_t>(member.name.size()));
    AppendLittleEndian<uint16_t>(entry, static_cast<uint16_t>(extra.size()));
    AppendLittleEndian<uint16_t>(entry, 0);  // comment
    AppendLittleEndian<uint16_t>(entry, 0);  // disk
    AppendLittleEndian<uint16_t>(entry, 0);  // internal attributes
    AppendLittleEndian<uint32_t>(entry, kExternalAttributes);
    AppendLittleEndian<uint32_t>(entry, Clamp32(member.local_header_offset));
    entry += member.name;
    entry += extra;
    FERRY_RETURN_IF_ERROR(file_->Write(entry.data(), static_cast<int64_t>(entry.size())));
  }
  const int64_t directory_end = file_->position();
  const int64_t directory_size = directory_end - directory_offset;
  const int64_t num_entries = static_cast<int64_t>(members_.size());

  std::string end;
  if (num_entries >= 0xFFFF || directory_size >= int64_t{kSaturated32} ||
      directory_offset >= int64_t{kSaturated32}) {
    AppendLittleEndian<uint32_t>(end, 0x06064b50);
    AppendLittleEndian<uint64_t>(end, 44);  // the record's size after this field
    AppendLittleEndian<uint16_t>(end, kVersionMadeByUnix);
    AppendLittleEndian<uint16_t>(end, kVersionZip64);
    AppendLittleEndian<uint32_t>(end, 0);
    AppendLittleEndian<uint32_t>(end, 0);
    AppendLittleEndian<uint64_t>(end, static_cast<uint64_t>(num_entries));
    AppendLittleEndian<uint64_t>(end, static_cast<uint64_t>(num_entries));
    AppendLittleEndian<uint64_t>(end, static_cast<uint64_t>(directory_size));
    AppendLittleEndian<uint64_t>(end, static_cast<uint64_t>(directory_offset));
    AppendLittleEndian<uint32_t>(end, 0x07064b50);
    AppendLittleEndian<uint32_t>(end, 0);
    AppendLittleEndian<uint64_t>(end, static_cast<uint64_t>(directory_end));
    AppendLittleEndian<uint32_t>(end, 1);
  }
  AppendLittleEndian<uint32_t>(end, 0x06054b50);
  AppendLittleEndian<uint16_t>(end, 0);
  AppendLittleEndian<uint16_t>(end, 0);
  AppendLittleEndian<uint16_t>(end, static_cast<uint16_t>(std::min<int64_t>(num_entries, 0xFFFF)));
  AppendLittleEndian<uint16_t>(end, static_cast<uint16_t>(std::min<int64_t>(num_entries, 0xFFFF)));
  AppendLittleEndian<uint32_t>(end, Clamp32(directory_size));
  AppendLittleEndian<uint32_t>(end, Clamp32(directory_offset));
  AppendLittleEndian<uint16_t>(end, 0);  // comment
  return file_->Write(end.data(), static_cast<int64_t>(end.size()));
}

}  // namespace ferry::io_internal
