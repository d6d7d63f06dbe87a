#include "floor_pass.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace ferry::bench {
namespace {

// Bytes [begin, end) of the destination (multiples of 64) from bytes [2 * begin, 2 * end) of the
// source.
__attribute__((target("avx2"))) void HalvingPass(const std::byte* source, std::byte* destination,
                                                 int64_t begin, int64_t end) {
  for (int64_t i = begin; i < end; i += 64) {
    const auto* in = reinterpret_cast<const __m256i*>(source + 2 * i);
    auto* out = reinterpret_cast<__m256i*>(destination + i);
    const __m256i low = _mm256_packs_epi32(_mm256_loadu_si256(in), _mm256_loadu_si256(in + 1));
    const __m256i high = _mm256_packs_epi32(_mm256_loadu_si256(in + 2), _mm256_loadu_si256(in + 3));
    _mm256_stream_si256(out, low);
    _mm256_stream_si256(out + 1, high);
  }
  _mm_sfence();
}

}  // namespace

std::optional<double> MeasureHalvingFloor(const std::byte* source, std::byte* destination,
                                          int64_t destination_bytes) {
  if (!__builtin_cpu_supports("avx2")) return std::nullopt;
  const int64_t lines = destination_bytes / 64;
  const int64_t parts = std::max(1u, std::thread::hardware_concurrency());
  const int64_t part_lines = (lines + parts - 1) / parts;
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int64_t part = 1; part < parts; ++part) {
    const int64_t begin = std::min(lines, part * part_lines) * 64;
    const int64_t end = std::min(lines, (part + 1) * part_lines) * 64;
    threads.emplace_back([=] { HalvingPass(source, destination, begin, end); });
  }
  HalvingPass(source, destination, 0, std::min(lines, part_lines) * 64);
  for (std::thread& thread : threads) thread.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace ferry::bench
