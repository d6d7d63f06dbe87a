// Just enough of the zip format (PKWARE APPNOTE 6.3) for .npz archives: reading the central
// directory of an archive held in memory (with zip64 records and extra fields, which numpy always
// writes), inflating deflated members, and writing archives with stored or deflated members.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/status.h"
#include "src/io/output_file.h"

struct z_stream_s;

namespace ferry::io_internal {

inline constexpr uint16_t kZipStored = 0;
inline constexpr uint16_t kZipDeflated = 8;

struct ZipMember {
  std::string name;
  uint16_t method = kZipStored;
  uint32_t crc32 = 0;
  int64_t compressed_size = 0;
  int64_t uncompressed_size = 0;
  int64_t local_header_offset = 0;
  // Where the member's (possibly compressed) bytes start in the archive: past the local header,
  // its name and its extra field.
  int64_t data_offset = 0;
};

// Reads and validates the directory of the zip archive `archive` (the whole file): the end of
// central directory record (and the zip64 locator and record when present), every central
// directory entry (zip64 extra fields included) and every member's local header. Rejects what a
// .npz reader cannot or should not handle: multi-disk archives, data before the archive,
// encrypted members, methods other than stored and deflated, member names that are not UTF-8 or
// differ between the central directory and the local header, members that overlap or reach into
// the central directory, stored members whose sizes differ, and duplicate names. Members are
// returned in central directory order. Errors start with `context`.
StatusOr<std::vector<ZipMember>> ReadZipDirectory(absl::Span<const std::byte> archive,
                                                  std::string_view context);

// The CRC-32 of `bytes` (zlib's).
uint32_t Crc32(absl::Span<const std::byte> bytes, uint32_t crc = 0);

// Inflates the raw deflate stream `compressed` into exactly `out` (whose size is the member's
// uncompressed size), chunk by chunk, checking the CRC-32 of the output as it is produced.
// InvalidArgument (prefixed by `context`) when the stream is corrupt, ends early or late, or the
// CRC differs.
Status InflateMember(absl::Span<const std::byte> compressed, absl::Span<std::byte> out,
                     uint32_t expected_crc32, std::string_view context);

// Writes a zip archive member by member to an OutputFile:
//   BeginMember(name, deflate); AppendMemberData(...) any number of times; EndMember(); ...
//   Finish().
// Local headers carry a zip64 extra field (sizes unknown when the header is written are patched
// in afterwards, as numpy's writer does); the central directory and end records switch to zip64
// only where a value needs it. Times are fixed at 1980-01-01 00:00 so output is reproducible.
class ZipWriter {
 public:
  explicit ZipWriter(OutputFile* file);
  ~ZipWriter();
  ZipWriter(const ZipWriter&) = delete;
  ZipWriter& operator=(const ZipWriter&) = delete;

  Status BeginMember(std::string_view name, bool deflate);
  Status AppendMemberData(const std::byte* data, int64_t size);
  Status EndMember();
  // Writes the central directory and the end records. The caller then commits the file.
  Status Finish();

 private:
  Status Deflate(const std::byte* data, int64_t size, bool finish);

  OutputFile* file_;
  std::vector<ZipMember> members_;
  bool in_member_ = false;
  uint32_t crc32_ = 0;
  int64_t uncompressed_size_ = 0;
  z_stream_s* deflater_ = nullptr;
  std::vector<std::byte> deflate_buffer_;
};

}  // namespace ferry::io_internal
