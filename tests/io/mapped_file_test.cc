// A file truncated under its mapping: no SIGBUS, the lost pages read as zeros, ferry's check says
// DataLoss naming the file, and a reader that is not ferry is told on stderr once per file.
#include "ferry/io/mapped_file.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

// Writes `contents` to a file named `stem` and this process's id in the temp folder; its path.
std::string WriteTempFile(const std::string& stem, const std::vector<unsigned char>& contents) {
  const std::string path =
      (std::filesystem::temp_directory_path() / (stem + std::to_string(getpid()))).string();
  FILE* file = std::fopen(path.c_str(), "wb");
  EXPECT_NE(file, nullptr) << path;
  if (file != nullptr) {
    EXPECT_EQ(std::fwrite(contents.data(), 1, contents.size(), file), contents.size());
    std::fclose(file);
  }
  return path;
}

TEST(MappedFileTest, PagesThatVanishReadAsZerosAndAreReportedOnceNamingTheFile) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtimes take over fault signals (ASan's handle_sigbus, TSan's "
                  "signal handling); the plain build runs this test";
#endif
  const std::string path =
      WriteTempFile("ferry_truncated_", std::vector<unsigned char>(64 << 10, 0xab));
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_TRUE((*mapped)->CheckIntact().ok());
  // Cut inside the second page: its tail reads as zeros without a fault (as past any file's end),
  // the first fault is at the third page, and the note names where the file now ends.
  ASSERT_EQ(truncate(path.c_str(), 5000), 0);

  // A plain memcpy stands for numpy: a reader ferry does not control.
  std::vector<unsigned char> read((*mapped)->size());
  testing::internal::CaptureStderr();
  std::memcpy(read.data(), (*mapped)->data(), read.size());
  std::memcpy(read.data(), (*mapped)->data(), read.size());  // a second read: no second note
  const std::string said = testing::internal::GetCapturedStderr();
  std::remove(path.c_str());

  EXPECT_EQ(read[4999], 0xab) << "the bytes still in the file keep their values";
  EXPECT_EQ(read[5000], 0) << "the lost bytes read as zeros";
  EXPECT_EQ(read[8192], 0) << "the lost pages read as zeros";
  EXPECT_EQ(read.back(), 0);
  const Status intact = (*mapped)->CheckIntact();
  EXPECT_EQ(intact.code(), absl::StatusCode::kDataLoss) << intact;
  EXPECT_NE(intact.message().find(path), std::string_view::npos) << intact;
  const std::string note =
      "ferry: file '" + (*mapped)->display_name() +
      "' was truncated while it was mapped: reads of its bytes from byte 5000 on see "
      "zeros";
  const size_t first = said.find(note);
  EXPECT_NE(first, std::string::npos) << said;
  EXPECT_EQ(said.find(note, first + 1), std::string::npos) << "reported more than once: " << said;
}

// A cut inside a page raises no fault at all: that page stays mapped and reads zeros past the
// cut. A range reaching past the cut is still DataLoss (the file's size says so); one before it,
// and one ending exactly at it, is intact.
TEST(MappedFileTest, ACutInsideARangesLastPageIsDataLossWithoutAnyFault) {
  const std::string path =
      WriteTempFile("ferry_cut_in_page_", std::vector<unsigned char>(16 << 10, 0xcd));
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_EQ(truncate(path.c_str(), 12000), 0);  // inside the third page, the last read below
  std::vector<unsigned char> read(12288);
  const uint64_t events = MappedFile::VanishedPageEvents();
  std::memcpy(read.data(), (*mapped)->data(), read.size());  // pages 0-2: no fault
  std::remove(path.c_str());
  EXPECT_EQ(MappedFile::VanishedPageEvents(), events) << "no page vanished";
  EXPECT_EQ(read[11999], 0xcd);
  EXPECT_EQ(read[12000], 0) << "past the cut the page reads zeros";
  const Status cut = (*mapped)->CheckRangeIntact(8192, 4096);
  EXPECT_EQ(cut.code(), absl::StatusCode::kDataLoss) << cut;
  EXPECT_NE(cut.message().find("truncated to 12000 bytes"), std::string_view::npos) << cut;
  EXPECT_TRUE((*mapped)->CheckRangeIntact(0, 12000).ok());
  EXPECT_TRUE((*mapped)->CheckRangeIntact(4096, 100).ok());
  const Status by_address = MappedFile::CheckMemoryIntact((*mapped)->data() + 11000, 2000);
  EXPECT_EQ(by_address.code(), absl::StatusCode::kDataLoss) << by_address;
  EXPECT_TRUE(MappedFile::CheckMemoryIntact((*mapped)->data(), 4096).ok());
}

// The bytes of `mapped`'s mapping resident in this process (smaps' Rss; mincore would tell the
// page cache's, which keeps the pages either way); -1 when unreadable.
int64_t ResidentBytesOf(const MappedFile& mapped) {
  const auto begin = reinterpret_cast<uintptr_t>(mapped.data());
  std::FILE* smaps = std::fopen("/proc/self/smaps", "r");
  if (smaps == nullptr) return -1;
  char line[512];
  bool inside = false;
  int64_t rss = -1;
  while (std::fgets(line, sizeof(line), smaps) != nullptr) {
    unsigned long start = 0, end = 0;  // NOLINT(runtime/int): sscanf's %lx
    if (std::sscanf(line, "%lx-%lx ", &start, &end) == 2 && std::strchr(line, '-') != nullptr &&
        std::strstr(line, "kB") == nullptr) {
      inside = start <= begin && begin < end;
    } else if (inside && std::strncmp(line, "Rss:", 4) == 0) {
      long kb = 0;  // NOLINT(runtime/int)
      std::sscanf(line + 4, "%ld", &kb);
      rss = int64_t{kb} << 10;
      break;
    }
  }
  std::fclose(smaps);
  return rss;
}

TEST(MappedFileTest, ReleasedPagesLeaveTheProcessAndReadTheSameAgain) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> contents(static_cast<size_t>(64 * page));
  for (size_t i = 0; i < contents.size(); ++i) contents[i] = static_cast<unsigned char>(i * 7);
  const std::string path = WriteTempFile("ferry_release_", contents);
  auto mapped = MappedFile::Open(path);
  std::remove(path.c_str());  // the mapping keeps the contents
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const MappedFile& file = **mapped;
  std::vector<unsigned char> read(contents.size());
  std::memcpy(read.data(), file.data(), read.size());  // every page resident in the process
  ASSERT_EQ(ResidentBytesOf(file), 64 * page);

  // [page/2, 40.5 pages): only the pages wholly inside go, 1 to 39 (39 pages); page 0 and page 40,
  // shared with bytes outside the range, stay.
  file.ReleasePages(page / 2, 40 * page);
  EXPECT_EQ(ResidentBytesOf(file), (64 - 39) * page);
  // A range that ends at the end of the file takes its last page too.
  file.ReleasePages(60 * page + 1, 4 * page);
  EXPECT_EQ(ResidentBytesOf(file), (64 - 39 - 3) * page);
  file.ReleasePages(5, 10);  // inside one page: nothing
  EXPECT_EQ(ResidentBytesOf(file), (64 - 39 - 3) * page);

  std::memcpy(read.data(), file.data(), read.size());
  EXPECT_EQ(read, contents) << "released pages read the file's bytes again";
  EXPECT_TRUE(file.CheckIntact().ok());
}

TEST(MappedFileTest, ReadAtReadsTheFileWithoutTouchingTheMapping) {
  const int64_t page = sysconf(_SC_PAGESIZE);
  std::vector<unsigned char> contents(static_cast<size_t>(32 * page));
  for (size_t i = 0; i < contents.size(); ++i) contents[i] = static_cast<unsigned char>(i * 13 + 5);
  const std::string path = WriteTempFile("ferry_read_at_", contents);
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  const MappedFile& file = **mapped;
  ASSERT_EQ(ResidentBytesOf(file), 0) << "nothing read through the mapping yet";

  std::vector<unsigned char> read(static_cast<size_t>(20 * page) + 3);
  ASSERT_TRUE(file.ReadAt(page + 7, static_cast<int64_t>(read.size()), read.data()).ok());
  EXPECT_TRUE(std::equal(read.begin(), read.end(), contents.begin() + page + 7));
  EXPECT_EQ(ResidentBytesOf(file), 0) << "ReadAt does not fault the mapping in";

  // Locate: memory of the mapping is found with its offset; memory across its end and memory of
  // no mapping are not.
  const auto located = MappedFile::Locate(file.data() + 3 * page + 1, page);
  ASSERT_TRUE(located.has_value());
  EXPECT_EQ(located->file, &file);
  EXPECT_EQ(located->offset, 3 * page + 1);
  EXPECT_FALSE(MappedFile::Locate(file.data() + 31 * page, 2 * page).has_value());
  EXPECT_FALSE(MappedFile::Locate(read.data(), 16).has_value());

  // Renamed away, the descriptor still reads the same file; truncated, a read past the new end is
  // DataLoss naming the file, and the bytes before it still read.
  const std::string moved = path + ".moved";
  ASSERT_EQ(std::rename(path.c_str(), moved.c_str()), 0);
  ASSERT_EQ(truncate(moved.c_str(), 8 * page), 0);
  const Status short_read = file.ReadAt(4 * page, 8 * page, read.data());
  EXPECT_EQ(short_read.code(), absl::StatusCode::kDataLoss) << short_read;
  EXPECT_NE(short_read.message().find(path), std::string_view::npos) << short_read;
  EXPECT_TRUE(file.ReadAt(0, 8 * page, read.data()).ok());
  EXPECT_TRUE(std::equal(read.begin(), read.begin() + 8 * page, contents.begin()));
  std::remove(moved.c_str());

  auto bytes = MappedFile::FromBytes(
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(contents.data()), 64), "in-memory");
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ((*bytes)->ReadAt(0, 8, read.data()).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace ferry
