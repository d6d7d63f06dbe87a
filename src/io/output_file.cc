#include "src/io/output_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "fmt/format.h"

namespace ferry::io_internal {
namespace {

// "cannot <what> '<path>': <the system's message>" (absl::ErrnoToStatus appends the message).
Status ErrnoError(int error_number, std::string_view what, std::string_view path) {
  return absl::ErrnoToStatus(error_number, fmt::format("cannot {} '{}'", what, path));
}

}  // namespace

StatusOr<OutputFile> OutputFile::Create(const std::string& path) {
  const std::string partial = path + ".partial";
  const int fd = ::open(partial.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "create", partial);
  return OutputFile(fd, path);
}

OutputFile::OutputFile(OutputFile&& other) noexcept
    : fd_(other.fd_), path_(std::move(other.path_)), position_(other.position_) {
  other.fd_ = -1;
}

OutputFile::~OutputFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(PartialPath().c_str());
}

Status OutputFile::Write(const void* data, int64_t size) {
  FERRY_RETURN_IF_ERROR(WriteAt(position_, data, size));
  position_ += size;
  return OkStatus();
}

Status OutputFile::WriteAt(int64_t offset, const void* data, int64_t size) {
  if (fd_ < 0) return FailedPreconditionError(fmt::format("'{}' is already closed", path_));
  const auto* bytes = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t written = ::pwrite(fd_, bytes, static_cast<size_t>(size), offset);
    if (written < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "write", PartialPath());
    }
    bytes += written;
    offset += written;
    size -= written;
  }
  return OkStatus();
}

Status OutputFile::Commit() {
  if (fd_ < 0) return FailedPreconditionError(fmt::format("'{}' is already closed", path_));
  const int fd = fd_;
  fd_ = -1;
  const std::string partial = PartialPath();
  if (::close(fd) != 0) {
    const int error_number = errno;
    ::unlink(partial.c_str());
    return ErrnoError(error_number, "close", partial);
  }
  if (std::rename(partial.c_str(), path_.c_str()) != 0) {
    const int error_number = errno;
    ::unlink(partial.c_str());
    return ErrnoError(error_number, "rename to", path_);
  }
  return OkStatus();
}

}  // namespace ferry::io_internal
