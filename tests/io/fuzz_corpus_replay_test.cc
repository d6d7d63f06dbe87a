// Replays every file of the fuzzers' seed corpus (fuzz/corpus/<format>/) through ParseTensorFile
// in the normal suite: nothing may crash (ASan/UBSan builds check reads too); files named
// valid_* must parse and files named invalid_* must be refused with InvalidArgument.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "ferry/io/tensor_file.h"
#include "gtest/gtest.h"
#include "io_test_util.h"

namespace ferry {
namespace {

void ReplayCorpus(const std::string& folder, TensorFileFormat format) {
  const std::filesystem::path directory =
      std::filesystem::path(FERRY_SOURCE_DIR) / "fuzz" / "corpus" / folder;
  ASSERT_TRUE(std::filesystem::is_directory(directory)) << directory;
  int valid = 0, invalid = 0, total = 0;
  for (const auto& item : std::filesystem::directory_iterator(directory)) {
    if (!item.is_regular_file()) continue;
    const std::string name = item.path().filename().string();
    const std::string bytes = io_test::ReadFileBytes(item.path().string());
    ++total;
    for (bool verify_crc : {false, true}) {
      auto parsed = io_test::ParseBytes(bytes, name, format, verify_crc);
      if (name.rfind("valid_", 0) == 0) {
        EXPECT_TRUE(parsed.ok()) << name << ": " << parsed.status();
        valid += verify_crc ? 0 : 1;
      } else if (name.rfind("invalid_", 0) == 0) {
        EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << name;
        invalid += verify_crc ? 0 : 1;
      }
      if (parsed.ok()) {
        // Touch every tensor's first and last addressed bytes.
        for (const TensorFileEntry& entry : parsed->tensors()) {
          const HostView& view = entry.source->view();
          auto addressed = view.ComputeAddressedBytes(entry.name);
          ASSERT_TRUE(addressed.ok()) << name;
          if (addressed->begin == addressed->end) continue;
          const auto* base = static_cast<const volatile unsigned char*>(view.data);
          (void)base[addressed->begin];
          (void)base[addressed->end - 1];
        }
      }
    }
  }
  EXPECT_GT(valid, 0) << "no valid_* seeds in " << directory;
  EXPECT_GT(invalid, 0) << "no invalid_* seeds in " << directory;
  ::testing::Test::RecordProperty("files", total);
}

TEST(FuzzCorpusReplayTest, SafetensorsSeedsParseOrFailCleanly) {
  ReplayCorpus("safetensors", TensorFileFormat::kSafetensors);
}

TEST(FuzzCorpusReplayTest, NpySeedsParseOrFailCleanly) {
  ReplayCorpus("npy", TensorFileFormat::kNpy);
}

TEST(FuzzCorpusReplayTest, NpzSeedsParseOrFailCleanly) {
  ReplayCorpus("npz", TensorFileFormat::kNpz);
}

}  // namespace
}  // namespace ferry
