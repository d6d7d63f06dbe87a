// Reading a zip archive's directory, and inflating members. Every offset and size read from the
// archive is untrusted: each is checked against the archive's size before it is used, in
// unsigned 64-bit arithmetic that cannot wrap.
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#include "fmt/format.h"
#include "src/io/file_error.h"
#include "src/io/little_endian.h"
#include "src/io/npy.h"
#include "src/io/utf8.h"
#include "src/io/zip.h"

namespace ferry::io_internal {
namespace {

constexpr uint32_t kEndOfCentralDirectorySignature = 0x06054b50;
constexpr uint32_t kZip64EndLocatorSignature = 0x07064b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kCentralDirectorySignature = 0x02014b50;
constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint64_t kEndOfCentralDirectorySize = 22;
constexpr uint64_t kZip64EndLocatorSize = 20;
constexpr uint64_t kZip64EndFixedSize = 56;
constexpr uint64_t kCentralDirectoryEntrySize = 46;
constexpr uint64_t kLocalHeaderSize = 30;
constexpr uint64_t kMaxCommentSize = 0xFFFF;
constexpr uint16_t kZip64ExtraId = 0x0001;
// Deflate cannot expand more than 1032:1 (a 258-byte match coded in two bits); a member that
// claims more is corrupt or a decompression bomb, and is refused before anything is allocated.
constexpr uint64_t kMaxDeflateRatio = 1040;
constexpr int64_t kInflateChunkBytes = int64_t{4} << 20;

// A bounds-checked reader over the archive.
class Bytes {
 public:
  explicit Bytes(absl::Span<const std::byte> bytes) : bytes_(bytes) {}
  uint64_t size() const { return bytes_.size(); }
  // True when [offset, offset + length) lies inside the archive.
  bool Contains(uint64_t offset, uint64_t length) const {
    return offset <= size() && length <= size() - offset;
  }
  template <typename T>
  T Load(uint64_t offset) const {  // requires Contains(offset, sizeof(T))
    return LoadLittleEndian<T>(bytes_.data() + offset);
  }
  std::string_view Text(uint64_t offset, uint64_t length) const {  // requires Contains
    return {reinterpret_cast<const char*>(bytes_.data() + offset), static_cast<size_t>(length)};
  }

 private:
  absl::Span<const std::byte> bytes_;
};

struct EndRecord {
  uint64_t num_entries = 0;
  uint64_t directory_size = 0;
  uint64_t directory_offset = 0;
  // Where the central directory must end: the zip64 end record, or the end record.
  uint64_t directory_end = 0;
};

// The offset of the end-of-central-directory record: the last thing in the archive, followed
// only by its comment.
StatusOr<uint64_t> FindEndRecord(const Bytes& archive, std::string_view context) {
  if (archive.size() < kEndOfCentralDirectorySize) {
    return MalformedError(context,
                          fmt::format("{} bytes is too small for a zip archive", archive.size()));
  }
  const uint64_t last = archive.size() - kEndOfCentralDirectorySize;
  const uint64_t first = last > kMaxCommentSize ? last - kMaxCommentSize : 0;
  for (uint64_t offset = last + 1; offset-- > first;) {
    if (archive.Load<uint32_t>(offset) == kEndOfCentralDirectorySignature &&
        archive.Load<uint16_t>(offset + 20) ==
            archive.size() - offset - kEndOfCentralDirectorySize) {
      return offset;
    }
  }
  return MalformedError(context,
                        "no zip end-of-central-directory record (not a zip archive, "
                        "or truncated)");
}

// zip64: the locator right before the end record at `end_offset` points at the zip64 end record,
// which holds the 64-bit counts and offsets that replace those of `record`.
Status ApplyZip64EndRecord(const Bytes& archive, uint64_t end_offset, EndRecord& record,
                           std::string_view context) {
  const uint64_t locator = end_offset - kZip64EndLocatorSize;
  const uint32_t zip64_disk = archive.Load<uint32_t>(locator + 4);
  const uint64_t zip64_offset = archive.Load<uint64_t>(locator + 8);
  const uint32_t total_disks = archive.Load<uint32_t>(locator + 16);
  if (zip64_disk != 0 || total_disks > 1) {
    return MalformedError(context, "multi-disk (split) zip archives are not supported");
  }
  if (zip64_offset > locator || locator - zip64_offset < kZip64EndFixedSize ||
      archive.Load<uint32_t>(zip64_offset) != kZip64EndSignature) {
    return MalformedError(context, fmt::format("the zip64 end-of-central-directory locator "
                                               "points at offset {}, where there is no zip64 "
                                               "end record",
                                               zip64_offset));
  }
  const uint64_t record_size = archive.Load<uint64_t>(zip64_offset + 4);
  if (record_size != locator - zip64_offset - 12) {
    return MalformedError(context, fmt::format("the zip64 end record's size {} does not reach "
                                               "its locator",
                                               record_size));
  }
  if (archive.Load<uint32_t>(zip64_offset + 16) != 0 ||
      archive.Load<uint32_t>(zip64_offset + 20) != 0 ||
      archive.Load<uint64_t>(zip64_offset + 24) != archive.Load<uint64_t>(zip64_offset + 32)) {
    return MalformedError(context, "multi-disk (split) zip archives are not supported");
  }
  record.num_entries = archive.Load<uint64_t>(zip64_offset + 32);
  record.directory_size = archive.Load<uint64_t>(zip64_offset + 40);
  record.directory_offset = archive.Load<uint64_t>(zip64_offset + 48);
  record.directory_end = zip64_offset;
  return OkStatus();
}

// The end record (and the zip64 one when there is one), checked to describe one central
// directory that ends where the end records start.
StatusOr<EndRecord> ReadEndRecords(const Bytes& archive, std::string_view context) {
  FERRY_ASSIGN_OR_RETURN(const uint64_t end_offset, FindEndRecord(archive, context));
  const uint16_t disk = archive.Load<uint16_t>(end_offset + 4);
  const uint16_t directory_disk = archive.Load<uint16_t>(end_offset + 6);
  const uint16_t entries_on_disk = archive.Load<uint16_t>(end_offset + 8);
  EndRecord record;
  record.num_entries = archive.Load<uint16_t>(end_offset + 10);
  record.directory_size = archive.Load<uint32_t>(end_offset + 12);
  record.directory_offset = archive.Load<uint32_t>(end_offset + 16);
  record.directory_end = end_offset;
  if (disk != 0 || directory_disk != 0 || entries_on_disk != record.num_entries) {
    return MalformedError(context, "multi-disk (split) zip archives are not supported");
  }

  if (end_offset >= kZip64EndLocatorSize &&
      archive.Load<uint32_t>(end_offset - kZip64EndLocatorSize) == kZip64EndLocatorSignature) {
    FERRY_RETURN_IF_ERROR(ApplyZip64EndRecord(archive, end_offset, record, context));
  }
  if (record.directory_offset > record.directory_end ||
      record.directory_size != record.directory_end - record.directory_offset) {
    return MalformedError(
        context, fmt::format("the central directory ({} bytes at offset {}) does not end where "
                             "the end record starts (offset {}); data before or inside the "
                             "archive is not supported",
                             record.directory_size, record.directory_offset, record.directory_end));
  }
  if (record.num_entries > record.directory_size / kCentralDirectoryEntrySize) {
    return MalformedError(context, fmt::format("{} entries cannot fit a {}-byte central directory",
                                               record.num_entries, record.directory_size));
  }
  return record;
}

// Replaces the 32-bit fields that are saturated (0xFFFFFFFF) by the values of the zip64 extra
// field, which holds exactly those, in this order.
Status ApplyZip64Extra(const Bytes& archive, uint64_t extra_offset, uint64_t extra_size,
                       uint64_t& uncompressed_size, uint64_t& compressed_size,
                       uint64_t& local_header_offset, std::string_view context) {
  const bool need_uncompressed = uncompressed_size == 0xFFFFFFFF;
  const bool need_compressed = compressed_size == 0xFFFFFFFF;
  const bool need_offset = local_header_offset == 0xFFFFFFFF;
  uint64_t position = extra_offset;
  const uint64_t end = extra_offset + extra_size;
  while (end - position >= 4) {
    const uint16_t id = archive.Load<uint16_t>(position);
    const uint16_t size = archive.Load<uint16_t>(position + 2);
    position += 4;
    if (size > end - position) {
      return MalformedError(context, fmt::format("extra field 0x{:04x} ({} bytes) overruns the "
                                                 "extra data",
                                                 id, size));
    }
    if (id == kZip64ExtraId) {
      const uint64_t needed = 8 * (uint64_t{need_uncompressed} + need_compressed + need_offset);
      if (size < needed) {
        return MalformedError(context, fmt::format("the zip64 extra field has {} bytes, but the "
                                                   "saturated sizes and offset need {}",
                                                   size, needed));
      }
      uint64_t field = position;
      for (auto [needed_here, value] : {std::pair{need_uncompressed, &uncompressed_size},
                                        {need_compressed, &compressed_size},
                                        {need_offset, &local_header_offset}}) {
        if (!needed_here) continue;
        *value = archive.Load<uint64_t>(field);
        field += 8;
      }
      return OkStatus();
    }
    position += size;
  }
  if (need_uncompressed || need_compressed || need_offset) {
    return MalformedError(context,
                          "sizes or offset are marked zip64 (0xFFFFFFFF), but there is "
                          "no zip64 extra field");
  }
  return OkStatus();
}

// One central directory entry as it is stored: the fixed fields, and where its name and extra
// field lie (checked to be inside the central directory).
struct CentralEntry {
  uint16_t flags = 0;
  uint16_t method = 0;
  uint32_t crc = 0;
  uint64_t compressed_size = 0;
  uint64_t uncompressed_size = 0;
  uint16_t start_disk = 0;
  uint64_t local_offset = 0;
  std::string_view name;
  uint64_t extra_offset = 0;
  uint16_t extra_size = 0;
  // Where the next entry starts: past this one's name, extra field and comment.
  uint64_t next_position = 0;
};

StatusOr<CentralEntry> ReadCentralEntry(const Bytes& archive, const EndRecord& end,
                                        uint64_t position, std::string_view entry_context) {
  if (end.directory_end - position < kCentralDirectoryEntrySize ||
      archive.Load<uint32_t>(position) != kCentralDirectorySignature) {
    return MalformedError(entry_context,
                          fmt::format("no central directory entry at offset {}", position));
  }
  CentralEntry entry;
  entry.flags = archive.Load<uint16_t>(position + 8);
  entry.method = archive.Load<uint16_t>(position + 10);
  entry.crc = archive.Load<uint32_t>(position + 16);
  entry.compressed_size = archive.Load<uint32_t>(position + 20);
  entry.uncompressed_size = archive.Load<uint32_t>(position + 24);
  const uint16_t name_size = archive.Load<uint16_t>(position + 28);
  entry.extra_size = archive.Load<uint16_t>(position + 30);
  const uint16_t comment_size = archive.Load<uint16_t>(position + 32);
  entry.start_disk = archive.Load<uint16_t>(position + 34);
  entry.local_offset = archive.Load<uint32_t>(position + 42);
  const uint64_t variable_size = uint64_t{name_size} + entry.extra_size + comment_size;
  if (end.directory_end - position - kCentralDirectoryEntrySize < variable_size) {
    return MalformedError(entry_context,
                          "the entry's name, extra field and comment overrun the "
                          "central directory");
  }
  const uint64_t name_offset = position + kCentralDirectoryEntrySize;
  entry.name = archive.Text(name_offset, name_size);
  entry.extra_offset = name_offset + name_size;
  entry.next_position = name_offset + variable_size;
  return entry;
}

// The member's name must be usable as a tensor name: not empty, UTF-8, and not seen before in
// `names` (which it joins).
Status CheckMemberName(std::string_view name, std::set<std::string_view>& names,
                       std::string_view entry_context, std::string_view member_context) {
  if (name.empty()) return MalformedError(entry_context, "the member has an empty name");
  if (FindInvalidUtf8(name) >= 0) {
    return MalformedError(member_context, "the member name is not valid UTF-8");
  }
  if (!names.insert(name).second) {
    return MalformedError(member_context, "the archive holds two members with this name");
  }
  return OkStatus();
}

// What a .npz reader can handle: no encryption, stored or deflated, one disk.
Status CheckEntrySupported(const CentralEntry& entry, std::string_view member_context) {
  if ((entry.flags & 0x0001) != 0 || (entry.flags & 0x0040) != 0 || (entry.flags & 0x2000) != 0) {
    return MalformedError(member_context, "encrypted members are not supported");
  }
  if (entry.method != kZipStored && entry.method != kZipDeflated) {
    return MalformedError(member_context, fmt::format("compression method {} is not supported "
                                                      "(only 0, stored, and 8, deflated)",
                                                      entry.method));
  }
  if (entry.start_disk != 0 && entry.start_disk != 0xFFFF) {
    return MalformedError(member_context, "multi-disk (split) zip archives are not supported");
  }
  return OkStatus();
}

// Finds the member's data through its local header, which repeats the name; the data follows it
// and its own extra field, and must lie before the central directory. `entry` has its zip64
// sizes and offset applied.
StatusOr<ZipMember> LocateMemberData(const Bytes& archive, const EndRecord& end,
                                     const CentralEntry& entry, std::string_view member_context) {
  const uint64_t local_offset = entry.local_offset;
  if (local_offset > end.directory_offset ||
      end.directory_offset - local_offset < kLocalHeaderSize ||
      archive.Load<uint32_t>(local_offset) != kLocalHeaderSignature) {
    return MalformedError(member_context,
                          fmt::format("no local file header at offset {}", local_offset));
  }
  const uint16_t local_method = archive.Load<uint16_t>(local_offset + 8);
  const uint16_t local_name_size = archive.Load<uint16_t>(local_offset + 26);
  const uint16_t local_extra_size = archive.Load<uint16_t>(local_offset + 28);
  const uint64_t data_offset = local_offset + kLocalHeaderSize + local_name_size + local_extra_size;
  if (data_offset > end.directory_offset) {
    return MalformedError(member_context, "the local header overruns the central directory");
  }
  if (archive.Text(local_offset + kLocalHeaderSize, local_name_size) != entry.name) {
    return MalformedError(member_context, "the local header names another file");
  }
  if (local_method != entry.method) {
    return MalformedError(member_context, fmt::format("the local header says compression method "
                                                      "{}, the central directory {}",
                                                      local_method, entry.method));
  }
  const uint64_t compressed_size = entry.compressed_size;
  const uint64_t uncompressed_size = entry.uncompressed_size;
  if (compressed_size > end.directory_offset - data_offset) {
    return MalformedError(member_context, fmt::format("its {} bytes of data at offset {} reach "
                                                      "into the central directory (truncated?)",
                                                      compressed_size, data_offset));
  }
  if (entry.method == kZipStored && compressed_size != uncompressed_size) {
    return MalformedError(member_context, fmt::format("a stored member's compressed size {} "
                                                      "differs from its size {}",
                                                      compressed_size, uncompressed_size));
  }
  if (entry.method == kZipDeflated &&
      uncompressed_size > compressed_size * kMaxDeflateRatio + 1024) {
    return MalformedError(member_context, fmt::format("{} compressed bytes claim to inflate to "
                                                      "{} bytes, more than deflate can produce",
                                                      compressed_size, uncompressed_size));
  }
  ZipMember member;
  member.name = std::string(entry.name);
  member.method = entry.method;
  member.crc32 = entry.crc;
  member.compressed_size = static_cast<int64_t>(compressed_size);
  member.uncompressed_size = static_cast<int64_t>(uncompressed_size);
  member.local_header_offset = static_cast<int64_t>(local_offset);
  member.data_offset = static_cast<int64_t>(data_offset);
  return member;
}

// No two members may share bytes (overlapping members are a known decompression-bomb trick).
Status CheckMembersDoNotOverlap(const std::vector<ZipMember>& members, std::string_view context) {
  std::vector<const ZipMember*> by_offset;
  for (const ZipMember& member : members) by_offset.push_back(&member);
  std::sort(by_offset.begin(), by_offset.end(), [](const ZipMember* a, const ZipMember* b) {
    return a->local_header_offset < b->local_header_offset;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const ZipMember& previous = *by_offset[i - 1];
    if (previous.data_offset + previous.compressed_size > by_offset[i]->local_header_offset) {
      return MalformedError(context,
                            fmt::format("members '{}' and '{}' overlap",
                                        EscapeForMessage(previous.name, kQuotedNameLength),
                                        EscapeForMessage(by_offset[i]->name, kQuotedNameLength)));
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::vector<ZipMember>> ReadZipDirectory(absl::Span<const std::byte> bytes,
                                                  std::string_view context) {
  const Bytes archive(bytes);
  FERRY_ASSIGN_OR_RETURN(const EndRecord end, ReadEndRecords(archive, context));

  std::vector<ZipMember> members;
  members.reserve(static_cast<size_t>(end.num_entries));
  std::set<std::string_view> names;
  uint64_t position = end.directory_offset;
  for (uint64_t index = 0; index < end.num_entries; ++index) {
    const std::string entry_context = fmt::format("{}: central directory entry {}", context, index);
    FERRY_ASSIGN_OR_RETURN(CentralEntry entry,
                           ReadCentralEntry(archive, end, position, entry_context));
    const std::string member_context = MemberContext(context, entry.name);
    FERRY_RETURN_IF_ERROR(CheckMemberName(entry.name, names, entry_context, member_context));
    FERRY_RETURN_IF_ERROR(CheckEntrySupported(entry, member_context));
    FERRY_RETURN_IF_ERROR(ApplyZip64Extra(archive, entry.extra_offset, entry.extra_size,
                                          entry.uncompressed_size, entry.compressed_size,
                                          entry.local_offset, member_context));
    position = entry.next_position;
    FERRY_ASSIGN_OR_RETURN(ZipMember member, LocateMemberData(archive, end, entry, member_context));
    members.push_back(std::move(member));
  }
  if (position != end.directory_end) {
    return MalformedError(context, fmt::format("{} unexpected bytes at the end of the central "
                                               "directory",
                                               end.directory_end - position));
  }
  FERRY_RETURN_IF_ERROR(CheckMembersDoNotOverlap(members, context));
  return members;
}

uint32_t Crc32(absl::Span<const std::byte> bytes, uint32_t crc) {
  return static_cast<uint32_t>(
      crc32_z(crc, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
}

Status InflateMember(absl::Span<const std::byte> compressed, absl::Span<std::byte> out,
                     uint32_t expected_crc32, std::string_view context) {
  z_stream stream;
  std::memset(&stream, 0, sizeof(stream));
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) {
    return ResourceExhaustedError(fmt::format("{}: cannot start zlib's inflate", context));
  }
  struct InflateEnd {
    z_stream* stream;
    ~InflateEnd() { inflateEnd(stream); }
  } inflate_end{&stream};

  // zlib counts in 32-bit units: feed the input and take the output in bounded pieces, and
  // checksum each piece of output right after it was produced, while it is in cache.
  constexpr uint64_t kMaxInputPiece = uint64_t{1} << 30;
  uint64_t input_taken = 0;
  uint64_t output_given = 0;
  std::byte empty_output;
  uint32_t crc = 0;
  int result = Z_OK;
  while (true) {
    if (stream.avail_in == 0 && input_taken < compressed.size()) {
      const uint64_t piece = std::min<uint64_t>(kMaxInputPiece, compressed.size() - input_taken);
      stream.next_in =
          reinterpret_cast<Bytef*>(const_cast<std::byte*>(compressed.data() + input_taken));
      stream.avail_in = static_cast<uInt>(piece);
      input_taken += piece;
    }
    if (stream.avail_out == 0) {
      const uint64_t piece = std::min<uint64_t>(kInflateChunkBytes, out.size() - output_given);
      stream.next_out =
          reinterpret_cast<Bytef*>(piece > 0 ? out.data() + output_given : &empty_output);
      stream.avail_out = static_cast<uInt>(piece);
      output_given += piece;
    }
    Bytef* const produced_from = stream.next_out;
    result = inflate(&stream, Z_NO_FLUSH);
    const size_t produced = static_cast<size_t>(stream.next_out - produced_from);
    if (produced > 0) crc = static_cast<uint32_t>(crc32_z(crc, produced_from, produced));
    if (result == Z_STREAM_END) break;
    if (result == Z_OK) continue;
    if (result == Z_BUF_ERROR) {
      // No progress possible: continue only if there is more input or room to give.
      const bool more_input = stream.avail_in == 0 && input_taken < compressed.size();
      const bool more_room = stream.avail_out == 0 && output_given < out.size();
      if (more_input || more_room) continue;
      if (stream.avail_out == 0) {
        return MalformedError(context, fmt::format("the member inflates to more than the {} bytes "
                                                   "its directory entry says",
                                                   out.size()));
      }
      return MalformedError(context, "the deflate stream ends early (truncated or corrupt)");
    }
    return MalformedError(context, fmt::format("corrupt deflate stream: {}",
                                               stream.msg != nullptr ? stream.msg : "zlib error"));
  }
  if (stream.total_out != out.size()) {
    return MalformedError(context, fmt::format("the member inflates to {} bytes, but its directory "
                                               "entry says {}",
                                               stream.total_out, out.size()));
  }
  const uint64_t unused_input = stream.avail_in + (compressed.size() - input_taken);
  if (unused_input != 0) {
    return MalformedError(
        context, fmt::format("{} bytes follow the end of the deflate stream", unused_input));
  }
  if (crc != expected_crc32) {
    return MalformedError(context, fmt::format("CRC-32 mismatch: the data has {:08x}, the archive "
                                               "says {:08x}",
                                               crc, expected_crc32));
  }
  return OkStatus();
}

}  // namespace ferry::io_internal
