#include "ferry/io/mapped_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "fmt/format.h"
#include "src/core/fork_locks.h"

namespace ferry {
namespace {

constexpr std::align_val_t kBytesAlignment{64};

// "<what>: <the system's message>" (absl::ErrnoToStatus appends the message itself).
Status ErrnoError(int error_number, const std::string& what) {
  return absl::ErrnoToStatus(error_number, what);
}

int64_t PageSize() {
  static const int64_t page_size = [] {
    const long size = sysconf(_SC_PAGESIZE);
    return size > 0 ? static_cast<int64_t>(size) : int64_t{4096};
  }();
  return page_size;
}

}  // namespace

// The SIGBUS side of MappedFile (see the header). The handler may run on any thread at any time,
// so it touches only lock-free state: a fixed table of slots, each the address range of one live
// mapping and its MappedFile. A slot is claimed (state 1) and published (state 2) by Open, and
// withdrawn by the destructor before munmap; a fault can only hit a published mapping, which is
// alive because the faulting reader holds its MappedFile. The mutex orders the non-signal users
// (registration, CheckAllIntact), never the handler.
struct MappedFileSignals {
  static constexpr int kSlots = 4096;
  struct Slot {
    std::atomic<int> state{0};  // 0 free, 1 being filled, 2 published
    std::atomic<uintptr_t> begin{0};
    std::atomic<uintptr_t> end{0};  // page-rounded
    std::atomic<const MappedFile*> file{nullptr};
  };
  static Slot* Slots() {
    static Slot* slots = new Slot[kSlots];  // never freed: the handler may run during exit
    return slots;
  }
  static std::mutex& Mutex() {
    static auto* mutex = [] {
      auto* created = new std::mutex();
      internal::RegisterForkLock(
          internal::ForkLockRank::kMappedFiles,
          [](void* held) { static_cast<std::mutex*>(held)->lock(); },
          [](void* held) { static_cast<std::mutex*>(held)->unlock(); }, created);
      return created;
    }();
    return *mutex;
  }
  // Calls `visit(file, offset, count)`, under the registry's lock, for each live mapping that
  // [begin, begin + size) overlaps, with the overlap as an offset and size in that file.
  template <typename Visit>
  static void ForEachOverlap(const void* begin, int64_t size, Visit&& visit) {
    const auto range_begin = reinterpret_cast<uintptr_t>(begin);
    const uintptr_t range_end = range_begin + static_cast<uintptr_t>(size);
    std::lock_guard<std::mutex> lock(Mutex());
    Slot* slots = Slots();
    const int used = slots_used.load(std::memory_order_acquire);
    for (int i = 0; i < used; ++i) {
      if (slots[i].state.load(std::memory_order_acquire) != 2) continue;
      const uintptr_t mapping_begin = slots[i].begin.load(std::memory_order_relaxed);
      const uintptr_t mapping_end = slots[i].end.load(std::memory_order_relaxed);
      if (range_end <= mapping_begin || range_begin >= mapping_end) continue;
      const uintptr_t from = std::max(range_begin, mapping_begin);
      const uintptr_t to = std::min(range_end, mapping_end);
      visit(*slots[i].file.load(std::memory_order_relaxed),
            static_cast<int64_t>(from - mapping_begin), static_cast<int64_t>(to - from));
    }
  }

  static inline std::atomic<uint64_t> events{0};
  // Published mappings: none means no memory can be a mapping's.
  static inline std::atomic<int64_t> live{0};
  // One past the highest slot ever published (Register takes the lowest free one): the scans
  // stop there, not at kSlots.
  static inline std::atomic<int> slots_used{0};
  static inline struct sigaction previous {};
  static inline uintptr_t page_size = 4096;

  // Async-signal-safe: write(2) only, no allocation, errno preserved.
  static void WriteToStderr(const char* text, size_t size) {
    while (size > 0) {
      const ssize_t written = ::write(STDERR_FILENO, text, size);
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) return;
      text += written;
      size -= static_cast<size_t>(written);
    }
  }
  static void ReportVanishedPages(const MappedFile& file, int64_t offset) {
    const int saved_errno = errno;
    constexpr std::string_view kStart = "ferry: file '";
    constexpr std::string_view kMiddle =
        "' was truncated while it was mapped: reads of its bytes from byte ";
    constexpr std::string_view kEnd =
        " on see zeros, not the file's data (ferry's own transfers of it fail with DataLoss; "
        "replace tensor files instead of rewriting them in place)\n";
    char digits[24];
    size_t count = 0;
    // Where the file ends now (fstat is async-signal-safe): every byte from there on reads as
    // zeros, not only those from the faulting page on. The faulting offset if fstat fails.
    int64_t cut = offset;
    struct stat info {};
    if (file.fd_ >= 0 && ::fstat(file.fd_, &info) == 0) {
      cut = std::min<int64_t>(cut, static_cast<int64_t>(info.st_size));
    }
    auto value = static_cast<uint64_t>(std::max<int64_t>(0, std::min(cut, file.size())));
    do {
      digits[sizeof(digits) - 1 - count++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0 && count < sizeof(digits));
    WriteToStderr(kStart.data(), kStart.size());
    WriteToStderr(file.display_name().data(), file.display_name().size());
    WriteToStderr(kMiddle.data(), kMiddle.size());
    WriteToStderr(digits + sizeof(digits) - count, count);
    WriteToStderr(kEnd.data(), kEnd.size());
    errno = saved_errno;
  }

  // Whether the file of a live mapping is now shorter than its mapping (async-signal-safe: atomic
  // loads and fstat).
  static bool AnyMappedFileCut() {
    Slot* slots = Slots();
    const int used = slots_used.load(std::memory_order_acquire);
    for (int i = 0; i < used; ++i) {
      if (slots[i].state.load(std::memory_order_acquire) != 2) continue;
      const MappedFile* file = slots[i].file.load(std::memory_order_relaxed);
      struct stat now {};
      if (file->fd_ >= 0 && ::fstat(file->fd_, &now) == 0 && now.st_size < file->size_) {
        return true;
      }
    }
    return false;
  }

  static void Handler(int signal_number, siginfo_t* info, void* context) {
    // Raised by this process itself, not by a fault, while a mapped file has been cut: a handler
    // installed after this one re-raising the fault's signal after restoring this one (Python's
    // faulthandler). The faulting load runs again on return and faults for real, with an address
    // to look at; taking the default action here would kill the process over a fault this
    // handler recovers. With no file cut, a raise of SIGBUS is left to what it would do without
    // ferry.
    if (info->si_code <= 0 && info->si_pid == ::getpid() && AnyMappedFileCut()) return;
    const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
    Slot* slots = Slots();
    const int used = slots_used.load(std::memory_order_acquire);
    for (int i = 0; i < used; ++i) {
      Slot& slot = slots[i];
      if (slot.state.load(std::memory_order_acquire) != 2) continue;
      const uintptr_t begin = slot.begin.load(std::memory_order_relaxed);
      const uintptr_t end = slot.end.load(std::memory_order_relaxed);
      if (address < begin || address >= end) continue;
      // Zero pages over the rest of the mapping: the faulting load is retried and reads zeros;
      // later pages past the new end of the file would fault the same way.
      const uintptr_t page = address & ~(page_size - 1);
      void* mapped = ::mmap(reinterpret_cast<void*>(page), end - page, PROT_READ,
                            MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
      if (mapped == MAP_FAILED) break;
      const MappedFile* file = slot.file.load(std::memory_order_relaxed);
      const auto offset = static_cast<int64_t>(page - begin);
      file->MarkVanishedFrom(offset);
      events.fetch_add(1, std::memory_order_relaxed);
      // Once per mapping, on stderr: a reader that is not ferry (numpy on an array of the file)
      // gets the zeros with no error of its own, so the process says what happened.
      if (!file->vanish_reported_.exchange(true, std::memory_order_relaxed)) {
        ReportVanishedPages(*file, offset);
      }
      return;
    }
    // Not a mapping of ours: what would have happened without this handler.
    if ((previous.sa_flags & SA_SIGINFO) != 0 && previous.sa_sigaction != nullptr) {
      previous.sa_sigaction(signal_number, info, context);
    } else if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
      previous.sa_handler(signal_number);
    } else {
      ::signal(SIGBUS, SIG_DFL);  // the faulting instruction runs again and gets the default
      // A signal that was sent (kill, raise) does not come again by itself: sent again, it gets
      // the default action as it would have without this handler.
      if (info->si_code <= 0) ::raise(SIGBUS);
    }
  }

  static void InstallOnce() {
    static const bool installed = [] {
      page_size = static_cast<uintptr_t>(PageSize());
      Slots();
      struct sigaction action {};
      action.sa_sigaction = &Handler;
      action.sa_flags = SA_SIGINFO | SA_NODEFER;
      sigemptyset(&action.sa_mask);
      return ::sigaction(SIGBUS, &action, &previous) == 0;
    }();
    (void)installed;
  }

  // Publishes `file`'s mapping; -1 when the table is full (the mapping is then unprotected).
  static int Register(const MappedFile* file) {
    InstallOnce();
    std::lock_guard<std::mutex> lock(Mutex());
    Slot* slots = Slots();
    for (int i = 0; i < kSlots; ++i) {
      if (slots[i].state.load(std::memory_order_relaxed) != 0) continue;
      slots[i].state.store(1, std::memory_order_relaxed);
      const auto begin = reinterpret_cast<uintptr_t>(file->data());
      const auto length = static_cast<uintptr_t>(file->size());
      slots[i].begin.store(begin, std::memory_order_relaxed);
      slots[i].end.store(begin + (length + page_size - 1) / page_size * page_size,
                         std::memory_order_relaxed);
      slots[i].file.store(file, std::memory_order_relaxed);
      slots[i].state.store(2, std::memory_order_release);
      live.fetch_add(1, std::memory_order_relaxed);
      if (i + 1 > slots_used.load(std::memory_order_relaxed)) {
        slots_used.store(i + 1, std::memory_order_release);
      }
      return i;
    }
    return -1;
  }

  static void Unregister(int index) {
    std::lock_guard<std::mutex> lock(Mutex());
    Slots()[index].state.store(0, std::memory_order_release);
    live.fetch_sub(1, std::memory_order_relaxed);
  }
};

StatusOr<std::shared_ptr<const MappedFile>> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever; the
  // descriptor is refused below unless it is a regular file, where the flag changes nothing.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
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
  // Blocking again for ReadAt's preads (regular files ignore the flag; this keeps it that way).
  if (const int flags = ::fcntl(fd, F_GETFL); flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
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
    file->slot_ = MappedFileSignals::Register(file.get());
  }
  file->fd_ = fd;  // kept for ReadAt
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
  if (fd_ >= 0) ::close(fd_);
  if (data_ == nullptr) return;
  if (is_mapped_) {
    if (slot_ >= 0) MappedFileSignals::Unregister(slot_);
    ::munmap(const_cast<std::byte*>(data_), static_cast<size_t>(size_));
  } else {
    ::operator delete[](const_cast<std::byte*>(data_), kBytesAlignment);
  }
}

Status MappedFile::ReadAt(int64_t offset, int64_t size, void* dst) const {
  if (fd_ < 0) {
    return FailedPreconditionError(fmt::format(
        "'{}' is bytes in memory, not a file: it cannot be read with pread", display_name_));
  }
  auto* out = static_cast<std::byte*>(dst);
  int64_t done = 0;
  while (done < size) {
    // At most 1 GiB a call: Linux reads at most about 2 GiB per pread.
    const size_t count = static_cast<size_t>(std::min<int64_t>(size - done, int64_t{1} << 30));
    const ssize_t got = ::pread(fd_, out + done, count, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, fmt::format("cannot read bytes {} to {} of '{}'", offset + done,
                                           offset + size, display_name_));
    }
    if (got == 0) {
      return absl::DataLossError(fmt::format(
          "'{}' ends at byte {}, before the {} bytes at offset {} it held when opened (the file "
          "was truncated while open)",
          display_name_, offset + done, size, offset));
    }
    done += got;
  }
  return OkStatus();
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

void MappedFile::ReleasePages(int64_t offset, int64_t size) const {
  if (!is_mapped_ || size <= 0 || offset >= size_) return;
  offset = std::max<int64_t>(offset, 0);
  const int64_t end = size > size_ - offset ? size_ : offset + size;
  const int64_t page_size = PageSize();
  // Whole pages only: a page shared with a neighbouring tensor may still be read.
  const int64_t first = (offset + page_size - 1) / page_size * page_size;
  const int64_t last =
      end == size_ ? (end + page_size - 1) / page_size * page_size : end / page_size * page_size;
  if (last <= first) return;
  ::madvise(const_cast<std::byte*>(data_) + first, static_cast<size_t>(last - first),
            MADV_DONTNEED);
}

Status MappedFile::CheckIntact() const {
  const int64_t from = vanished_from_.load(std::memory_order_relaxed);
  if (from == INT64_MAX) return OkStatus();
  return absl::DataLossError(fmt::format(
      "file '{}' was truncated while it was mapped: what was read of it from offset {} on is "
      "zeros, not the file's data (replace tensor files instead of rewriting them in place)",
      display_name_, std::min(from, size_)));
}

void MappedFile::MarkVanishedFrom(int64_t offset) const {
  int64_t seen = vanished_from_.load(std::memory_order_relaxed);
  while (offset < seen &&
         !vanished_from_.compare_exchange_weak(seen, offset, std::memory_order_relaxed)) {
  }
}

Status MappedFile::CheckRangeIntact(int64_t offset, int64_t size) const {
  const int64_t from = vanished_from_.load(std::memory_order_relaxed);
  // Pages vanish from the new end of the file onwards: the range is hit when it ends past that.
  if (from != INT64_MAX && offset + size > from) return CheckIntact();
  // A cut inside the range's last page raises no SIGBUS: that page stays mapped, with zeros past
  // the new end. Only the file's size tells (one fstat per checked range).
  struct stat now {};
  if (!is_mapped_ || fd_ < 0 || size <= 0 || ::fstat(fd_, &now) != 0 ||
      now.st_size >= offset + size) {
    return OkStatus();
  }
  const auto new_size = static_cast<int64_t>(now.st_size);
  MarkVanishedFrom(new_size);
  return absl::DataLossError(fmt::format(
      "file '{}' was truncated to {} bytes while it was mapped: the bytes [{}, {}) read from it "
      "reach past its new end, and what was read there is zeros, not the file's data (replace "
      "tensor files instead of rewriting them in place)",
      display_name_, new_size, offset, offset + size));
}

bool MappedFile::AnyMapped() { return MappedFileSignals::live.load(std::memory_order_relaxed) > 0; }

Status MappedFile::CheckMemoryIntact(const void* begin, int64_t size) {
  if (!AnyMapped() || size <= 0) return OkStatus();  // no memory is a mapping's
  Status status;
  MappedFileSignals::ForEachOverlap(begin, size,
                                    [&](const MappedFile& file, int64_t offset, int64_t count) {
                                      if (status.ok())
                                        status = file.CheckRangeIntact(offset, count);
                                    });
  return status;
}

void MappedFile::ReleaseMemory(const void* begin, int64_t size) {
  if (size <= 0) return;
  MappedFileSignals::ForEachOverlap(begin, size,
                                    [](const MappedFile& file, int64_t offset, int64_t count) {
                                      file.ReleasePages(offset, count);
                                    });
}

std::optional<MappedFile::Location> MappedFile::Locate(const void* begin, int64_t size) {
  if (size <= 0 || !AnyMapped()) return std::nullopt;
  std::optional<Location> found;
  MappedFileSignals::ForEachOverlap(begin, size,
                                    [&](const MappedFile& file, int64_t offset, int64_t count) {
                                      if (count == size) found = Location{&file, offset};
                                    });
  return found;
}

void MappedFile::PrefetchMemory(const void* begin, int64_t size, int touch_threads) {
  if (size <= 0) return;
  struct Part {
    const MappedFile* file;
    int64_t offset;
    int64_t count;
  };
  std::vector<Part> parts;
  MappedFileSignals::ForEachOverlap(begin, size,
                                    [&](const MappedFile& file, int64_t offset, int64_t count) {
                                      parts.push_back({&file, offset, count});
                                    });
  for (const Part& part : parts) part.file->Prefetch(part.offset, part.count, touch_threads);
}

uint64_t MappedFile::VanishedPageEvents() {
  return MappedFileSignals::events.load(std::memory_order_relaxed);
}

Status MappedFile::CheckAllIntact() {
  std::lock_guard<std::mutex> lock(MappedFileSignals::Mutex());
  MappedFileSignals::Slot* slots = MappedFileSignals::Slots();
  for (int i = 0; i < MappedFileSignals::kSlots; ++i) {
    if (slots[i].state.load(std::memory_order_acquire) != 2) continue;
    Status status = slots[i].file.load(std::memory_order_relaxed)->CheckIntact();
    if (!status.ok()) return status;
  }
  return OkStatus();
}

}  // namespace ferry
