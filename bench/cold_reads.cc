// cold_reads: how fast this machine reads a file that is not in the page cache, the way a load
// reads it, without ferry: pieces of the file from a tensor-like odd offset, several in flight,
// into fresh memory that each piece faults in first (MADV_POPULATE_WRITE), as ferry's load does.
// `buffered` preads straight into that memory; `direct` reads whole pages with O_DIRECT into an
// aligned bounce buffer per thread and copies them out. The file is dropped from the page cache
// (POSIX_FADV_DONTNEED) before the timed read.
//
// A yardstick for choosing a load's read count and whether direct I/O pays (docs/performance.md,
// "Cold reads"), built beside ferry-bench:
//   build/plain/ferry-cold-reads FILE buffered|direct THREADS PIECE_MIB [REPEATS]
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>
#include <vector>

namespace {

constexpr int64_t kPage = 4096;
constexpr int64_t kOddOffset = 13 * 8;  // where a tensor's bytes might start: 8-byte aligned
#ifndef MADV_POPULATE_WRITE
constexpr int MADV_POPULATE_WRITE = 23;
#endif

struct Run {
  int buffered_fd = -1;
  int direct_fd = -1;
  bool direct = false;
  int64_t size = 0;
  int64_t piece = 0;
  std::byte* destination = nullptr;
  std::atomic<int64_t> next{0};
};

[[noreturn]] void Fail(const char* what) {
  std::perror(what);
  std::exit(1);
}

void ReadBuffered(const Run& run, int64_t offset, int64_t length) {
  for (int64_t done = 0; done < length;) {
    const ssize_t got = pread(run.buffered_fd, run.destination + offset + done,
                              static_cast<size_t>(length - done), offset + done);
    if (got <= 0) Fail("pread");
    done += got;
  }
}

void ReadDirect(const Run& run, int64_t offset, int64_t length, std::byte* bounce) {
  const int64_t begin = offset / kPage * kPage;
  const int64_t end = (offset + length + kPage - 1) / kPage * kPage;
  for (int64_t done = 0; done < end - begin;) {
    const ssize_t got =
        pread(run.direct_fd, bounce + done, static_cast<size_t>(end - begin - done), begin + done);
    if (got < 0) Fail("pread (O_DIRECT)");
    if (got == 0) break;  // the file ends inside the last page
    done += got;
  }
  std::memcpy(run.destination + offset, bounce + (offset - begin), static_cast<size_t>(length));
}

void Work(Run& run) {
  std::byte* bounce = nullptr;
  if (run.direct && posix_memalign(reinterpret_cast<void**>(&bounce), kPage,
                                   static_cast<size_t>(run.piece + 2 * kPage)) != 0) {
    Fail("posix_memalign");
  }
  while (true) {
    const int64_t offset = run.next.fetch_add(1) * run.piece + kOddOffset;
    if (offset >= run.size) break;
    const int64_t length = std::min(run.piece, run.size - offset);
    const int64_t page_begin = offset / kPage * kPage;
    madvise(run.destination + page_begin, static_cast<size_t>(offset + length - page_begin),
            MADV_POPULATE_WRITE);
    if (run.direct) {
      ReadDirect(run, offset, length, bounce);
    } else {
      ReadBuffered(run, offset, length);
    }
  }
  std::free(bounce);
}

double ReadOnce(const char* path, bool direct, int threads, int64_t piece) {
  Run run;
  run.direct = direct;
  run.piece = piece;
  run.buffered_fd = open(path, O_RDONLY);
  run.direct_fd = open(path, O_RDONLY | O_DIRECT);
  if (run.buffered_fd < 0 || (direct && run.direct_fd < 0)) Fail(path);
  struct stat info {};
  if (fstat(run.buffered_fd, &info) != 0) Fail("fstat");
  run.size = info.st_size;
  posix_fadvise(run.buffered_fd, 0, 0, POSIX_FADV_DONTNEED);
  void* memory = mmap(nullptr, static_cast<size_t>(run.size + kPage), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) Fail("mmap");
  run.destination = static_cast<std::byte*>(memory);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) workers.emplace_back([&run] { Work(run); });
  for (std::thread& worker : workers) worker.join();
  const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - start;
  munmap(memory, static_cast<size_t>(run.size + kPage));
  close(run.buffered_fd);
  if (run.direct_fd >= 0) close(run.direct_fd);
  return seconds.count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s FILE buffered|direct THREADS PIECE_MIB [REPEATS]\n", argv[0]);
    return 2;
  }
  const bool direct = std::string_view(argv[2]) == "direct";
  const int threads = std::max(1, std::atoi(argv[3]));
  const int64_t piece = std::max<int64_t>(1, std::atoll(argv[4])) << 20;
  const int repeats = argc > 5 ? std::max(1, std::atoi(argv[5])) : 1;
  for (int r = 0; r < repeats; ++r) {
    std::printf("%s, %d threads, %lld MiB pieces: %.3f s\n", direct ? "direct" : "buffered",
                threads, static_cast<long long>(piece >> 20),
                ReadOnce(argv[1], direct, threads, piece));
  }
  return 0;
}
