#include "ferry/io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "fmt/format.h"

namespace ferry {
namespace {

constexpr std::align_val_t kBytesAlignment{64};

Status ErrnoError(int error_number, const std::string& what) {
  return absl::ErrnoToStatus(error_number,
                             fmt::format("{}: {}", what, std::strerror(error_number)));
}

int64_t PageSize() {
  static const int64_t page_size = [] {
    const long size = sysconf(_SC_PAGESIZE);
    return size > 0 ? static_cast<int64_t>(size) : int64_t{4096};
  }();
  return page_size;
}

}  // namespace

StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, fmt::format("cannot open '{}'", path));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int error_number = errno;
    ::close(fd);
    return ErrnoError(error_number, fmt::format("cannot stat '{}'", path));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    return InvalidArgumentError(fmt::format("'{}' is not a regular file", path));
  }
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->display_name_ = path;
  file->size_ = static_cast<int64_t>(info.st_size);
  if (file->size_ > 0) {
    void* address =
        ::mmap(nullptr, static_cast<size_t>(file->size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      const int error_number = errno;
      ::close(fd);
      return ErrnoError(error_number, fmt::format("cannot map '{}'", path));
    }
    file->data_ = static_cast<const std::byte*>(address);
    file->is_mapped_ = true;
  }
  ::close(fd);  // the mapping keeps the file's contents reachable
  return std::shared_ptr<const MappedFile>(std::move(file));
}

StatusOr<std::shared_ptr<const MappedFile>> MappedFile::FromBytes(absl::Span<const std::byte> bytes,
                                                                  std::string display_name) {
  std::shared_ptr<MappedFile> file(new MappedFile());
  file->display_name_ = std::move(display_name);
  file->size_ = static_cast<int64_t>(bytes.size());
  if (!bytes.empty()) {
    void* buffer = ::operator new[](bytes.size(), kBytesAlignment, std::nothrow);
    if (buffer == nullptr) {
      return ResourceExhaustedError(
          fmt::format("cannot allocate {} bytes for '{}'", bytes.size(), file->display_name_));
    }
    std::memcpy(buffer, bytes.data(), bytes.size());
    file->data_ = static_cast<const std::byte*>(buffer);
  }
  return std::shared_ptr<const MappedFile>(std::move(file));
}

MappedFile::~MappedFile() {
  if (data_ == nullptr) return;
  if (is_mapped_) {
    ::munmap(const_cast<std::byte*>(data_), static_cast<size_t>(size_));
  } else {
    ::operator delete[](const_cast<std::byte*>(data_), kBytesAlignment);
  }
}

void MappedFile::Prefetch(int64_t offset, int64_t size, int touch_threads) const {
  if (!is_mapped_ || size <= 0 || offset >= size_) return;
  offset = std::max<int64_t>(offset, 0);
  const int64_t end = size > size_ - offset ? size_ : offset + size;
  const int64_t page_size = PageSize();
  // madvise wants a page-aligned start; the mapping itself starts on a page.
  const int64_t aligned_begin = offset / page_size * page_size;
  ::madvise(const_cast<std::byte*>(data_) + aligned_begin, static_cast<size_t>(end - aligned_begin),
            MADV_WILLNEED);
  if (touch_threads <= 0) return;

  // Each thread reads one byte of every page of a contiguous slice. The loads are volatile so the
  // compiler keeps them; their values are irrelevant.
  const int64_t num_pages = (end - aligned_begin + page_size - 1) / page_size;
  const int64_t num_threads = std::min<int64_t>(touch_threads, num_pages);
  auto touch = [&](int64_t first_page, int64_t last_page) {
    const volatile std::byte* base = data_ + aligned_begin;
    for (int64_t page = first_page; page < last_page; ++page) {
      const int64_t byte = std::max(page * page_size, offset - aligned_begin);
      (void)base[byte];
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(num_threads));
  for (int64_t t = 0; t < num_threads; ++t) {
    const int64_t first = num_pages * t / num_threads;
    const int64_t last = num_pages * (t + 1) / num_threads;
    try {
      threads.emplace_back(touch, first, last);
    } catch (const std::system_error&) {
      touch(first, last);  // no thread to spare: this slice is touched on the calling thread
    }
  }
  for (std::thread& thread : threads) thread.join();
}

}  // namespace ferry
