// Files written by the real numpy and safetensors (tests/io/data/make_fixtures.py) are read bit
// for bit. The expected values are the generating script's formulas, restated here.
#include <complex>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "ferry/io/tensor_file.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

std::string DataPath(const std::string& name) {
  return std::string(FERRY_SOURCE_DIR) + "/tests/io/data/" + name;
}

TensorFile OpenFixture(const std::string& name) {
  auto file = TensorFile::Open(DataPath(name));
  EXPECT_TRUE(file.ok()) << file.status();
  return std::move(file).value();
}

// The tensor's elements in row-major order, read through the fused copy as a transfer would.
template <typename T>
std::vector<T> RowMajor(const TensorFileEntry& entry, DType expected_dtype) {
  const HostView& view = entry.source->view();
  EXPECT_EQ(view.dtype, expected_dtype) << entry.name;
  std::vector<T> out(static_cast<size_t>(view.num_elements()));
  Status status = CopyConvert(view, MutableHostView::Dense(out.data(), view.dtype, view.dims));
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

template <typename T, typename Formula>
std::vector<T> Expected(int count, Formula formula) {
  std::vector<T> out;
  for (int i = 0; i < count; ++i) out.push_back(static_cast<T>(formula(i)));
  return out;
}

// Bitwise equality, so that -0.0 vs 0.0 or NaN payloads would count as differences.
template <typename T>
void ExpectBitsEqual(const std::vector<T>& actual, const std::vector<T>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  EXPECT_EQ(std::memcmp(actual.data(), expected.data(), actual.size() * sizeof(T)), 0);
}

TEST(NumpyFixturesTest, NpySaveOfFloat32IsReadZeroCopy) {
  TensorFile file = OpenFixture("arange_f32_3x4.npy");
  ASSERT_EQ(file.tensors().size(), 1u);
  const TensorFileEntry& entry = file.tensors()[0];
  EXPECT_EQ(entry.name, "arange_f32_3x4");
  EXPECT_TRUE(entry.zero_copy);
  EXPECT_EQ(entry.source->view().dims, Dims({3, 4}));
  ExpectBitsEqual(RowMajor<float>(entry, DType::kF32),
                  Expected<float>(12, [](int i) { return i * 0.5; }));
}

TEST(NumpyFixturesTest, NpySaveOfFortranArrayGivesColumnMajorStrides) {
  TensorFile file = OpenFixture("fortran_i64_2x3.npy");
  const TensorFileEntry& entry = file.tensors()[0];
  EXPECT_TRUE(entry.zero_copy);
  EXPECT_EQ(entry.source->view().byte_strides, Dims({8, 16}));
  ExpectBitsEqual(RowMajor<int64_t>(entry, DType::kS64),
                  Expected<int64_t>(6, [](int i) { return i; }));
}

TEST(NumpyFixturesTest, NpySaveOfBigEndianFloat64IsSwapped) {
  TensorFile file = OpenFixture("bigendian_f8_5.npy");
  const TensorFileEntry& entry = file.tensors()[0];
  EXPECT_TRUE(entry.byte_swapped);
  ExpectBitsEqual(RowMajor<double>(entry, DType::kF64),
                  Expected<double>(5, [](int i) { return i * 0.25 - 1; }));
}

TEST(NumpyFixturesTest, NpySaveOfBigEndianComplex64SwapsBothParts) {
  TensorFile file = OpenFixture("bigendian_c8_3.npy");
  const auto values = RowMajor<std::complex<float>>(file.tensors()[0], DType::kC64);
  ASSERT_EQ(values.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(values[static_cast<size_t>(i)],
              std::complex<float>(static_cast<float>(i), static_cast<float>(i - 1)));
  }
}

TEST(NumpyFixturesTest, NpySaveOfBigEndianFortranInt16IsSwappedAndStrided) {
  TensorFile file = OpenFixture("bigendian_fortran_i2_3x2.npy");
  const TensorFileEntry& entry = file.tensors()[0];
  EXPECT_TRUE(entry.byte_swapped);
  EXPECT_EQ(entry.source->view().byte_strides, Dims({2, 6}));
  ExpectBitsEqual(RowMajor<int16_t>(entry, DType::kS16),
                  Expected<int16_t>(6, [](int i) { return i - 3; }));
}

TEST(NumpyFixturesTest, NpySaveOfScalarBoolEmptyAndUint16) {
  TensorFile scalar = OpenFixture("scalar_f64.npy");
  EXPECT_EQ(scalar.tensors()[0].source->view().rank(), 0);
  ExpectBitsEqual(RowMajor<double>(scalar.tensors()[0], DType::kF64), {3.25});

  TensorFile mask = OpenFixture("bool_5.npy");
  ExpectBitsEqual(RowMajor<uint8_t>(mask.tensors()[0], DType::kBool),
                  Expected<uint8_t>(5, [](int i) { return i % 2 == 0; }));

  TensorFile empty = OpenFixture("empty_f32_0x3.npy");
  EXPECT_EQ(empty.tensors()[0].source->view().dims, Dims({0, 3}));

  TensorFile u16 = OpenFixture("u16_2x2x2.npy");
  ExpectBitsEqual(RowMajor<uint16_t>(u16.tensors()[0], DType::kU16),
                  Expected<uint16_t>(8, [](int i) { return i * 1000; }));
}

void ExpectSavezMembers(const TensorFile& file, bool zero_copy) {
  ASSERT_EQ(file.tensors().size(), 3u);
  for (const TensorFileEntry& entry : file.tensors()) {
    EXPECT_EQ(entry.zero_copy, zero_copy) << entry.name;
    if (zero_copy) {
      EXPECT_EQ(entry.source->view().data, file.file()->data() + entry.file_offset) << entry.name;
    }
  }
  ASSERT_NE(file.Find("weight"), nullptr);
  ExpectBitsEqual(RowMajor<float>(*file.Find("weight"), DType::kF32),
                  Expected<float>(12, [](int i) { return i * 0.5; }));
  ExpectBitsEqual(RowMajor<int32_t>(*file.Find("ids"), DType::kS32),
                  Expected<int32_t>(7, [](int i) { return i * -3; }));
  EXPECT_EQ(file.Find("fortran")->source->view().byte_strides, Dims({8, 16}));
  ExpectBitsEqual(RowMajor<int64_t>(*file.Find("fortran"), DType::kS64),
                  Expected<int64_t>(6, [](int i) { return i; }));
}

TEST(NumpyFixturesTest, SavezMembersAreStoredAndReadZeroCopy) {
  TensorFile file = OpenFixture("savez.npz");
  EXPECT_EQ(file.format(), TensorFileFormat::kNpz);
  ExpectSavezMembers(file, /*zero_copy=*/true);
}

TEST(NumpyFixturesTest, SavezStoredCrcsMatchWhenVerified) {
  TensorFileOptions options;
  options.verify_stored_crc32 = true;
  auto file = TensorFile::Open(DataPath("savez.npz"), options);
  ASSERT_TRUE(file.ok()) << file.status();
}

TEST(NumpyFixturesTest, SavezCompressedMembersAreInflated) {
  TensorFile file = OpenFixture("savez_compressed.npz");
  ExpectSavezMembers(file, /*zero_copy=*/false);
}

TEST(NumpyFixturesTest, SafetensorsSaveFileIsReadWithMetadata) {
  TensorFile file = OpenFixture("tensors.safetensors");
  EXPECT_EQ(file.format(), TensorFileFormat::kSafetensors);
  EXPECT_EQ(file.metadata().at("format"), "np");
  EXPECT_EQ(file.metadata().at("source"), "make_fixtures.py");
  ASSERT_EQ(file.tensors().size(), 4u);
  for (const TensorFileEntry& entry : file.tensors()) {
    EXPECT_TRUE(entry.zero_copy);
    // The reference writer orders by alignment: every tensor is aligned to its element size.
    EXPECT_EQ(entry.file_offset % entry.source->view().element_size(), 0) << entry.name;
  }
  ExpectBitsEqual(RowMajor<float>(*file.Find("weight"), DType::kF32),
                  Expected<float>(12, [](int i) { return i * 0.5; }));
  // float16 -2, -1, 0, 1.
  ExpectBitsEqual(RowMajor<uint16_t>(*file.Find("bias"), DType::kF16),
                  std::vector<uint16_t>({0xC000, 0xBC00, 0x0000, 0x3C00}));
  ExpectBitsEqual(RowMajor<int64_t>(*file.Find("ids"), DType::kS64),
                  Expected<int64_t>(5, [](int i) { return int64_t{i} * 1000000007; }));
  ExpectBitsEqual(RowMajor<uint8_t>(*file.Find("mask"), DType::kBool),
                  Expected<uint8_t>(3, [](int i) { return i % 2 == 1; }));
}

}  // namespace
}  // namespace ferry
