// Every rule of the .npy reader, each with a file that breaks it; and what valid files give:
// versions 1.0 to 3.0, any key order, Fortran order as strides, big-endian data swapped.
#include <complex>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "ferry/core/copy_convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/io/tensor_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io_test_util.h"

namespace ferry {
namespace {

using ::ferry::io_test::NpyBytes;
using ::ferry::io_test::ParseBytes;
using ::ferry::io_test::RawBytes;
using ::testing::HasSubstr;

void ExpectRejected(const std::string& bytes, const std::vector<std::string>& parts) {
  auto parsed = ParseBytes(bytes, "dir/x.npy", TensorFileFormat::kNpy);
  ASSERT_FALSE(parsed.ok()) << "accepted a malformed file";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(parsed.status().message());
  EXPECT_THAT(message, HasSubstr("file 'dir/x.npy'"));
  for (const std::string& part : parts) EXPECT_THAT(message, HasSubstr(part));
}

// The header dict as numpy writes it.
std::string Dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

// Reads the tensor back in row-major order through the fused copy (what a transfer does).
template <typename T>
std::vector<T> ReadRowMajor(const HostView& view) {
  std::vector<T> out(static_cast<size_t>(view.num_elements()));
  EXPECT_TRUE(CopyConvert(view, MutableHostView::Dense(out.data(), view.dtype, view.dims)).ok());
  return out;
}

TEST(NpyReaderTest, ValidFileIsOneZeroCopyTensorNamedAfterTheFile) {
  const std::vector<float> values = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  const std::string bytes = NpyBytes(Dict("<f4", "(3, 4)"), RawBytes(values));
  auto parsed = ParseBytes(bytes, "/some/dir/weights.npy");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->format(), TensorFileFormat::kNpy);
  ASSERT_EQ(parsed->tensors().size(), 1u);
  const TensorFileEntry& entry = parsed->tensors()[0];
  EXPECT_EQ(entry.name, "weights");
  EXPECT_TRUE(entry.zero_copy);
  EXPECT_EQ(entry.file_offset, 128);  // numpy's 10-byte prefix + dict, padded to 128
  const HostView& view = entry.source->view();
  EXPECT_EQ(view.data, parsed->file()->data() + 128);
  EXPECT_EQ(view.dtype, DType::kF32);
  EXPECT_EQ(view.dims, Dims({3, 4}));
  EXPECT_EQ(ReadRowMajor<float>(view), values);
  EXPECT_TRUE(parsed->metadata().empty());
}

TEST(NpyReaderTest, Versions2And3WithFourByteHeaderLengthsAreRead) {
  for (int major : {2, 3}) {
    auto parsed =
        ParseBytes(NpyBytes(Dict("<i2", "(2,)"), RawBytes(std::vector<int16_t>{-3, 4}), major));
    ASSERT_TRUE(parsed.ok()) << major << ": " << parsed.status();
    EXPECT_EQ(ReadRowMajor<int16_t>(parsed->tensors()[0].source->view()),
              std::vector<int16_t>({-3, 4}));
  }
}

TEST(NpyReaderTest, KeysInAnyOrderWithEitherQuotesAndNoTrailingCommaAreAccepted) {
  const std::string dict = "{\"shape\": (2,),\"fortran_order\":False ,  'descr':\"<u2\"}";
  auto parsed = ParseBytes(NpyBytes(dict, RawBytes(std::vector<uint16_t>{1, 2})));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors()[0].source->view().dtype, DType::kU16);
}

TEST(NpyReaderTest, ScalarShapeIsRankZero) {
  auto parsed = ParseBytes(NpyBytes(Dict("<f8", "()"), RawBytes(std::vector<double>{3.25})));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const HostView& view = parsed->tensors()[0].source->view();
  EXPECT_EQ(view.rank(), 0);
  EXPECT_EQ(*static_cast<const double*>(view.data), 3.25);
}

TEST(NpyReaderTest, TupleWithTrailingCommaAndEmptyDimsAreAccepted) {
  auto parsed = ParseBytes(NpyBytes(Dict("<f4", "(2, 0, 3,)"), ""));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors()[0].source->view().dims, Dims({2, 0, 3}));
}

TEST(NpyReaderTest, FortranOrderBecomesColumnMajorStridesNotACopy) {
  // numpy writes a Fortran array's elements in column-major order: for [[0,1,2],[3,4,5]] that is
  // 0,3,1,4,2,5.
  const std::vector<int64_t> file_order = {0, 3, 1, 4, 2, 5};
  auto parsed = ParseBytes(NpyBytes(Dict("<i8", "(2, 3)", /*fortran=*/true), RawBytes(file_order)));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const TensorFileEntry& entry = parsed->tensors()[0];
  EXPECT_TRUE(entry.zero_copy);
  const HostView& view = entry.source->view();
  EXPECT_EQ(view.dims, Dims({2, 3}));
  EXPECT_EQ(view.byte_strides, Dims({8, 16}));
  EXPECT_EQ(view.data, parsed->file()->data() + 128);
  EXPECT_EQ(ReadRowMajor<int64_t>(view), std::vector<int64_t>({0, 1, 2, 3, 4, 5}));
}

TEST(NpyReaderTest, BigEndianDataIsBorrowedAndSwappedByTheCopy) {
  std::string data;
  for (uint32_t value : {0x01020304u, 0xA0B0C0D0u}) {
    for (int shift = 24; shift >= 0; shift -= 8) data.push_back(static_cast<char>(value >> shift));
  }
  auto parsed = ParseBytes(NpyBytes(Dict(">u4", "(2,)"), data));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const TensorFileEntry& entry = parsed->tensors()[0];
  EXPECT_TRUE(entry.byte_swapped);
  EXPECT_TRUE(entry.zero_copy);
  EXPECT_EQ(entry.file_offset, 128);  // numpy's 10-byte prefix + dict, padded to 128
  // The view points into the file's bytes as they are, marked for the copy to swap.
  const HostView& view = entry.source->view();
  EXPECT_TRUE(view.byte_swapped);
  EXPECT_EQ(view.data, static_cast<const void*>(parsed->file()->data() + 128));
  EXPECT_EQ(view.dtype, DType::kU32);
  EXPECT_EQ(ReadRowMajor<uint32_t>(entry.source->view()),
            std::vector<uint32_t>({0x01020304u, 0xA0B0C0D0u}));
}

TEST(NpyReaderTest, BigEndianComplexSwapsEachPartOnItsOwn) {
  // complex64 (1.5 - 2i): two big-endian float32, real part first.
  std::string data;
  for (float part : {1.5f, -2.0f}) {
    uint32_t bits;
    std::memcpy(&bits, &part, 4);
    for (int shift = 24; shift >= 0; shift -= 8) data.push_back(static_cast<char>(bits >> shift));
  }
  auto parsed = ParseBytes(NpyBytes(Dict(">c8", "(1,)"), data));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const auto value = ReadRowMajor<std::complex<float>>(parsed->tensors()[0].source->view());
  EXPECT_EQ(value[0], std::complex<float>(1.5f, -2.0f));
}

TEST(NpyReaderTest, BigEndianFortranKeepsColumnMajorStrides) {
  std::string data;
  for (int16_t value : {0, 3, 1, 4, 2, 5}) {
    data.push_back(static_cast<char>(value >> 8));
    data.push_back(static_cast<char>(value & 0xFF));
  }
  auto parsed = ParseBytes(NpyBytes(Dict(">i2", "(2, 3)", true), data));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const HostView& view = parsed->tensors()[0].source->view();
  EXPECT_EQ(view.byte_strides, Dims({2, 4}));
  EXPECT_EQ(ReadRowMajor<int16_t>(view), std::vector<int16_t>({0, 1, 2, 3, 4, 5}));
}

TEST(NpyReaderTest, OneByteTypesIgnoreTheByteOrderMark) {
  for (const char* descr : {"|b1", "<b1", ">b1", "|u1", ">i1", "=u1", "b1"}) {
    auto parsed = ParseBytes(NpyBytes(Dict(descr, "(2,)"), std::string("\x01\x00", 2)));
    ASSERT_TRUE(parsed.ok()) << descr << ": " << parsed.status();
    EXPECT_FALSE(parsed->tensors()[0].byte_swapped) << descr;
  }
}

TEST(NpyReaderTest, EveryNumpyDescrOfTheTableIsRead) {
  for (DType dtype : AllDTypes()) {
    const DTypeInfo& info = GetDTypeInfo(dtype);
    if (info.numpy_descr.empty()) continue;
    auto parsed = ParseBytes(NpyBytes(Dict(std::string(info.numpy_descr), "(3,)"),
                                      std::string(3 * info.size_bytes, '\x01')));
    ASSERT_TRUE(parsed.ok()) << info.name << ": " << parsed.status();
    EXPECT_EQ(parsed->tensors()[0].source->view().dtype, dtype);
  }
}

TEST(NpyReaderTest, FileTooSmallOrWithoutMagicIsRejected) {
  ExpectRejected("\x93NUMPY\x01", {"7 bytes is too small for a .npy file"});
  ExpectRejected(std::string("\x93NUMPZ\x01\x00\x00\x00", 10),
                 {"does not start with the .npy magic"});
}

TEST(NpyReaderTest, UnknownVersionIsRejected) {
  std::string bytes = NpyBytes(Dict("<f4", "()"), "abcd");
  bytes[6] = 4;
  ExpectRejected(bytes, {"unsupported .npy format version 4.0"});
  bytes[6] = 1;
  bytes[7] = 1;
  ExpectRejected(bytes, {"version 1.1"});
}

TEST(NpyReaderTest, HeaderLengthPastTheEndIsRejected) {
  std::string bytes = NpyBytes(Dict("<f4", "()"), "abcd");
  bytes[8] = '\xFF';
  bytes[9] = '\xFF';
  ExpectRejected(bytes, {"header length 65535 reaches past the end"});
}

TEST(NpyReaderTest, Version3HeaderMustBeUtf8) {
  ExpectRejected(NpyBytes("{'descr': '<f4\xFF', 'fortran_order': False, 'shape': (), }", "abcd", 3),
                 {"not valid UTF-8"});
}

TEST(NpyReaderTest, HeaderMustBeADictWithExactlyTheThreeKeys) {
  ExpectRejected(NpyBytes("['descr']", ""), {"must be a dict"});
  ExpectRejected(NpyBytes("{'descr': '<f4', 'shape': (), }", "abcd"), {"lacks 'fortran_order'"});
  ExpectRejected(NpyBytes("{}", ""), {"lacks 'descr', 'fortran_order', 'shape'"});
  ExpectRejected(
      NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", "abcd"),
      {"unexpected key 'extra'"});
  ExpectRejected(
      NpyBytes("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", "abcd"),
      {"the key 'descr' appears twice"});
  ExpectRejected(NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': ()} x", "abcd"),
                 {"unexpected text after the header dict"});
  ExpectRejected(NpyBytes("{'descr': '<f4' 'fortran_order': False, 'shape': ()}", "abcd"),
                 {"expected ',' or '}'"});
  ExpectRejected(NpyBytes("{'descr': '<f4', 'fortran_order': False, 'shape': ()", "abcd"),
                 {"expected ',' or '}'"});
}

TEST(NpyReaderTest, FortranOrderMustBeABool) {
  ExpectRejected(NpyBytes("{'descr': '<f4', 'fortran_order': 0, 'shape': ()}", "abcd"),
                 {"'fortran_order' must be True or False"});
  ExpectRejected(NpyBytes("{'descr': '<f4', 'fortran_order': Truex, 'shape': ()}", "abcd"),
                 {"'fortran_order' must be True or False"});
}

TEST(NpyReaderTest, ShapeMustBeATupleOfNonNegativeInts) {
  ExpectRejected(NpyBytes(Dict("<f4", "[3]"), ""), {"'shape' must be a tuple"});
  ExpectRejected(NpyBytes(Dict("<f4", "(3)"), ""), {"(n) is an int, not a tuple"});
  ExpectRejected(NpyBytes(Dict("<f4", "(-1,)"), ""), {"'shape' must hold non-negative integers"});
  ExpectRejected(NpyBytes(Dict("<f4", "(3l,)"), ""), {"plain integers"});  // 3L: see below
  ExpectRejected(NpyBytes(Dict("<f4", "(2.0,)"), ""), {"plain integers"});
  ExpectRejected(NpyBytes(Dict("<f4", "(1_0,)"), ""), {"plain integers"});
  ExpectRejected(NpyBytes(Dict("<f4", "(03,)"), ""), {"leading zero"});
  ExpectRejected(NpyBytes(Dict("<f4", "(3 4)"), ""), {"expected ',' or ')'"});
  ExpectRejected(NpyBytes(Dict("<f4", "(,)"), ""), {"non-negative integers"});
  ExpectRejected(NpyBytes(Dict("<f4", "(99999999999999999999,)"), ""), {"does not fit a 64-bit"});
}

TEST(NpyReaderTest, ObjectArraysAreRejectedClearly) {
  ExpectRejected(NpyBytes(Dict("|O", "(2,)"), std::string(16, '\0')),
                 {"descr '|O' is an object array (pickled Python objects)"});
}

TEST(NpyReaderTest, StructuredDTypesAreRejectedClearly) {
  ExpectRejected(NpyBytes("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, "
                          "'shape': (2,), }",
                          std::string(16, '\0')),
                 {"structured dtypes (a list descr) are not supported"});
}

TEST(NpyReaderTest, UnsupportedDescrsAreRejectedByName) {
  for (const char* descr : {"<U3", "|S5", "<M8[ns]", "<f16", "<V2", "<c32", "", "<", "xyz"}) {
    ExpectRejected(NpyBytes(Dict(descr, "(1,)"), ""),
                   {std::string("unsupported descr '") + descr + "'", "f4"});
  }
  ExpectRejected(NpyBytes("{'descr': 3, 'fortran_order': False, 'shape': (), }", ""),
                 {"'descr' must be a string"});
  ExpectRejected(NpyBytes("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (), }", ""),
                 {"escape sequences"});
}

TEST(NpyReaderTest, TruncatedDataIsRejected) {
  ExpectRejected(NpyBytes(Dict("<f4", "(3, 4)"), std::string(40, '\0')),
                 {"shape (3, 4) of '<f4' needs 48 bytes of data, but only 40 follow the header"});
}

TEST(NpyReaderTest, BytesAfterTheDataAreRejected) {
  ExpectRejected(NpyBytes(Dict("<f4", "(2,)"), std::string(12, '\0')),
                 {"4 bytes follow the array data"});
}

TEST(NpyReaderTest, ShapeWhoseByteSizeOverflowsIsRejected) {
  ExpectRejected(NpyBytes(Dict("<f8", "(4611686018427387904,)"), ""), {"overflows"});
  ExpectRejected(NpyBytes(Dict("<f8", "(4294967296, 4294967296)"), ""), {"overflows"});
}

TEST(NpyReaderTest, EmptyShapeIsRejectedWhenItsOtherDimsWouldBeTooBigForNumpy) {
  // numpy skips zero dims and refuses the shape when the others times the element size overflow
  // ("array is too big"), although the array would hold no bytes at all.
  ExpectRejected(NpyBytes(Dict("<f4", "(0, 4611686018427387904)"), ""),
                 {"byte size of shape (0, 4611686018427387904) overflows",
                  "even with its zero dims left out", "array is too big"});
  ExpectRejected(NpyBytes(Dict("<f8", "(1152921504606846976, 0)", /*fortran=*/true), ""),
                 {"array is too big"});
  ExpectRejected(NpyBytes(Dict("|u1", "(3, 0, 4611686018427387904)"), ""), {"array is too big"});
  // What numpy still makes: 2^62 one-byte or 2^59 eight-byte elements.
  for (const auto& [descr, shape, stride] :
       {std::tuple{"|u1", "(0, 4611686018427387904)", int64_t{1} << 62},
        {"<f8", "(0, 576460752303423488)", int64_t{1} << 62}}) {
    auto parsed = ParseBytes(NpyBytes(Dict(descr, shape), ""), "x.npy");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->tensors()[0].source->view().num_elements(), 0);
    EXPECT_EQ(parsed->tensors()[0].source->view().byte_strides[0], stride);
  }
}

TEST(NpyReaderTest, Python2LongSuffixesAreReadInVersionOneAndTwoHeaders) {
  // Python 2's numpy wrote `3L` for a long; numpy still reads such 1.0 and 2.0 headers.
  std::vector<uint32_t> values(18);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0x9E3779B9u * static_cast<uint32_t>(i + 1);
  for (int major : {1, 2}) {
    for (const char* shape : {"(3L, 6L)", "(3L, 6L,)", "(3 L, 6)", "(3, 6L )"}) {
      auto parsed = ParseBytes(NpyBytes(Dict("<u4", shape), RawBytes(values), major), "x.npy");
      ASSERT_TRUE(parsed.ok()) << shape << " version " << major << ": " << parsed.status();
      const HostView& view = parsed->tensors()[0].source->view();
      EXPECT_EQ(view.dims, Dims({3, 6})) << shape;
      EXPECT_EQ(ReadRowMajor<uint32_t>(view), values) << shape;
    }
    auto parsed = ParseBytes(NpyBytes(Dict("<u4", "(18L,)"), RawBytes(values), major), "x.npy");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->tensors()[0].source->view().dims, Dims({18}));
    parsed = ParseBytes(NpyBytes(Dict("<u4", "(0L, 5L)"), "", major), "x.npy");
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(parsed->tensors()[0].source->view().dims, Dims({0, 5}));
  }
  // numpy drops only an uppercase L token after a number, and only before version 3.0.
  ExpectRejected(NpyBytes(Dict("<u4", "(3l, 6l)"), RawBytes(values)), {"plain integers"});
  ExpectRejected(NpyBytes(Dict("<u4", "(3LL, 6)"), RawBytes(values)), {"plain integers"});
  ExpectRejected(NpyBytes(Dict("<u4", "(03L, 6)"), RawBytes(values)), {"leading zero"});
  ExpectRejected(NpyBytes(Dict("<u4", "(3L, 6L)"), RawBytes(values), 3),
                 {"plain integers", "version 1.0 and 2.0 headers only"});
}

}  // namespace
}  // namespace ferry
