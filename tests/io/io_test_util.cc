#include "io_test_util.h"

#include <unistd.h>
#include <zlib.h>

#include <fstream>
#include <random>
#include <sstream>

namespace ferry::io_test {

TempDir::TempDir() {
  static int counter = 0;
  path_ = std::filesystem::temp_directory_path() /
          ("ferry_io_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void WriteFileBytes(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

std::string ReadFileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

StatusOr<TensorFile> ParseBytes(std::string_view bytes, std::string display_name,
                                std::optional<TensorFileFormat> format, bool verify_stored_crc32) {
  FERRY_ASSIGN_OR_RETURN(
      std::shared_ptr<const MappedFile> file,
      MappedFile::FromBytes({reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()},
                            std::move(display_name)));
  TensorFileOptions options;
  options.format = format;
  options.verify_stored_crc32 = verify_stored_crc32;
  return ParseTensorFile(std::move(file), options);
}

[[gnu::noinline]] HostView DenseView(const void* data, DType dtype, std::vector<int64_t> dims) {
  return HostView::Dense(data, dtype, dims);
}

std::string Le16(uint16_t value) {
  return {static_cast<char>(value), static_cast<char>(value >> 8)};
}
std::string Le32(uint32_t value) { return Le16(value & 0xFFFF) + Le16(value >> 16); }
std::string Le64(uint64_t value) { return Le32(value & 0xFFFFFFFF) + Le32(value >> 32); }

std::string SafetensorsBytes(std::string_view header, std::string_view data) {
  return Le64(header.size()) + std::string(header) + std::string(data);
}

std::string NpyBytes(std::string_view dict, std::string_view data, int major) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header(dict);
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  out += major == 1 ? Le16(static_cast<uint16_t>(header.size()))
                    : Le32(static_cast<uint32_t>(header.size()));
  return out + header + std::string(data);
}

uint32_t Crc32Of(std::string_view data) {
  return static_cast<uint32_t>(
      crc32_z(0, reinterpret_cast<const Bytef*>(data.data()), data.size()));
}

std::string RawDeflate(std::string_view data) {
  z_stream stream{};
  deflateInit2(&stream, 6, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
  std::string out(deflateBound(&stream, data.size()) + 16, '\0');
  stream.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = reinterpret_cast<Bytef*>(out.data());
  stream.avail_out = static_cast<uInt>(out.size());
  deflate(&stream, Z_FINISH);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

std::string ZipBytes(const std::vector<ZipMemberSpec>& members, const ZipOptions& options) {
  std::string out = options.prefix;
  std::string directory;
  for (const ZipMemberSpec& member : members) {
    const uint64_t offset = out.size() - options.prefix.size();
    const uint32_t crc = member.compute_crc ? Crc32Of(member.data) : member.crc32;
    const uint64_t size = member.uncompressed_size < 0
                              ? member.data.size()
                              : static_cast<uint64_t>(member.uncompressed_size);
    const std::string& local_name = member.local_name.empty() ? member.name : member.local_name;
    std::string local_extra;
    if (member.zip64_local_extra)
      local_extra = Le16(1) + Le16(16) + Le64(size) + Le64(member.data.size());
    out += Le32(0x04034b50) + Le16(45) + Le16(member.flags) + Le16(member.method) + Le16(0) +
           Le16(0x21) + Le32(crc) +
           (member.zip64_local_extra ? Le32(0xFFFFFFFF) + Le32(0xFFFFFFFF)
                                     : Le32(static_cast<uint32_t>(member.data.size())) +
                                           Le32(static_cast<uint32_t>(size))) +
           Le16(static_cast<uint16_t>(local_name.size())) +
           Le16(static_cast<uint16_t>(local_extra.size())) + local_name + local_extra + member.data;
    std::string central_extra;
    if (member.zip64_central_extra) {
      central_extra = Le16(1) + Le16(24) + Le64(size) + Le64(member.data.size()) + Le64(offset);
    }
    directory += Le32(0x02014b50) + Le16(0x032D) + Le16(45) + Le16(member.flags) +
                 Le16(member.method) + Le16(0) + Le16(0x21) + Le32(crc) +
                 (member.zip64_central_extra ? Le32(0xFFFFFFFF) + Le32(0xFFFFFFFF)
                                             : Le32(static_cast<uint32_t>(member.data.size())) +
                                                   Le32(static_cast<uint32_t>(size))) +
                 Le16(static_cast<uint16_t>(member.name.size())) +
                 Le16(static_cast<uint16_t>(central_extra.size())) + Le16(0) + Le16(0) + Le16(0) +
                 Le32(0) +
                 Le32(member.zip64_central_extra ? 0xFFFFFFFF : static_cast<uint32_t>(offset)) +
                 member.name + central_extra;
  }
  const uint64_t directory_offset = out.size() - options.prefix.size();
  out += directory;
  const uint64_t directory_end = out.size() - options.prefix.size();
  if (options.zip64_end_records) {
    out += Le32(0x06064b50) + Le64(44) + Le16(0x032D) + Le16(45) + Le32(0) + Le32(0) +
           Le64(members.size()) + Le64(members.size()) + Le64(directory.size()) +
           Le64(directory_offset);
    out += Le32(0x07064b50) + Le32(0) + Le64(directory_end) + Le32(1);
    out += Le32(0x06054b50) + Le16(0) + Le16(0) + Le16(0xFFFF) + Le16(0xFFFF) + Le32(0xFFFFFFFF) +
           Le32(0xFFFFFFFF);
  } else {
    out += Le32(0x06054b50) + Le16(0) + Le16(0) + Le16(static_cast<uint16_t>(members.size())) +
           Le16(static_cast<uint16_t>(members.size())) +
           Le32(static_cast<uint32_t>(directory.size())) +
           Le32(static_cast<uint32_t>(directory_offset));
  }
  out += Le16(static_cast<uint16_t>(options.comment.size())) + options.comment;
  return out;
}

}  // namespace ferry::io_test
