// Little-endian integer loads and stores at any alignment (file headers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace ferry::io_internal {

template <typename T>
T LoadLittleEndian(const std::byte* bytes) {
  T value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    value |= static_cast<T>(static_cast<T>(static_cast<uint8_t>(bytes[i])) << (8 * i));
  }
  return value;
}

// Appends `value` to `out`, least significant byte first.
template <typename T>
void AppendLittleEndian(std::string& out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) {
    out.push_back(static_cast<char>(static_cast<uint64_t>(value) >> (8 * i) & 0xFF));
  }
}

}  // namespace ferry::io_internal
