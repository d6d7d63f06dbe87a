// A few bits derived from the settings, kept with the SettingsGeneration() they were derived at,
// for a hot path that must not read a setting (a lock and getenv) on every call: one atomic load
// while no SetSetting or ClearSetting ran since. Used by the host allocations' huge-page advice
// (host_tensor.cc) and the prefault switch (prefault.cc).
//
// Threading: any thread. Two threads that find the copy stale both derive the value; the last
// store wins, and both are the value of a generation at least as new as the one they read.
#pragma once

#include <atomic>
#include <cstdint>

#include "ferry/core/settings.h"

namespace ferry::internal {

template <int kBits>
class SettingsCachedBits {
  static_assert(kBits > 0 && kBits < 8, "a few bits, beside the generation");

 public:
  // The bits `derive()` gives (a uint64_t below 1 << kBits), derived again only when the
  // settings generation moved since the last call.
  template <typename Derive>
  uint64_t Get(Derive derive) {
    const uint64_t generation = SettingsGeneration();
    const uint64_t value = cached_.load(std::memory_order_acquire);
    if (value >> kBits == generation) return value & kMask;
    const uint64_t bits = derive() & kMask;
    cached_.store(generation << kBits | bits, std::memory_order_release);
    return bits;
  }

 private:
  static constexpr uint64_t kMask = (uint64_t{1} << kBits) - 1;
  // generation << kBits | the bits; all ones until the first call (no generation reaches it).
  std::atomic<uint64_t> cached_{~uint64_t{0}};
};

}  // namespace ferry::internal
