// ScopedExactDenormals: for its scope, the calling thread's floating-point mode keeps denormal
// numbers (x86-64: MXCSR's flush-to-zero and denormals-are-zero bits cleared; aarch64: FPCR's
// flush-to-zero bit), and the mode the thread had is restored at its end.
//
// Why: a conversion must give the same bits on every thread, and ferry's run on threads it does
// not own. XLA's compute threads set both bits (a PJRT plugin's event continuations run on them),
// and a thread inherits the mode of the thread that starts it (a staging worker started from such
// a continuation). Reading the mode costs a few cycles; it is written only when it must change.
// Thread-compatible: it touches only the calling thread's state.
#pragma once

#include <cstdint>

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

namespace ferry::internal {

class ScopedExactDenormals {
 public:
  ScopedExactDenormals() {
#if defined(__x86_64__)
    saved_ = _mm_getcsr();
    constexpr unsigned kFlushToZero = 1u << 15;
    constexpr unsigned kDenormalsAreZero = 1u << 6;
    const unsigned exact = saved_ & ~(kFlushToZero | kDenormalsAreZero);
    changed_ = exact != saved_;
    if (changed_) _mm_setcsr(exact);
#elif defined(__aarch64__)
    asm volatile("mrs %0, fpcr" : "=r"(saved_));
    constexpr uint64_t kFlushToZero = uint64_t{1} << 24;
    changed_ = (saved_ & kFlushToZero) != 0;
    if (changed_) SetFpcr(saved_ & ~kFlushToZero);
#endif
  }
  ~ScopedExactDenormals() {
#if defined(__x86_64__)
    if (changed_) _mm_setcsr(saved_);
#elif defined(__aarch64__)
    if (changed_) SetFpcr(saved_);
#endif
  }
  ScopedExactDenormals(const ScopedExactDenormals&) = delete;
  ScopedExactDenormals& operator=(const ScopedExactDenormals&) = delete;

 private:
#if defined(__aarch64__)
  static void SetFpcr(uint64_t value) { asm volatile("msr fpcr, %0" : : "r"(value)); }
  uint64_t saved_ = 0;
#else
  unsigned saved_ = 0;
#endif
  bool changed_ = false;
};

}  // namespace ferry::internal
