// The floor of a converting h2d case, measured next to it by ferry-bench: how fast any transfer
// of its bytes could be on this machine, whatever its conversion code.
//
// Threading: call from one thread; it starts and joins one thread per core itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace ferry::bench {

// One pass over every core that reads `2 * destination_bytes` bytes of `source` and writes
// `destination_bytes` of `destination` (64-byte aligned) with non-temporal stores, one integer
// pack instruction per 32 bytes written in place of a conversion: the memory traffic of f32 ->
// bf16/f16 and f64 -> f32 with the least work a core can do per byte. Returns the seconds it
// took; nullopt when the CPU lacks AVX2.
std::optional<double> MeasureHalvingFloor(const std::byte* source, std::byte* destination,
                                          int64_t destination_bytes);

}  // namespace ferry::bench
