// The conversion kernel levels: their names, what this CPU supports (detected once), and the
// level FERRY_CONVERT_KERNELS allows. GetConvertKernel (convert.cc) picks the kernels.

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "ferry/core/convert.h"
#include "ferry/core/status.h"
#include "fmt/format.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace ferry {
namespace {

constexpr ConvertKernelLevel kLevels[] = {ConvertKernelLevel::kPortable, ConvertKernelLevel::kAvx2,
                                          ConvertKernelLevel::kAvx512};

#if defined(__x86_64__)
ConvertKernelLevel DetectLevel() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return ConvertKernelLevel::kPortable;
  const bool has_avx2_companions = (ecx & bit_AVX) != 0 && (ecx & bit_F16C) != 0 &&
                                   (ecx & bit_FMA) != 0 && (ecx & bit_OSXSAVE) != 0;
  if (!has_avx2_companions) return ConvertKernelLevel::kPortable;
  // The CPU having the instructions is not enough: the OS must save the vector registers on a
  // context switch, which it announces in XCR0 (bits 1-2: XMM and YMM; 5-7: the AVX-512 state).
  uint32_t xcr0 = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0), "=d"(xcr0_high) : "c"(0));
  if ((xcr0 & 0x06u) != 0x06u) return ConvertKernelLevel::kPortable;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return ConvertKernelLevel::kPortable;
  if ((ebx & bit_AVX2) == 0) return ConvertKernelLevel::kPortable;
  const bool has_avx512 =
      (ebx & bit_AVX512F) != 0 && (ebx & bit_AVX512BW) != 0 && (ebx & bit_AVX512VL) != 0;
  if (!has_avx512 || (xcr0 & 0xE6u) != 0xE6u) return ConvertKernelLevel::kAvx2;
  return ConvertKernelLevel::kAvx512;
}
#else
ConvertKernelLevel DetectLevel() { return ConvertKernelLevel::kPortable; }
#endif

}  // namespace

std::string_view ConvertKernelLevelName(ConvertKernelLevel level) {
  switch (level) {
    case ConvertKernelLevel::kPortable:
      return "portable";
    case ConvertKernelLevel::kAvx2:
      return "avx2";
    case ConvertKernelLevel::kAvx512:
      return "avx512";
  }
  return "invalid";
}

StatusOr<ConvertKernelLevel> ConvertKernelLevelFromName(std::string_view name) {
  for (ConvertKernelLevel level : kLevels) {
    if (name == ConvertKernelLevelName(level)) return level;
  }
  return InvalidArgumentError(
      fmt::format("unknown conversion kernel level '{}': expected portable, avx2 or avx512", name));
}

ConvertKernelLevel BestConvertKernelLevel() {
  static const ConvertKernelLevel best = DetectLevel();
  return best;
}

StatusOr<ConvertKernelLevel> ActiveConvertKernelLevel() {
  static const StatusOr<ConvertKernelLevel> active = []() -> StatusOr<ConvertKernelLevel> {
    const ConvertKernelLevel best = BestConvertKernelLevel();
    const char* env = std::getenv("FERRY_CONVERT_KERNELS");
    if (env == nullptr || *env == '\0') return best;  // unset or empty: no cap
    StatusOr<ConvertKernelLevel> cap = ConvertKernelLevelFromName(env);
    if (!cap.ok()) {
      return InvalidArgumentError(
          fmt::format("FERRY_CONVERT_KERNELS must be portable, avx2 or avx512, got '{}'", env));
    }
    return std::min(best, *cap);
  }();
  return active;
}

}  // namespace ferry
