// The conversion kernel levels: their names, what this CPU supports (detected once), and the
// level FERRY_CONVERT_KERNELS allows. GetConvertKernel (convert.cc) picks the kernels.

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <optional>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "ferry/core/convert.h"
#include "ferry/core/mutex.h"
#include "ferry/core/settings.h"
#include "ferry/core/status.h"
#include "fmt/format.h"
#include "src/core/fork_locks.h"

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

namespace {

// BestConvertKernelLevel() capped by FERRY_CONVERT_KERNELS.
StatusOr<ConvertKernelLevel> ReadActiveLevel() {
  const ConvertKernelLevel best = BestConvertKernelLevel();
  FERRY_ASSIGN_OR_RETURN(const std::optional<ConvertKernelLevel> cap, settings::ConvertKernels());
  if (!cap.has_value()) return best;
  return std::min(best, *cap);
}

// The level read at a SettingsGeneration(); read again when that changes. The hot path (every
// kernel lookup) is two atomic loads.
struct ActiveLevel {
  static constexpr int kNone = -1;
  std::atomic<uint64_t> generation{0};
  std::atomic<int> level{kNone};  // kNone: not read yet, or the setting is bad
  Mutex mutex;
  Status error ABSL_GUARDED_BY(mutex);
};

}  // namespace

StatusOr<ConvertKernelLevel> ActiveConvertKernelLevel() {
  static auto* const active = [] {
    auto* created = new ActiveLevel();
    internal::RegisterForkLock(internal::ForkLockRank::kConvertKernelLevel, created->mutex);
    return created;
  }();
  const uint64_t generation = SettingsGeneration();
  if (active->generation.load(std::memory_order_acquire) == generation) {
    const int level = active->level.load(std::memory_order_acquire);
    if (level != ActiveLevel::kNone) return static_cast<ConvertKernelLevel>(level);
  }
  MutexLock lock(active->mutex);
  const uint64_t current = SettingsGeneration();
  const int known = active->level.load(std::memory_order_acquire);
  if (active->generation.load(std::memory_order_acquire) == current && !active->error.ok()) {
    return active->error;
  }
  if (active->generation.load(std::memory_order_acquire) == current &&
      known != ActiveLevel::kNone) {
    return static_cast<ConvertKernelLevel>(known);
  }
  StatusOr<ConvertKernelLevel> level = ReadActiveLevel();
  active->error = level.status();
  active->level.store(level.ok() ? static_cast<int>(*level) : ActiveLevel::kNone,
                      std::memory_order_release);
  active->generation.store(current, std::memory_order_release);
  return level;
}

}  // namespace ferry
