// A file truncated under its mapping: no SIGBUS, the lost pages read as zeros, ferry's check says
// DataLoss naming the file, and a reader that is not ferry is told on stderr once per file.
#include "ferry/io/mapped_file.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(MappedFileTest, PagesThatVanishReadAsZerosAndAreReportedOnceNamingTheFile) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer runtimes take over fault signals (ASan's handle_sigbus, TSan's "
                  "signal handling); the plain build runs this test";
#endif
  const std::string path =
      (std::filesystem::temp_directory_path() / ("ferry_truncated_" + std::to_string(getpid())))
          .string();
  {
    std::vector<unsigned char> contents(64 << 10, 0xab);
    FILE* file = std::fopen(path.c_str(), "wb");
    ASSERT_NE(file, nullptr);
    ASSERT_EQ(std::fwrite(contents.data(), 1, contents.size(), file), contents.size());
    std::fclose(file);
  }
  auto mapped = MappedFile::Open(path);
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  ASSERT_TRUE((*mapped)->CheckIntact().ok());
  ASSERT_EQ(truncate(path.c_str(), 4096), 0);

  // A plain memcpy stands for numpy: a reader ferry does not control.
  std::vector<unsigned char> read((*mapped)->size());
  testing::internal::CaptureStderr();
  std::memcpy(read.data(), (*mapped)->data(), read.size());
  std::memcpy(read.data(), (*mapped)->data(), read.size());  // a second read: no second note
  const std::string said = testing::internal::GetCapturedStderr();
  std::remove(path.c_str());

  EXPECT_EQ(read[4095], 0xab) << "the page still in the file keeps its bytes";
  EXPECT_EQ(read[4096], 0) << "the lost pages read as zeros";
  EXPECT_EQ(read.back(), 0);
  const Status intact = (*mapped)->CheckIntact();
  EXPECT_EQ(intact.code(), absl::StatusCode::kDataLoss) << intact;
  EXPECT_NE(intact.message().find(path), std::string_view::npos) << intact;
  const std::string note = "ferry: file '" + (*mapped)->display_name() +
                           "' was truncated while it was mapped: reads from byte 4096 on see zeros";
  const size_t first = said.find(note);
  EXPECT_NE(first, std::string::npos) << said;
  EXPECT_EQ(said.find(note, first + 1), std::string::npos) << "reported more than once: " << said;
}

}  // namespace
}  // namespace ferry
