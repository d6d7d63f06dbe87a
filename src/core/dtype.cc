#include "ferry/core/dtype.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "ferry/core/status.h"

namespace ferry {
namespace {

// One row per dtype, in enum order (checked below). An empty name means the format has no
// spelling for that dtype: numpy itself has no bfloat16 or float8 dtypes (ml_dtypes stores them
// as opaque "<V2"/"|V1", which says nothing about the type), and safetensors has no complex128.
constexpr std::array<DTypeInfo, kNumDTypes> kDTypeInfos = {{
    {DType::kBool, DTypeKind::kBool, 1, "bool", "|b1", "BOOL", kDLBool, 8, false},
    {DType::kS8, DTypeKind::kSignedInt, 1, "int8", "|i1", "I8", kDLInt, 8, false},
    {DType::kS16, DTypeKind::kSignedInt, 2, "int16", "<i2", "I16", kDLInt, 16, false},
    {DType::kS32, DTypeKind::kSignedInt, 4, "int32", "<i4", "I32", kDLInt, 32, false},
    {DType::kS64, DTypeKind::kSignedInt, 8, "int64", "<i8", "I64", kDLInt, 64, false},
    {DType::kU8, DTypeKind::kUnsignedInt, 1, "uint8", "|u1", "U8", kDLUInt, 8, false},
    {DType::kU16, DTypeKind::kUnsignedInt, 2, "uint16", "<u2", "U16", kDLUInt, 16, false},
    {DType::kU32, DTypeKind::kUnsignedInt, 4, "uint32", "<u4", "U32", kDLUInt, 32, false},
    {DType::kU64, DTypeKind::kUnsignedInt, 8, "uint64", "<u8", "U64", kDLUInt, 64, false},
    {DType::kF16, DTypeKind::kFloat, 2, "float16", "<f2", "F16", kDLFloat, 16, false},
    {DType::kBF16, DTypeKind::kFloat, 2, "bfloat16", "", "BF16", kDLBfloat, 16, false},
    {DType::kF32, DTypeKind::kFloat, 4, "float32", "<f4", "F32", kDLFloat, 32, false},
    {DType::kF64, DTypeKind::kFloat, 8, "float64", "<f8", "F64", kDLFloat, 64, false},
    {DType::kC64, DTypeKind::kComplex, 8, "complex64", "<c8", "C64", kDLComplex, 64, false},
    {DType::kC128, DTypeKind::kComplex, 16, "complex128", "<c16", "", kDLComplex, 128, false},
    {DType::kF8E4M3FN, DTypeKind::kFloat, 1, "float8_e4m3fn", "", "F8_E4M3", kDLFloat8_e4m3fn, 8,
     true},
    {DType::kF8E5M2, DTypeKind::kFloat, 1, "float8_e5m2", "", "F8_E5M2", kDLFloat8_e5m2, 8, true},
}};

constexpr bool RowsAreInEnumOrder() {
  for (int i = 0; i < kNumDTypes; ++i) {
    if (static_cast<int>(kDTypeInfos[i].dtype) != i) return false;
  }
  return true;
}
static_assert(RowsAreInEnumOrder(), "kDTypeInfos must list the dtypes in enum order");

constexpr std::array<DType, kNumDTypes> MakeAllDTypes() {
  std::array<DType, kNumDTypes> all{};
  for (int i = 0; i < kNumDTypes; ++i) all[i] = kDTypeInfos[i].dtype;
  return all;
}
constexpr std::array<DType, kNumDTypes> kAllDTypes = MakeAllDTypes();

// The dtype whose `field` equals `spelling`; empty fields never match.
template <typename Field>
const DTypeInfo* FindBy(Field field, std::string_view spelling) {
  if (spelling.empty()) return nullptr;
  for (const DTypeInfo& info : kDTypeInfos) {
    if (info.*field == spelling) return &info;
  }
  return nullptr;
}

// This abseil (Debian's) has its own string_view type, which StrCat needs.
absl::string_view AbslView(std::string_view text) { return {text.data(), text.size()}; }

}  // namespace

const DTypeInfo& GetDTypeInfo(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  if (index < kDTypeInfos.size()) return kDTypeInfos[index];
  // An out-of-range value can only come from casting garbage to DType. Rather than read past the
  // table, describe it as a storage-only type with no spelling anywhere, so that messages show
  // "invalid" and every conversion involving it is refused.
  static constexpr DTypeInfo kInvalid = {
      DType::kBool, DTypeKind::kBool, 1, "invalid", "", "", 0xFF, 0, true};
  return kInvalid;
}

absl::Span<const DType> AllDTypes() { return kAllDTypes; }

StatusOr<DType> DTypeFromName(std::string_view name) {
  if (const DTypeInfo* info = FindBy(&DTypeInfo::name, name)) return info->dtype;
  std::string known;
  for (DType dtype : kAllDTypes) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", AbslView(GetDTypeInfo(dtype).name));
  }
  return InvalidArgumentError(
      absl::StrCat("unknown dtype name \"", AbslView(name), "\" (ferry's dtypes: ", known, ")"));
}

StatusOr<DType> DTypeFromNumpyDescr(std::string_view descr) {
  if (!descr.empty()) {
    const char byte_order = descr.front();
    // The table holds each descr as numpy writes it; look it up under that byte-order mark.
    std::string_view rest = descr.substr(1);
    const DTypeInfo* info = nullptr;
    for (const DTypeInfo& candidate : kDTypeInfos) {
      if (!candidate.numpy_descr.empty() && candidate.numpy_descr.substr(1) == rest) {
        info = &candidate;
        break;
      }
    }
    if (info != nullptr) {
      // One-byte types have no byte order, so every mark (even '>') means the same type.
      if (info->size_bytes == 1) return info->dtype;
      if (byte_order == '<' || byte_order == '|' || byte_order == '=') return info->dtype;
      if (byte_order == '>') {
        return InvalidArgumentError(
            absl::StrCat("numpy descr \"", AbslView(descr),
                         "\" is big-endian: the reader must byte-swap it and ask for \"<",
                         AbslView(rest), "\""));
      }
    }
  }
  return InvalidArgumentError(
      absl::StrCat("unknown or unsupported numpy descr \"", AbslView(descr), "\""));
}

StatusOr<DType> DTypeFromSafetensorsName(std::string_view name) {
  if (const DTypeInfo* info = FindBy(&DTypeInfo::safetensors_name, name)) return info->dtype;
  return InvalidArgumentError(
      absl::StrCat("unknown or unsupported safetensors dtype \"", AbslView(name), "\""));
}

StatusOr<DType> DTypeFromDLPack(uint8_t code, uint8_t bits, uint16_t lanes) {
  if (lanes != 1) {
    return InvalidArgumentError(absl::StrCat("DLPack dtype (code ", int{code}, ", bits ", int{bits},
                                             ", lanes ", int{lanes},
                                             ") is a vector type; only lanes == 1 is supported"));
  }
  for (const DTypeInfo& info : kDTypeInfos) {
    if (info.dlpack_code == code && info.dlpack_bits == bits) return info.dtype;
  }
  return InvalidArgumentError(absl::StrCat("unknown or unsupported DLPack dtype (code ", int{code},
                                           ", bits ", int{bits}, ")"));
}

Status CheckConvertible(DType from, DType to) {
  for (DType dtype : {from, to}) {
    if (static_cast<size_t>(dtype) >= kDTypeInfos.size()) {
      return InvalidArgumentError(absl::StrCat("invalid dtype value ", static_cast<int>(dtype)));
    }
  }
  if (from == to) return OkStatus();
  const DTypeInfo& from_info = GetDTypeInfo(from);
  const DTypeInfo& to_info = GetDTypeInfo(to);
  if (from_info.storage_only || to_info.storage_only) {
    return UnimplementedError(absl::StrCat("converting ", AbslView(from_info.name), " to ",
                                           AbslView(to_info.name),
                                           " is not supported: float8 types are storage-only"));
  }
  if (from_info.kind == DTypeKind::kComplex && to_info.kind != DTypeKind::kComplex &&
      to_info.kind != DTypeKind::kBool) {
    return InvalidArgumentError(absl::StrCat("converting ", AbslView(from_info.name), " to ",
                                             AbslView(to_info.name),
                                             " would discard the imaginary part; convert to a "
                                             "complex type or take the real part first"));
  }
  return OkStatus();
}

}  // namespace ferry
