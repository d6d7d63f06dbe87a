#include "ferry/core/dtype.h"

#include <set>
#include <string>
#include <string_view>
#include <utility>

#include "gtest/gtest.h"

namespace ferry {
namespace {

// The table, written out independently of src/core/dtype.cc.
struct ExpectedRow {
  DType dtype;
  DTypeKind kind;
  int64_t size;
  std::string_view name;
  std::string_view numpy_descr;
  std::string_view safetensors_name;
  int dlpack_code;
  int dlpack_bits;
  bool storage_only;
};
constexpr ExpectedRow kExpected[] = {
    {DType::kBool, DTypeKind::kBool, 1, "bool", "|b1", "BOOL", 6, 8, false},
    {DType::kS8, DTypeKind::kSignedInt, 1, "int8", "|i1", "I8", 0, 8, false},
    {DType::kS16, DTypeKind::kSignedInt, 2, "int16", "<i2", "I16", 0, 16, false},
    {DType::kS32, DTypeKind::kSignedInt, 4, "int32", "<i4", "I32", 0, 32, false},
    {DType::kS64, DTypeKind::kSignedInt, 8, "int64", "<i8", "I64", 0, 64, false},
    {DType::kU8, DTypeKind::kUnsignedInt, 1, "uint8", "|u1", "U8", 1, 8, false},
    {DType::kU16, DTypeKind::kUnsignedInt, 2, "uint16", "<u2", "U16", 1, 16, false},
    {DType::kU32, DTypeKind::kUnsignedInt, 4, "uint32", "<u4", "U32", 1, 32, false},
    {DType::kU64, DTypeKind::kUnsignedInt, 8, "uint64", "<u8", "U64", 1, 64, false},
    {DType::kF16, DTypeKind::kFloat, 2, "float16", "<f2", "F16", 2, 16, false},
    {DType::kBF16, DTypeKind::kFloat, 2, "bfloat16", "", "BF16", 4, 16, false},
    {DType::kF32, DTypeKind::kFloat, 4, "float32", "<f4", "F32", 2, 32, false},
    {DType::kF64, DTypeKind::kFloat, 8, "float64", "<f8", "F64", 2, 64, false},
    {DType::kC64, DTypeKind::kComplex, 8, "complex64", "<c8", "C64", 5, 64, false},
    {DType::kC128, DTypeKind::kComplex, 16, "complex128", "<c16", "", 5, 128, false},
    {DType::kF8E4M3FN, DTypeKind::kFloat, 1, "float8_e4m3fn", "", "F8_E4M3", 10, 8, true},
    {DType::kF8E5M2, DTypeKind::kFloat, 1, "float8_e5m2", "", "F8_E5M2", 12, 8, true},
};

TEST(DTypeTest, TableMatchesTheDocumentedSpellingsOfEveryDType) {
  ASSERT_EQ(std::size(kExpected), static_cast<size_t>(kNumDTypes));
  for (const ExpectedRow& row : kExpected) {
    const DTypeInfo& info = GetDTypeInfo(row.dtype);
    SCOPED_TRACE(std::string(row.name));
    EXPECT_EQ(info.dtype, row.dtype);
    EXPECT_EQ(info.kind, row.kind);
    EXPECT_EQ(info.size_bytes, row.size);
    EXPECT_EQ(DTypeSize(row.dtype), row.size);
    EXPECT_EQ(info.name, row.name);
    EXPECT_EQ(DTypeName(row.dtype), row.name);
    EXPECT_EQ(info.numpy_descr, row.numpy_descr);
    EXPECT_EQ(info.safetensors_name, row.safetensors_name);
    EXPECT_EQ(info.dlpack_code, row.dlpack_code);
    EXPECT_EQ(info.dlpack_bits, row.dlpack_bits);
    EXPECT_EQ(info.storage_only, row.storage_only);
    EXPECT_EQ(info.dlpack_bits, 8 * info.size_bytes);
  }
}

TEST(DTypeTest, AllDTypesListsEachDTypeOnceInEnumOrder) {
  const absl::Span<const DType> all = AllDTypes();
  ASSERT_EQ(all.size(), static_cast<size_t>(kNumDTypes));
  for (int i = 0; i < kNumDTypes; ++i) EXPECT_EQ(static_cast<int>(all[i]), i);
}

TEST(DTypeTest, EverySpellingRoundTrips) {
  for (DType dtype : AllDTypes()) {
    const DTypeInfo& info = GetDTypeInfo(dtype);
    SCOPED_TRACE(std::string(info.name));
    StatusOr<DType> by_name = DTypeFromName(info.name);
    ASSERT_TRUE(by_name.ok()) << by_name.status();
    EXPECT_EQ(*by_name, dtype);
    if (!info.numpy_descr.empty()) {
      StatusOr<DType> by_descr = DTypeFromNumpyDescr(info.numpy_descr);
      ASSERT_TRUE(by_descr.ok()) << by_descr.status();
      EXPECT_EQ(*by_descr, dtype);
    }
    if (!info.safetensors_name.empty()) {
      StatusOr<DType> by_safetensors = DTypeFromSafetensorsName(info.safetensors_name);
      ASSERT_TRUE(by_safetensors.ok()) << by_safetensors.status();
      EXPECT_EQ(*by_safetensors, dtype);
    }
    StatusOr<DType> by_dlpack = DTypeFromDLPack(info.dlpack_code, info.dlpack_bits, 1);
    ASSERT_TRUE(by_dlpack.ok()) << by_dlpack.status();
    EXPECT_EQ(*by_dlpack, dtype);
  }
}

TEST(DTypeTest, SpellingsAreUniqueWithinEachFormat) {
  std::set<std::string_view> names, descrs, safetensors;
  std::set<std::pair<int, int>> dlpack;
  for (DType dtype : AllDTypes()) {
    const DTypeInfo& info = GetDTypeInfo(dtype);
    EXPECT_TRUE(names.insert(info.name).second) << info.name;
    if (!info.numpy_descr.empty()) {
      EXPECT_TRUE(descrs.insert(info.numpy_descr.substr(1)).second);
    }
    if (!info.safetensors_name.empty()) {
      EXPECT_TRUE(safetensors.insert(info.safetensors_name).second);
    }
    EXPECT_TRUE(dlpack.insert({info.dlpack_code, info.dlpack_bits}).second) << info.name;
  }
}

TEST(DTypeTest, UnknownNamesAreInvalidArgumentNamingTheSpelling) {
  for (std::string_view bad : {"float", "Float32", "f32", "int", "", "bfloat16 ", "complex"}) {
    StatusOr<DType> dtype = DTypeFromName(bad);
    ASSERT_FALSE(dtype.ok()) << bad;
    EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(dtype.status().message().find(absl::string_view(bad.data(), bad.size())),
              absl::string_view::npos)
        << dtype.status();
    // ... and listing the names there are, so that a user sees the right spelling.
    EXPECT_NE(dtype.status().message().find("ferry's dtypes: bool, "), absl::string_view::npos)
        << dtype.status();
    EXPECT_NE(dtype.status().message().find("bfloat16"), absl::string_view::npos);
  }
}

TEST(DTypeTest, NumpyDescrAcceptsLittleNativeAndNotApplicableByteOrders) {
  for (std::string_view descr : {"<f4", "=f4", "|f4"}) {
    StatusOr<DType> dtype = DTypeFromNumpyDescr(descr);
    ASSERT_TRUE(dtype.ok()) << descr << ": " << dtype.status();
    EXPECT_EQ(*dtype, DType::kF32);
  }
  EXPECT_EQ(*DTypeFromNumpyDescr("=c16"), DType::kC128);
  EXPECT_EQ(*DTypeFromNumpyDescr("<u8"), DType::kU64);
  EXPECT_EQ(*DTypeFromNumpyDescr("<f2"), DType::kF16);
  // One-byte types have no byte order: every mark names the same type.
  for (std::string_view descr : {"|b1", "<b1", "=b1", ">b1"}) {
    EXPECT_EQ(*DTypeFromNumpyDescr(descr), DType::kBool) << descr;
  }
  for (std::string_view descr : {"|u1", "<u1", ">u1"}) {
    EXPECT_EQ(*DTypeFromNumpyDescr(descr), DType::kU8) << descr;
  }
  for (std::string_view descr : {"|i1", "<i1", "=i1"}) {
    EXPECT_EQ(*DTypeFromNumpyDescr(descr), DType::kS8) << descr;
  }
}

TEST(DTypeTest, NumpyBigEndianDescrIsRejectedAskingTheReaderToByteSwap) {
  StatusOr<DType> dtype = DTypeFromNumpyDescr(">f8");
  ASSERT_FALSE(dtype.ok());
  EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(dtype.status().message().find("big-endian"), absl::string_view::npos);
  EXPECT_NE(dtype.status().message().find(">f8"), absl::string_view::npos);
  EXPECT_NE(dtype.status().message().find("byte-swap"), absl::string_view::npos);
  EXPECT_FALSE(DTypeFromNumpyDescr(">i4").ok());
  EXPECT_FALSE(DTypeFromNumpyDescr(">c8").ok());
}

TEST(DTypeTest, UnknownNumpyDescrsAreInvalidArgumentNamingTheSpelling) {
  for (std::string_view bad :
       {"", "<", "f4", "<f3", "<V2", "|O", "<U8", "<f16", "xf4", "<i4 ", "<b2", "<f4<"}) {
    StatusOr<DType> dtype = DTypeFromNumpyDescr(bad);
    ASSERT_FALSE(dtype.ok()) << "'" << bad << "'";
    EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(dtype.status().message().find(absl::string_view(bad.data(), bad.size())),
              absl::string_view::npos)
        << dtype.status();
  }
}

TEST(DTypeTest, UnknownSafetensorsNamesAreInvalidArgument) {
  // C128 has no safetensors name: the empty spelling must not find it.
  for (std::string_view bad : {"", "C128", "f32", "F8_E8M0", "F4", "BFLOAT16"}) {
    StatusOr<DType> dtype = DTypeFromSafetensorsName(bad);
    ASSERT_FALSE(dtype.ok()) << "'" << bad << "'";
    EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(dtype.status().message().find(absl::string_view(bad.data(), bad.size())),
              absl::string_view::npos);
  }
}

TEST(DTypeTest, DLPackRequiresOneLaneAndAKnownCodeAndWidth) {
  EXPECT_EQ(*DTypeFromDLPack(kDLFloat, 32, 1), DType::kF32);
  EXPECT_EQ(*DTypeFromDLPack(kDLBfloat, 16, 1), DType::kBF16);
  EXPECT_EQ(*DTypeFromDLPack(kDLComplex, 128, 1), DType::kC128);
  EXPECT_EQ(*DTypeFromDLPack(kDLBool, 8, 1), DType::kBool);
  StatusOr<DType> vector = DTypeFromDLPack(kDLFloat, 32, 4);
  ASSERT_FALSE(vector.ok());
  EXPECT_EQ(vector.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(vector.status().message().find("lanes 4"), absl::string_view::npos);
  EXPECT_FALSE(DTypeFromDLPack(kDLFloat, 32, 0).ok());
  for (auto [code, bits] : {std::pair<int, int>{kDLFloat, 128},
                            {kDLInt, 1},
                            {kDLUInt, 4},
                            {kDLBfloat, 32},
                            {kDLComplex, 32},
                            {kDLBool, 1},
                            {3, 8},
                            {99, 8}}) {
    StatusOr<DType> dtype =
        DTypeFromDLPack(static_cast<uint8_t>(code), static_cast<uint8_t>(bits), 1);
    ASSERT_FALSE(dtype.ok()) << code << "/" << bits;
    EXPECT_EQ(dtype.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(dtype.status().message().find("code " + std::to_string(code)),
              absl::string_view::npos)
        << dtype.status();
  }
}

TEST(DTypeTest, CheckConvertibleFollowsTheRulesForEveryPair) {
  for (DType from : AllDTypes()) {
    for (DType to : AllDTypes()) {
      const DTypeInfo& f = GetDTypeInfo(from);
      const DTypeInfo& t = GetDTypeInfo(to);
      absl::StatusCode expected = absl::StatusCode::kOk;
      if (from == to) {
        expected = absl::StatusCode::kOk;
      } else if (f.storage_only || t.storage_only) {
        expected = absl::StatusCode::kUnimplemented;
      } else if (f.kind == DTypeKind::kComplex && t.kind != DTypeKind::kComplex &&
                 t.kind != DTypeKind::kBool) {
        expected = absl::StatusCode::kInvalidArgument;
      }
      EXPECT_EQ(CheckConvertible(from, to).code(), expected) << f.name << " -> " << t.name;
    }
  }
}

TEST(DTypeTest, CheckConvertibleMessagesNameBothDTypes) {
  EXPECT_EQ(CheckConvertible(DType::kF8E4M3FN, DType::kF32).message(),
            "converting float8_e4m3fn to float32 is not supported: float8 types are storage-only");
  const Status complex = CheckConvertible(DType::kC128, DType::kF64);
  EXPECT_NE(complex.message().find("complex128"), absl::string_view::npos);
  EXPECT_NE(complex.message().find("float64"), absl::string_view::npos);
  EXPECT_NE(complex.message().find("imaginary"), absl::string_view::npos);
}

TEST(DTypeTest, OutOfRangeDTypeValueIsDescribedAsInvalidAndNotConvertible) {
  const auto garbage = static_cast<DType>(kNumDTypes + 3);
  EXPECT_EQ(GetDTypeInfo(garbage).name, "invalid");
  EXPECT_TRUE(GetDTypeInfo(garbage).storage_only);
  EXPECT_EQ(CheckConvertible(garbage, DType::kF32).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckConvertible(garbage, garbage).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(CheckConvertible(DType::kF32, garbage).message().find("invalid dtype value 20"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace ferry
