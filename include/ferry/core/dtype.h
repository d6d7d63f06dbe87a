// DType: the element types ferry moves, with their names in every format it speaks.
//
// Every function here is pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/types/span.h"
#include "ferry/core/status.h"

namespace ferry {

enum class DType : uint8_t {
  kBool,
  kS8,
  kS16,
  kS32,
  kS64,
  kU8,
  kU16,
  kU32,
  kU64,
  kF16,
  kBF16,
  kF32,
  kF64,
  kC64,
  kC128,
  // Storage-only 8-bit floats: same-dtype transfers work; converting them is Unimplemented.
  kF8E4M3FN,
  kF8E5M2,
};

inline constexpr int kNumDTypes = 17;

enum class DTypeKind : uint8_t { kBool, kSignedInt, kUnsignedInt, kFloat, kComplex };

// DLPack type codes (dlpack.h `DLDataTypeCode`).
inline constexpr uint8_t kDLInt = 0;
inline constexpr uint8_t kDLUInt = 1;
inline constexpr uint8_t kDLFloat = 2;
inline constexpr uint8_t kDLBfloat = 4;
inline constexpr uint8_t kDLComplex = 5;
inline constexpr uint8_t kDLBool = 6;
inline constexpr uint8_t kDLFloat8_e4m3fn = 10;
inline constexpr uint8_t kDLFloat8_e5m2 = 12;

struct DTypeInfo {
  DType dtype;
  DTypeKind kind;
  int64_t size_bytes;
  std::string_view name;  // canonical: "float32"
  // Spellings in other formats; empty where the format has none (docs/conversions.md).
  std::string_view numpy_descr;       // little-endian numpy descr: "<f4"; "|b1" for bool;
                                      // empty for bfloat16 and the float8 types
  std::string_view safetensors_name;  // "F32"; empty for complex128
  uint8_t dlpack_code;
  uint8_t dlpack_bits;
  bool storage_only;  // f8 types: no conversion to or from other dtypes
};

// The static description of `dtype`. Valid for the life of the program. A value outside the
// enum gets a row named "invalid" (storage-only, no spellings) instead of undefined behaviour.
const DTypeInfo& GetDTypeInfo(DType dtype);

inline int64_t DTypeSize(DType dtype) { return GetDTypeInfo(dtype).size_bytes; }
inline std::string_view DTypeName(DType dtype) { return GetDTypeInfo(dtype).name; }

// Every dtype, in enum order.
absl::Span<const DType> AllDTypes();

// Look-ups from each format's spelling. Unknown spellings are InvalidArgument naming them.
StatusOr<DType> DTypeFromName(std::string_view name);
// Accepts '<', '|' and '=' byte orders (this library is little-endian only). A '>' descr of a
// multi-byte type is InvalidArgument: the file readers byte-swap such data and look up the '<'
// descr. One-byte types have no byte order, so every mark (even '>') is accepted for them.
StatusOr<DType> DTypeFromNumpyDescr(std::string_view descr);
StatusOr<DType> DTypeFromSafetensorsName(std::string_view name);
StatusOr<DType> DTypeFromDLPack(uint8_t code, uint8_t bits, uint16_t lanes);

// OK when elements of `from` can be converted to `to` (see docs/conversions.md):
// same dtype always; storage-only types only to themselves (Unimplemented otherwise);
// complex to a real type other than bool is InvalidArgument; a value outside the enum is
// InvalidArgument; everything else is defined.
Status CheckConvertible(DType from, DType to);

}  // namespace ferry
