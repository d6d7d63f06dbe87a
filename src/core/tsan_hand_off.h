// Objects that ferry hands to a PJRT plugin and gets back in a callback on another thread. The
// plugins are built without ThreadSanitizer, and tests/tsan_suppressions.txt makes TSan ignore
// what they do (called_from_lib), their own locks included, so TSan cannot see that the plugin
// orders the hand-off. These two calls state that order where ferry knows it: everything ferry
// did before HandOffToPlugin(object) happens before everything after TakeBackFromPlugin(object).
// No-ops outside TSan builds.
#pragma once

#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace ferry {

// Call just before passing `object` to the plugin.
inline void HandOffToPlugin([[maybe_unused]] void* object) {
#if defined(__SANITIZE_THREAD__)
  __tsan_release(object);
#endif
}

// Call first in the callback that gets `object` back.
inline void TakeBackFromPlugin([[maybe_unused]] void* object) {
#if defined(__SANITIZE_THREAD__)
  __tsan_acquire(object);
#endif
}

}  // namespace ferry
