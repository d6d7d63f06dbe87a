// OutputFile: a file being written, that appears under its final name only when complete.
//
// Create opens "<path>.partial"; Commit closes it and renames it to `path`. If the object is
// destroyed without a successful Commit (an error on the way), the partial file is removed.
// Writes go straight to the file descriptor: callers write large pieces (tensor chunks) or few
// small ones (headers). Movable, not copyable; not thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "ferry/core/status.h"

namespace ferry::io_internal {

class OutputFile {
 public:
  static StatusOr<OutputFile> Create(const std::string& path);

  OutputFile(OutputFile&& other) noexcept;
  OutputFile& operator=(OutputFile&& other) = delete;
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile();

  // Appends `size` bytes.
  Status Write(const void* data, int64_t size);
  // Overwrites `size` bytes at `offset` (< position()), leaving position() unchanged: for headers
  // whose fields are known only after the data was written.
  Status WriteAt(int64_t offset, const void* data, int64_t size);
  // Bytes written so far (the offset of the next Write).
  int64_t position() const { return position_; }
  const std::string& path() const { return path_; }

  // Closes the file and renames it to its final path.
  Status Commit();

 private:
  OutputFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  std::string PartialPath() const { return path_ + ".partial"; }

  int fd_ = -1;
  std::string path_;
  int64_t position_ = 0;
};

}  // namespace ferry::io_internal
