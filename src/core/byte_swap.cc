#include "src/core/byte_swap.h"

#include <cstring>

namespace ferry {
namespace {

// memcpy in and out keeps unaligned pointers legal; compilers turn each into a plain (possibly
// unaligned) load or store and the loop into a vectorised byte shuffle.
template <typename Unit, Unit (*kSwap)(Unit)>
void SwapUnits(const std::byte* src, std::byte* dst, int64_t num_units) {
  for (int64_t i = 0; i < num_units; ++i) {
    Unit value;
    std::memcpy(&value, src + i * static_cast<int64_t>(sizeof(Unit)), sizeof(Unit));
    value = kSwap(value);
    std::memcpy(dst + i * static_cast<int64_t>(sizeof(Unit)), &value, sizeof(Unit));
  }
}

uint16_t Swap16(uint16_t value) { return __builtin_bswap16(value); }
uint32_t Swap32(uint32_t value) { return __builtin_bswap32(value); }
uint64_t Swap64(uint64_t value) { return __builtin_bswap64(value); }

}  // namespace

int64_t ByteSwapUnit(DType dtype) {
  const DTypeInfo& info = GetDTypeInfo(dtype);
  return info.kind == DTypeKind::kComplex ? info.size_bytes / 2 : info.size_bytes;
}

void ByteSwapCopy(const std::byte* src, std::byte* dst, int64_t num_units, int64_t unit_size) {
  if (num_units <= 0) return;
  switch (unit_size) {
    case 1:
      if (src != dst) std::memcpy(dst, src, static_cast<size_t>(num_units));
      return;
    case 2:
      return SwapUnits<uint16_t, Swap16>(src, dst, num_units);
    case 4:
      return SwapUnits<uint32_t, Swap32>(src, dst, num_units);
    case 8:
      return SwapUnits<uint64_t, Swap64>(src, dst, num_units);
    case 16:
      // Reverse all 16 bytes: each 8-byte half is reversed and the halves trade places. Both
      // halves are loaded before either is stored, so this works in place too.
      for (int64_t i = 0; i < num_units; ++i) {
        uint64_t low, high;
        std::memcpy(&low, src + 16 * i, 8);
        std::memcpy(&high, src + 16 * i + 8, 8);
        low = __builtin_bswap64(low);
        high = __builtin_bswap64(high);
        std::memcpy(dst + 16 * i, &high, 8);
        std::memcpy(dst + 16 * i + 8, &low, 8);
      }
      return;
    default:
      // Unreachable for ferry's dtypes (every unit is 1, 2, 4 or 8 bytes); reverse bytewise anyway.
      for (int64_t i = 0; i < num_units; ++i) {
        if (unit_size % 2 == 1)
          dst[i * unit_size + unit_size / 2] = src[i * unit_size + unit_size / 2];
        for (int64_t k = 0; k < unit_size / 2; ++k) {
          const std::byte a = src[i * unit_size + k];
          const std::byte b = src[i * unit_size + unit_size - 1 - k];
          dst[i * unit_size + k] = b;
          dst[i * unit_size + unit_size - 1 - k] = a;
        }
      }
  }
}

}  // namespace ferry
