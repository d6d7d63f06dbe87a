// The writers: round trips through the readers for every format, strided views written in
// row-major order, byte-exact agreement with the reference writers' layout, stable order, and
// refusals (dtypes a format cannot hold, bad names) that leave no file behind.
#include "ferry/io/tensor_writer.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/io/tensor_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io_test_util.h"

namespace ferry {
namespace {

using ::ferry::io_test::Le64;
using ::ferry::io_test::ReadFileBytes;
using ::ferry::io_test::TempDir;
using ::testing::HasSubstr;

// Random bytes for a tensor; the seed is printed by the caller.
HostTensor RandomTensor(DType dtype, const std::vector<int64_t>& dims, std::mt19937& rng) {
  HostTensor tensor = HostTensor::Allocate(dtype, dims).value();
  for (int64_t i = 0; i < tensor.size_bytes(); ++i) {
    tensor.data()[i] = static_cast<std::byte>(rng() & 0xFF);
  }
  return tensor;
}

// The row-major bytes of any view (the reference the readers' output is compared with).
std::string DenseBytes(const HostView& view) {
  std::string out(static_cast<size_t>(view.dense_size_bytes()), '\0');
  EXPECT_TRUE(CopyConvert(view, MutableHostView::Dense(out.data(), view.dtype, view.dims)).ok());
  return out;
}

void ExpectSameTensor(const TensorFileEntry& entry, const HostView& expected) {
  const HostView& view = entry.source->view();
  EXPECT_EQ(view.dtype, expected.dtype) << entry.name;
  EXPECT_EQ(view.dims, expected.dims) << entry.name;
  EXPECT_EQ(DenseBytes(view), DenseBytes(expected)) << entry.name;
}

TEST(TensorWriterTest, SafetensorsRoundTripKeepsDTypesShapesValuesAndMetadata) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  std::vector<HostTensor> tensors;
  std::vector<NamedTensor> named;
  int index = 0;
  for (DType dtype : AllDTypes()) {
    if (GetDTypeInfo(dtype).safetensors_name.empty()) continue;
    tensors.push_back(RandomTensor(dtype, {2, 3}, rng));
  }
  for (DType dtype : AllDTypes()) {
    if (GetDTypeInfo(dtype).safetensors_name.empty()) continue;
    named.push_back({"t" + std::to_string(index), tensors[static_cast<size_t>(index)].view()});
    ++index;
  }
  HostTensor scalar = RandomTensor(DType::kF64, {}, rng);
  HostTensor empty = RandomTensor(DType::kF32, {0, 4}, rng);
  named.push_back({"scalar", scalar.view()});
  named.push_back({"empty", empty.view()});

  TempDir dir;
  const std::string path = dir.Path("out.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, named, {{"format", "pt"}, {"ünïcode", "välue"}}).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".partial"));
  auto file = TensorFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().size(), named.size());
  for (const NamedTensor& tensor : named) {
    const TensorFileEntry* entry = file->Find(tensor.name);
    ASSERT_NE(entry, nullptr) << tensor.name;
    ExpectSameTensor(*entry, tensor.view);
    EXPECT_EQ(entry->file_offset % tensor.view.element_size(), 0) << tensor.name;
  }
  EXPECT_EQ(file->metadata().at("format"), "pt");
  EXPECT_EQ(file->metadata().at("ünïcode"), "välue");
}

TEST(TensorWriterTest, SafetensorsBytesMatchTheReferenceWriter) {
  // The reference implementation's own serialization tests: a compact JSON header padded with
  // spaces to a multiple of 8, then the data.
  std::vector<float> values = {0, 1, 2, 3, 4, 5};
  TempDir dir;
  const std::string path = dir.Path("ref.safetensors");
  ASSERT_TRUE(WriteSafetensors(
                  path, {{"attn.0", io_test::DenseView(values.data(), DType::kF32, {1, 2, 3})}})
                  .ok());
  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64u);
  EXPECT_EQ(ReadFileBytes(path),
            Le64(64) + header + std::string(reinterpret_cast<const char*>(values.data()), 24));

  ASSERT_TRUE(WriteSafetensors(path, {}).ok());
  EXPECT_EQ(ReadFileBytes(path), Le64(8) + "{}      ");
  ASSERT_TRUE(WriteSafetensors(path, {}, {{"framework", "pt"}}).ok());
  EXPECT_EQ(ReadFileBytes(path), Le64(40) + R"({"__metadata__":{"framework":"pt"}})" + "     ");
}

TEST(TensorWriterTest, SafetensorsOrderIsStableWhateverTheInputOrder) {
  std::vector<uint8_t> a(3, 1);
  std::vector<double> b(2, 2.0);
  std::vector<int16_t> c(5, 3);
  std::vector<float> d(1, 4.0f);
  const NamedTensor ta{"a", io_test::DenseView(a.data(), DType::kU8, {3})};
  const NamedTensor tb{"b", io_test::DenseView(b.data(), DType::kF64, {2})};
  const NamedTensor tc{"c", io_test::DenseView(c.data(), DType::kS16, {5})};
  const NamedTensor td{"d", io_test::DenseView(d.data(), DType::kF32, {1})};
  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.Path("1"), {ta, tb, tc, td}).ok());
  ASSERT_TRUE(WriteSafetensors(dir.Path("2"), {td, tc, tb, ta}).ok());
  EXPECT_EQ(ReadFileBytes(dir.Path("1")), ReadFileBytes(dir.Path("2")));
  auto file = TensorFile::Open(dir.Path("1"));
  ASSERT_TRUE(file.ok()) << file.status();
  // Largest elements first: f64, f32, s16, u8.
  std::vector<std::string> order;
  for (const TensorFileEntry& entry : file->tensors()) order.push_back(entry.name);
  EXPECT_EQ(order, std::vector<std::string>({"b", "d", "c", "a"}));
  const std::string bytes = ReadFileBytes(dir.Path("1"));
  EXPECT_EQ((bytes.size() - (2 * 8 + 4 + 5 * 2 + 3)) % 8, 0u);  // header padded to 8
}

// Views with every kind of stride: transposed, reversed (negative), stepped and broadcast.
std::vector<std::pair<std::string, HostView>> StridedViews(const HostTensor& base) {
  // base: f32 [4, 6] dense.
  const auto* data = reinterpret_cast<const std::byte*>(base.data());
  return {
      {"transposed", HostView(data, DType::kF32, {6, 4}, {4, 24})},
      {"reversed", HostView(data + 3 * 24 + 5 * 4, DType::kF32, {4, 6}, {-24, -4})},
      {"stepped", HostView(data + 4, DType::kF32, {2, 3}, {48, 8})},
      {"broadcast", HostView(data, DType::kF32, {3, 6}, {0, 4})},
      {"column", HostView(data + 8, DType::kF32, {4}, {24})},
  };
}

TEST(TensorWriterTest, StridedViewsAreWrittenInRowMajorOrderByEveryWriter) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  HostTensor base = RandomTensor(DType::kF32, {4, 6}, rng);
  const auto views = StridedViews(base);
  std::vector<NamedTensor> named;
  for (const auto& [name, view] : views) named.push_back({name, view});

  TempDir dir;
  ASSERT_TRUE(WriteSafetensors(dir.Path("s.safetensors"), named).ok());
  ASSERT_TRUE(WriteNpz(dir.Path("stored.npz"), named, /*compressed=*/false).ok());
  ASSERT_TRUE(WriteNpz(dir.Path("deflated.npz"), named, /*compressed=*/true).ok());
  for (const std::string file_name : {"s.safetensors", "stored.npz", "deflated.npz"}) {
    auto file = TensorFile::Open(dir.Path(file_name));
    ASSERT_TRUE(file.ok()) << file.status();
    for (const auto& [name, view] : views) {
      const TensorFileEntry* entry = file->Find(name);
      ASSERT_NE(entry, nullptr) << file_name << ": " << name;
      ExpectSameTensor(*entry, view);
    }
  }
  for (const auto& [name, view] : views) {
    ASSERT_TRUE(WriteNpy(dir.Path(name + ".npy"), view).ok());
    auto file = TensorFile::Open(dir.Path(name + ".npy"));
    ASSERT_TRUE(file.ok()) << file.status();
    EXPECT_EQ(file->tensors()[0].name, name);
    ExpectSameTensor(file->tensors()[0], view);
  }
}

TEST(TensorWriterTest, NpyHeaderIsNumpysOwnSpellingAlignedTo64) {
  std::vector<int32_t> values = {1, 2, 3, 4, 5, 6};
  TempDir dir;
  const std::string path = dir.Path("a.npy");
  ASSERT_TRUE(WriteNpy(path, io_test::DenseView(values.data(), DType::kS32, {2, 3})).ok());
  const std::string bytes = ReadFileBytes(path);
  const std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (2, 3), }";
  // 10 bytes of magic, version and length, the dict, spaces, '\n': 128 bytes in all.
  ASSERT_EQ(bytes.size(), 128u + 24u);
  EXPECT_EQ(bytes.substr(0, 10), std::string("\x93NUMPY\x01\x00\x76\x00", 10));
  EXPECT_EQ(bytes.substr(10, dict.size()), dict);
  EXPECT_EQ(bytes[127], '\n');
  EXPECT_EQ(bytes.substr(10 + dict.size(), 127 - 10 - dict.size()),
            std::string(127 - 10 - dict.size(), ' '));
  EXPECT_EQ(bytes.substr(128), std::string(reinterpret_cast<const char*>(values.data()), 24));

  float scalar = 2.5f;
  ASSERT_TRUE(WriteNpy(path, io_test::DenseView(&scalar, DType::kF32, {})).ok());
  EXPECT_THAT(ReadFileBytes(path), HasSubstr("'shape': (), }"));
  ASSERT_TRUE(WriteNpy(path, io_test::DenseView(values.data(), DType::kS32, {6})).ok());
  EXPECT_THAT(ReadFileBytes(path), HasSubstr("'shape': (6,), }"));
}

TEST(TensorWriterTest, NpyHeaderTooLongForVersion1UsesVersion2) {
  // 30000 dims of 1: the shape alone takes 90000 characters, more than a 2-byte length holds.
  std::vector<int64_t> dims(30000, 1);
  float value = 7.0f;
  TempDir dir;
  const std::string path = dir.Path("wide.npy");
  ASSERT_TRUE(WriteNpy(path, io_test::DenseView(&value, DType::kF32, dims)).ok());
  const std::string bytes = ReadFileBytes(path);
  EXPECT_EQ(bytes[6], 2);
  EXPECT_EQ((bytes.size() - 4) % 64, 0u);
  auto file = TensorFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->tensors()[0].source->view().rank(), 30000);
  EXPECT_EQ(*static_cast<const float*>(file->tensors()[0].source->view().data), 7.0f);
}

TEST(TensorWriterTest, NpzStoredMembersAreZeroCopyAndDeflatedOnesAreSmaller) {
  std::vector<int64_t> values(4096);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>(i % 7);
  const NamedTensor tensor{"ids", io_test::DenseView(values.data(), DType::kS64, {64, 64})};
  TempDir dir;
  ASSERT_TRUE(WriteNpz(dir.Path("s.npz"), {tensor}, false).ok());
  ASSERT_TRUE(WriteNpz(dir.Path("d.npz"), {tensor}, true).ok());
  TensorFileOptions verify;
  verify.verify_stored_crc32 = true;
  auto stored = TensorFile::Open(dir.Path("s.npz"), verify);
  auto deflated = TensorFile::Open(dir.Path("d.npz"));
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_TRUE(deflated.ok()) << deflated.status();
  EXPECT_TRUE(stored->tensors()[0].zero_copy);
  EXPECT_FALSE(deflated->tensors()[0].zero_copy);
  EXPECT_LT(deflated->file_size(), stored->file_size() / 4);
  ExpectSameTensor(stored->tensors()[0], tensor.view);
  ExpectSameTensor(deflated->tensors()[0], tensor.view);
}

TEST(TensorWriterTest, LargeTensorsAreWrittenInChunks) {
  // 12 MiB, more than the 4 MiB write buffer, through the strided path (transposed) too.
  const int64_t rows = 1536, cols = 2048;
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  const HostView dense = io_test::DenseView(values.data(), DType::kF32, {rows, cols});
  const HostView transposed(values.data(), DType::kF32, {cols, rows}, {4, cols * 4});
  TempDir dir;
  ASSERT_TRUE(
      WriteNpz(dir.Path("big.npz"), {{"dense", dense}, {"transposed", transposed}}, true).ok());
  auto file = TensorFile::Open(dir.Path("big.npz"));
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectSameTensor(*file->Find("dense"), dense);
  ExpectSameTensor(*file->Find("transposed"), transposed);
}

TEST(TensorWriterTest, DTypesAFormatCannotHoldAreRefusedWithoutWritingAFile) {
  std::vector<uint16_t> values(4);
  TempDir dir;
  Status status = WriteSafetensors(dir.Path("c.safetensors"),
                                   {{"z", io_test::DenseView(values.data(), DType::kC128, {0})}});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("safetensors has no dtype for complex128"));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("c.safetensors")));

  status = WriteNpy(dir.Path("b.npy"), io_test::DenseView(values.data(), DType::kBF16, {4}));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("numpy has no dtype for bfloat16"));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("b.npy")));

  status = WriteNpz(dir.Path("f.npz"),
                    {{"f8", io_test::DenseView(values.data(), DType::kF8E4M3FN, {4})}}, false);
  EXPECT_THAT(std::string(status.message()), HasSubstr("numpy has no dtype for float8_e4m3fn"));
  EXPECT_FALSE(std::filesystem::exists(dir.Path("f.npz")));
}

TEST(TensorWriterTest, BadTensorNamesAreRefused) {
  float value = 1;
  const HostView view = io_test::DenseView(&value, DType::kF32, {1});
  TempDir dir;
  const std::string path = dir.Path("n.safetensors");
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"a", view}, {"a", view}}).message()),
              HasSubstr("tensor 'a': the name is used twice"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"", view}}).message()), HasSubstr("empty name"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"__metadata__", view}}).message()),
              HasSubstr("reserved"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {{"bad\xFF", view}}).message()),
              HasSubstr("not valid UTF-8"));
  EXPECT_THAT(std::string(WriteSafetensors(path, {}, {{"k", "\xC3"}}).message()),
              HasSubstr("metadata value of 'k' is not valid UTF-8"));
  EXPECT_THAT(std::string(WriteNpz(dir.Path("n.npz"), {{"a", view}, {"a", view}}, false).message()),
              HasSubstr("the name is used twice"));
  EXPECT_FALSE(std::filesystem::exists(path));
}

TEST(TensorWriterTest, InconsistentViewIsRefused) {
  float value = 1;
  const HostView bad(&value, DType::kF32, {2, 2}, {4});  // two dims, one stride
  TempDir dir;
  EXPECT_EQ(WriteNpy(dir.Path("x.npy"), bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteSafetensors(dir.Path("x.safetensors"), {{"x", bad}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteNpz(dir.Path("x.npz"), {{"x", bad}}, true).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(TensorWriterTest, UnwritableDirectoryIsAnErrorNamingThePath) {
  float value = 1;
  Status status = WriteNpy("/nonexistent-dir/x.npy", io_test::DenseView(&value, DType::kF32, {1}));
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("/nonexistent-dir/x.npy.partial"));
  // The system's message once, not twice.
  const std::string message(status.message());
  const std::string system_error = "No such file or directory";
  ASSERT_THAT(message, HasSubstr(system_error));
  EXPECT_EQ(message.find(system_error), message.rfind(system_error)) << message;
}

}  // namespace
}  // namespace ferry
