// Helpers for the io tests: temporary files, and builders for (possibly malformed) safetensors,
// .npy and zip bytes, so each test states the one rule it breaks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"
#include "ferry/io/tensor_file.h"
#include "gtest/gtest.h"

namespace ferry::io_test {

// A fresh directory under the test's temporary directory, removed at destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  std::string Path(std::string_view name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

void WriteFileBytes(const std::string& path, std::string_view bytes);
std::string ReadFileBytes(const std::string& path);

// Parses `bytes` held in memory as `display_name`, with the format detected from the bytes
// unless `format` is given.
StatusOr<TensorFile> ParseBytes(std::string_view bytes, std::string display_name = "test-file",
                                std::optional<TensorFileFormat> format = std::nullopt,
                                bool verify_stored_crc32 = false);

// HostView::Dense, out of line: GCC 12 with ASan reports a false -Wmaybe-uninitialized on the
// temporary Dims inside HostView::Dense when it is inlined into a large test body.
HostView DenseView(const void* data, DType dtype, std::vector<int64_t> dims);

// Little-endian integer bytes.
std::string Le16(uint16_t value);
std::string Le32(uint32_t value);
std::string Le64(uint64_t value);

// A safetensors file: the 8-byte size of `header`, `header`, then `data`.
std::string SafetensorsBytes(std::string_view header, std::string_view data);

// A .npy file: magic, version, header length, `dict` padded with spaces and '\n' to 64 bytes
// (for versions 1.0 to 3.0), then `data`.
std::string NpyBytes(std::string_view dict, std::string_view data, int major = 1);

// The raw bytes of `count` values of T.
template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

// A zip archive built member by member (stored members only, or raw deflate bytes given by the
// test), with knobs to break one rule at a time.
struct ZipMemberSpec {
  std::string name = {};
  std::string data = {};  // as stored in the archive
  uint16_t method = 0;
  uint32_t crc32 = 0;  // computed from `data` when `compute_crc` is set
  bool compute_crc = true;
  int64_t uncompressed_size = -1;    // -1: data.size()
  std::string local_name = {};       // empty: same as name
  bool zip64_local_extra = true;     // numpy's layout: sizes in a zip64 extra of the local header
  bool zip64_central_extra = false;  // sizes and offset saturated, values in a zip64 extra
  uint16_t flags = 0;
};
struct ZipOptions {
  bool zip64_end_records = false;
  std::string prefix;   // bytes before the archive
  std::string comment;  // archive comment
};
std::string ZipBytes(const std::vector<ZipMemberSpec>& members, const ZipOptions& options = {});

// Raw deflate of `data` (zlib, no header), for deflated members.
std::string RawDeflate(std::string_view data);
uint32_t Crc32Of(std::string_view data);

}  // namespace ferry::io_test
