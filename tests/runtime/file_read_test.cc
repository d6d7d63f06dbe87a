// ReadFileTensors: tensors of a file read straight into host-writable device memory with pread,
// the others left to the caller, and a file truncated under the load reported, not read as zeros.
#include "ferry/runtime/file_read.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/core/prefault.h"
#include "ferry/core/settings.h"
#include "ferry/device/client.h"
#include "ferry/device/registry.h"
#include "ferry/io/tensor_writer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/required_backends.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

class FileReadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("ferry_file_read_" + std::to_string(getpid()) + ".safetensors"))
                .string();
    // big: 128 KiB of float32; half: 64 KiB of bfloat16 (exactly the threshold); small: 64 bytes.
    big_.resize(32 * 1024);
    for (size_t i = 0; i < big_.size(); ++i) big_[i] = static_cast<float>(i) * 0.5f - 3.0f;
    half_.resize(32 * 1024);
    for (size_t i = 0; i < half_.size(); ++i) half_[i] = static_cast<uint16_t>(i * 7 + 1);
    small_.assign(16, 2.5f);
    const NamedTensor tensors[] = {
        {"big", HostView::Dense(big_.data(), DType::kF32, {128, 256})},
        {"half", HostView::Dense(half_.data(), DType::kBF16, {32, 1024})},
        {"small", HostView::Dense(small_.data(), DType::kF32, {16})},
    };
    ASSERT_TRUE(WriteSafetensors(path_, tensors).ok());
    auto opened = TensorFile::Open(path_);
    ASSERT_TRUE(opened.ok()) << opened.status();
    file_.emplace(*std::move(opened));
  }
  void TearDown() override { std::remove(path_.c_str()); }

  // big, half and small, in that order (whatever the file's), with their requested dtypes.
  std::vector<FileTensorRead> Reads(std::vector<std::optional<DType>> requested = {}) const {
    std::vector<FileTensorRead> reads;
    const char* names[] = {"big", "half", "small"};
    for (size_t i = 0; i < 3; ++i) {
      const TensorFileEntry* entry = file_->Find(names[i]);
      EXPECT_NE(entry, nullptr) << names[i];
      reads.push_back(FileTensorRead::Of(*entry, file_->file().get(),
                                         i < requested.size() ? requested[i] : std::nullopt));
    }
    return reads;
  }

  std::string path_;
  std::vector<float> big_;
  std::vector<uint16_t> half_;
  std::vector<float> small_;
  std::optional<TensorFile> file_;
};

TEST_F(FileReadTest, ReadsLargeTensorsStoredAsTheyAreIntoHostMemory) {
  auto client = CreateClient("host");
  ASSERT_TRUE(client.ok()) << client.status();
  Device* device = (*client)->devices()[0];
  ASSERT_TRUE(DeviceMemoryIsHostWritable(*device));
  const int64_t counted_before = metrics::FileBytesReadInPlace()->Value();

  auto read = ReadFileTensors(Reads(), device, 3);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 3u);
  ASSERT_NE((*read)[0], nullptr);
  ASSERT_NE((*read)[1], nullptr) << "64 KiB is enough";
  EXPECT_EQ((*read)[2], nullptr) << "a small tensor is left to the batched put";
  EXPECT_EQ(metrics::FileBytesReadInPlace()->Value() - counted_before,
            static_cast<int64_t>(big_.size() * 4 + half_.size() * 2));
  EXPECT_THAT((*read)[0]->name(), HasSubstr("big"));
  EXPECT_EQ((*read)[1]->device_dtype(), DType::kBF16);

  auto host = TransferFromDevice({(*read)[0], (*read)[1]});
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(std::memcmp((*host)[0].data(), big_.data(), big_.size() * 4), 0);
  EXPECT_EQ(std::memcmp((*host)[1].data(), half_.data(), half_.size() * 2), 0);
}

TEST_F(FileReadTest, AConversionOrAnUnmappedSourceIsLeftToTheCaller) {
  auto client = CreateClient("host");
  ASSERT_TRUE(client.ok()) << client.status();
  Device* device = (*client)->devices()[0];
  // float32 asked to be stored as float16: a conversion, the mapped path's.
  auto read = ReadFileTensors(Reads({DType::kF16, std::nullopt}), device, 2);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)[0], nullptr);
  EXPECT_NE((*read)[1], nullptr);

  // Memory of no file (OfMemory finds no mapping): not read in place.
  auto source =
      TensorSource::Borrow(HostView::Dense(big_.data(), DType::kF32, {128, 256}), big_.data(),
                           static_cast<int64_t>(big_.size() * 4), nullptr, "heap");
  ASSERT_TRUE(source.ok()) << source.status();
  const FileTensorRead heap = FileTensorRead::OfMemory(source->get(), std::nullopt);
  EXPECT_EQ(heap.file, nullptr);
  EXPECT_FALSE(FileReadApplies(heap, *device));
  // A view of the mapping is found there, at the tensor's offset.
  const TensorFileEntry& entry = *file_->Find("big");
  const FileTensorRead mapped = FileTensorRead::OfMemory(entry.source.get(), std::nullopt);
  EXPECT_EQ(mapped.file, file_->file().get());
  EXPECT_EQ(mapped.file_offset, entry.file_offset);
  EXPECT_TRUE(FileReadApplies(mapped, *device));
}

TEST_F(FileReadTest, AFileTruncatedUnderTheLoadIsDataLossNamingTheTensor) {
  auto client = CreateClient("host");
  ASSERT_TRUE(client.ok()) << client.status();
  const int64_t cut = file_->Find("big")->file_offset + 1000;
  ASSERT_EQ(truncate(path_.c_str(), cut), 0);
  auto read = ReadFileTensors(Reads(), (*client)->devices()[0], 2);
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << read.status();
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("big"));
  EXPECT_THAT(std::string(read.status().message()), HasSubstr(path_));
}

TEST_F(FileReadTest, DeviceMemoryTheHostCannotWriteTakesNothing) {
  auto client = CreateClient("opencl");
  if (!client.ok()) {
    FERRY_SKIP_OR_FAIL_UNAVAILABLE("no OpenCL device here: " + client.status().ToString());
  }
  Device* device = (*client)->devices()[0];
  EXPECT_FALSE(DeviceMemoryIsHostWritable(*device));
  auto read = ReadFileTensors(Reads(), device, 2);
  ASSERT_TRUE(read.ok()) << read.status();
  for (const DataPtr& data : *read) EXPECT_EQ(data, nullptr);
}

// A load's usual destination is device memory nobody has written yet: its pages are faulted in
// ahead of the preads (PrefaultForWriting), a MiB per call, and the bytes read are the file's.
TEST(FileReadPrefaultTest, AFreshDestinationIsFaultedInAheadOfItsReads) {
  if (!KernelCanPrefault()) {
    GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux 5.14 and later have it)";
  }
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("ferry_file_prefault_" + std::to_string(getpid()) + ".safetensors"))
                               .string();
  // 40 MiB: above glibc's largest mmap threshold (32 MiB), so the device memory is a fresh
  // mapping whatever the allocator did before.
  std::vector<float> values(10 << 20);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 65521) - 9.25f;
  const NamedTensor tensors[] = {
      {"weights", HostView::Dense(values.data(), DType::kF32, {10 << 10, 1 << 10})}};
  ASSERT_TRUE(WriteSafetensors(path, tensors).ok());
  auto file = TensorFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto client = CreateClient("host");
  ASSERT_TRUE(client.ok()) << client.status();
  Device* device = (*client)->devices()[0];
  const std::vector<FileTensorRead> reads = {
      FileTensorRead::Of(*file->Find("weights"), file->file().get(), std::nullopt)};

  for (const char* prefault : {"on", "off"}) {
    ASSERT_TRUE(SetSetting("FERRY_HOST_PREFAULT", prefault).ok());
    ReleaseCachedHostMemory();  // no warm block of this size to reuse
    const int64_t counted_before = metrics::HostBytesPrefaulted()->Value();
    auto read = ReadFileTensors(reads, device, 2, int64_t{8} << 20);
    ASSERT_TRUE(read.ok()) << read.status();
    ASSERT_NE((*read)[0], nullptr);
    const int64_t prefaulted = metrics::HostBytesPrefaulted()->Value() - counted_before;
    if (std::string_view(prefault) == "on") {
      // All of it but at most a partial page at each end of each 8 MiB read.
      EXPECT_GE(prefaulted, (int64_t{40} << 20) - 10 * 4096) << "FERRY_HOST_PREFAULT=on";
    } else {
      EXPECT_EQ(prefaulted, 0) << "FERRY_HOST_PREFAULT=off";
    }
    auto host = TransferFromDevice({(*read)[0]});
    ASSERT_TRUE(host.ok()) << host.status();
    EXPECT_EQ(std::memcmp((*host)[0].data(), values.data(), values.size() * 4), 0) << prefault;
  }
  ASSERT_TRUE(ClearSetting("FERRY_HOST_PREFAULT").ok());
  std::remove(path.c_str());
}

}  // namespace
}  // namespace ferry
