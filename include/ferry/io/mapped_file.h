// MappedFile: the read-only bytes of a tensor file, shared by every tensor read from it.
//
// A MappedFile is either a file mapped read-only into memory (`Open`, mmap with MAP_PRIVATE) or an
// owned in-memory copy of some bytes (`FromBytes`, used by tests and fuzzers). Either way the bytes
// never change and stay valid for the life of the object, which is always held by
// `std::shared_ptr<const MappedFile>`: every TensorSource borrowed from a file holds such a
// reference, so the mapping is unmapped only after the last transfer that reads it has dropped its
// source. All methods are thread-safe.
//
// A mapped file is only as immutable as the file on disk: if another process truncates the file
// while it is mapped, touching the vanished pages raises SIGBUS (mmap's contract). ferry turns
// that signal into an error instead of a crash: the first `Open` installs a SIGBUS handler which,
// for a fault inside a live mapping of a MappedFile, maps zero pages over the vanished part of
// the mapping (so the faulting read, on whichever thread, completes with zeros) and marks the
// file. A transfer that read the vanished pages then fails with DataLoss naming the file, for
// every caller: each tensor source of a file checks its own byte range once read
// (`CheckRangeIntact`, through TensorSource::CheckRead), and memory of a mapping reached another
// way is checked by address (`CheckMemoryIntact`); `CheckIntact` says it for the whole file. A
// transfer of another file, or of this file's bytes before the cut, stays OK. A fault anywhere
// else goes to the handler that was installed before (or the default action). Do not truncate or
// rewrite tensor files in place while they are open; replace them (write a new file, then
// rename), which leaves the mapped old contents intact.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/types/span.h"
#include "ferry/core/status.h"

namespace ferry {

class MappedFile {
 public:
  // Maps the regular file at `path` read-only. NotFound / PermissionDenied / ... (from errno) when
  // it cannot be opened; InvalidArgument when it is not a regular file. An empty file maps to an
  // empty byte range (data() == nullptr). The file descriptor stays open with the mapping, for
  // ReadAt (close-on-exec; closed with the object).
  static StatusOr<std::shared_ptr<const MappedFile>> Open(const std::string& path);

  // Copies `bytes` into an owned, 64-byte aligned buffer of exactly that size (so that sanitizers
  // catch any read past the end). `display_name` is used in error messages in place of a path.
  // ResourceExhausted when the allocation fails.
  static StatusOr<std::shared_ptr<const MappedFile>> FromBytes(absl::Span<const std::byte> bytes,
                                                               std::string display_name);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The bytes; valid for the life of this object.
  const std::byte* data() const { return data_; }
  int64_t size() const { return size_; }
  absl::Span<const std::byte> bytes() const { return {data_, static_cast<size_t>(size_)}; }
  // The path (for mapped files) or the display name (for in-memory bytes).
  const std::string& display_name() const { return display_name_; }
  // True for a file mapping, false for in-memory bytes.
  bool is_mapped() const { return is_mapped_; }

  // Asks the kernel to read [offset, offset + size) of a mapped file ahead, so that a transfer does
  // not fault it in page by page from one thread:
  //   - always: madvise(MADV_WILLNEED) on the range (page-aligned), which starts asynchronous
  //     read-ahead and returns at once;
  //   - with `touch_threads` > 0: additionally reads one byte of every page of the range from that
  //     many threads at once and returns when all pages are resident. Several threads keep several
  //     reads in flight, which a cold file on a fast SSD needs to reach its bandwidth.
  // The range is clamped to the file. A no-op for in-memory bytes. Errors of madvise are ignored:
  // prefetching is advice, and the data stays readable either way.
  void Prefetch(int64_t offset, int64_t size, int touch_threads = 0) const;

  // Gives back the memory of the pages that lie wholly inside [offset, offset + size) of a mapped
  // file (madvise(MADV_DONTNEED)): they leave the process's resident set, the page cache keeps
  // them, and a later read faults them in again with the same bytes (the mapping is read-only and
  // private, so nothing written is lost). What a load calls on ranges it has consumed, so that it
  // does not hold the file's pages and the device copy at once. A no-op for in-memory bytes;
  // errors of madvise are ignored (advice).
  void ReleasePages(int64_t offset, int64_t size) const;

  // Where the memory [begin, begin + size) lies wholly inside one live mapping of a MappedFile:
  // that file and the offset of `begin` in it; nullopt otherwise (memory of no mapping, or
  // across mappings). The caller keeps the mapping alive while it uses the pointer (it holds
  // views of it). For callers that hold only the address (a numpy view of the mapping).
  struct Location {
    const MappedFile* file = nullptr;
    int64_t offset = 0;
  };
  static std::optional<Location> Locate(const void* begin, int64_t size);

  // Reads [offset, offset + size) of the file into `dst` with pread, through the descriptor kept
  // with the mapping (the same file, whatever has been renamed since), without touching the
  // mapping: a load that reads this way holds one copy of the bytes, `dst`'s, beside the page
  // cache. Safe from several threads at once (pread has no shared file position). DataLoss naming
  // the file when it ends before offset + size (truncated since it was opened); the errno's error
  // for a failed read; FailedPrecondition for in-memory bytes (FromBytes), which have no file.
  Status ReadAt(int64_t offset, int64_t size, void* dst) const;

  // ReleasePages for the memory [begin, begin + size) where it lies in a live mapping of a
  // MappedFile (memory of no mapping is left alone). For callers that hold only the address (a
  // numpy view of the mapping).
  static void ReleaseMemory(const void* begin, int64_t size);
  // Prefetch(offset, size, touch_threads) for the memory [begin, begin + size) where it lies in a
  // live mapping of a MappedFile. The caller keeps that mapping alive meanwhile (it holds views of
  // it); the registry's lock is not held while the pages are read.
  static void PrefetchMemory(const void* begin, int64_t size, int touch_threads);

  // OK, or DataLoss naming the file when pages of its mapping vanished (the file was truncated
  // while mapped) and were read since: what was read there reads as zeros, not as the file.
  Status CheckIntact() const;
  // The same for the bytes [offset, offset + size) alone: DataLoss when a vanished page lies
  // before their end, or the file now ends before them (a cut inside their last page leaves it
  // mapped, reading zeros past the cut, with no SIGBUS: a fstat tells), so what a read of them got
  // may be zeros; OK otherwise, whatever happened to the rest of the file. What a tensor's
  // transfer checks once it has read the tensor.
  Status CheckRangeIntact(int64_t offset, int64_t size) const;

  // DataLoss when the memory [begin, begin + size) lies in a live mapping whose pages vanished
  // there or before, or whose file now ends before it (a read of it got zeros), OK otherwise
  // (memory of no mapping included). Free while no file is mapped; else a look through the live
  // mappings, and CheckRangeIntact (one fstat) for each the memory lies in. For sources that do
  // not know they are a file's.
  static Status CheckMemoryIntact(const void* begin, int64_t size);
  // Whether any mapping is live in the process (if none, no memory is a mapping's).
  static bool AnyMapped();

  // How many vanished-page faults of any mapping have been recovered so far in this process:
  // compare before and after a read to learn cheaply whether any happened.
  static uint64_t VanishedPageEvents();
  // DataLoss naming every live mapped file with vanished pages, or OK.
  static Status CheckAllIntact();

 private:
  MappedFile() = default;
  friend struct MappedFileSignals;

  const std::byte* data_ = nullptr;
  int64_t size_ = 0;
  bool is_mapped_ = false;
  int fd_ = -1;  // the mapped file's descriptor (ReadAt); -1 for in-memory bytes
  std::string display_name_;
  int slot_ = -1;  // the fault handler's registry slot of this mapping, -1 when not registered
  // Lowers vanished_from_ to `offset` (lock-free: the SIGBUS handler calls it).
  void MarkVanishedFrom(int64_t offset) const;

  // Set by the SIGBUS handler (a vanished page's offset) and CheckRangeIntact (the file's new
  // size): the smallest offset of the mapping from which reads got zeros (int64 max when none).
  mutable std::atomic<int64_t> vanished_from_{INT64_MAX};
  // Set by the SIGBUS handler once it has said on stderr that this mapping lost pages.
  mutable std::atomic<bool> vanish_reported_{false};
};

}  // namespace ferry
