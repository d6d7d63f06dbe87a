#include "tools/ferry/process_usage.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "fmt/format.h"

namespace ferry::cli {
namespace {

// The value in bytes of the "KEY: N kB" lines of a /proc file, one per key; -1 for a key absent.
std::vector<int64_t> ReadKib(const char* path, const std::vector<std::string>& keys) {
  std::vector<int64_t> values(keys.size(), -1);
  std::ifstream in(path);
  std::string key;
  while (in >> key) {
    const auto found = std::find(keys.begin(), keys.end(), key);
    if (found != keys.end()) {
      int64_t kib = 0;
      in >> kib;
      values[static_cast<size_t>(found - keys.begin())] = kib * 1024;
    }
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return values;
}

}  // namespace

int64_t StorageReadBytes() {
  std::ifstream io("/proc/self/io");
  std::string key;
  int64_t value = 0;
  while (io >> key >> value) {
    if (key == "read_bytes:") return value;
  }
  return -1;
}

int64_t PeakRssBytes() { return ReadKib("/proc/self/status", {"VmHWM:"})[0]; }

ResidentMemory CurrentResidentMemory() {
  const std::vector<int64_t> values = ReadKib("/proc/self/status", {"RssAnon:", "RssFile:"});
  return {values[0], values[1]};
}

int64_t MappedFileBytes(const std::vector<std::string>& paths) {
  std::set<std::string> wanted;
  for (const std::string& path : paths) {
    std::error_code error;
    const std::filesystem::path canonical = std::filesystem::canonical(path, error);
    if (!error) wanted.insert(canonical.string());
  }
  // Each mapping: a header line "begin-end perms offset dev inode [path]", then "Key: N kB" lines.
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool counting = false;
  int64_t bytes = 0;
  while (std::getline(smaps, line)) {
    const size_t colon = line.find(':');
    const bool header = colon == std::string::npos || line.find('-') < colon;
    if (header) {
      std::istringstream fields(line);
      std::string range, perms, offset, device, inode, path;
      fields >> range >> perms >> offset >> device >> inode;
      std::getline(fields >> std::ws, path);
      counting = wanted.count(path) > 0;
    } else if (counting && line.rfind("Rss:", 0) == 0) {
      bytes += std::stoll(line.substr(4)) * 1024;
    }
  }
  return bytes;
}

StatusOr<int64_t> PageCacheBytes(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::NotFoundError(fmt::format("cannot open '{}'", path));
  const off_t size = lseek(fd, 0, SEEK_END);
  if (size <= 0) {
    close(fd);
    return 0;
  }
  void* mapped = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  close(fd);
  if (mapped == MAP_FAILED) return absl::InternalError(fmt::format("cannot map '{}'", path));
  const int64_t page = sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> resident(static_cast<size_t>((size + page - 1) / page));
  int64_t bytes = 0;
  if (mincore(mapped, static_cast<size_t>(size), resident.data()) == 0) {
    for (unsigned char flag : resident) bytes += (flag & 1) ? page : 0;
  }
  munmap(mapped, static_cast<size_t>(size));
  return std::min<int64_t>(bytes, size);
}

void DropPageCache(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;  // opening the file reports it
  fdatasync(fd);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}

ResidentMemorySampler::ResidentMemorySampler(std::chrono::microseconds interval) {
  Sample();
  thread_ = std::thread([this, interval] {
    while (!stop_.load()) {
      std::this_thread::sleep_for(interval);
      Sample();
    }
  });
}

void ResidentMemorySampler::Sample() {
  const ResidentMemory now = CurrentResidentMemory();
  peak_anonymous_.store(std::max(peak_anonymous_.load(), now.anonymous));
  peak_file_.store(std::max(peak_file_.load(), now.file));
}

ResidentMemory ResidentMemorySampler::Stop() {
  if (thread_.joinable()) {
    stop_.store(true);
    thread_.join();
    Sample();
  }
  return {peak_anonymous_.load(), peak_file_.load()};
}

}  // namespace ferry::cli
