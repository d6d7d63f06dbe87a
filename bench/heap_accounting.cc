#include "heap_accounting.h"

#include <malloc.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FERRY_BENCH_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define FERRY_BENCH_COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef FERRY_BENCH_COUNT_ALLOCATIONS
#define FERRY_BENCH_COUNT_ALLOCATIONS 1
#endif

namespace {

// Constant-initialised, so valid before any constructor runs: the first malloc may come first.
// Off outside an accounted run, so that the timed runs pay one relaxed load of a line nobody
// writes, not two contended atomic updates per malloc and free from every core.
std::atomic<bool> counting{false};
std::atomic<int64_t> live_heap_bytes{0};
std::atomic<int64_t> peak_heap_bytes{0};

[[maybe_unused]] bool Counting() { return counting.load(std::memory_order_relaxed); }

// The callers check Counting() first (and skip malloc_usable_size when it is false).
[[maybe_unused]] void AddLive(int64_t bytes) {
  const int64_t live = live_heap_bytes.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  int64_t peak = peak_heap_bytes.load(std::memory_order_relaxed);
  while (live > peak &&
         !peak_heap_bytes.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
  }
}

[[maybe_unused]] void SubtractLive(int64_t bytes) {
  live_heap_bytes.fetch_sub(bytes, std::memory_order_relaxed);
}

[[maybe_unused]] int64_t UsableSize(void* block) {
  return block == nullptr ? 0 : static_cast<int64_t>(malloc_usable_size(block));
}

[[maybe_unused]] void* Counted(void* block) {
  if (block != nullptr && Counting()) AddLive(UsableSize(block));
  return block;
}

}  // namespace

#if FERRY_BENCH_COUNT_ALLOCATIONS
extern "C" {
// glibc's own allocator, which the replacements below forward to.
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* block, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void* __libc_valloc(size_t size);
void* __libc_pvalloc(size_t size);
void __libc_free(void* block);

void* malloc(size_t size) noexcept { return Counted(__libc_malloc(size)); }
void* calloc(size_t count, size_t size) noexcept { return Counted(__libc_calloc(count, size)); }
void* memalign(size_t alignment, size_t size) noexcept {
  return Counted(__libc_memalign(alignment, size));
}
void* aligned_alloc(size_t alignment, size_t size) noexcept { return memalign(alignment, size); }
void* valloc(size_t size) noexcept { return Counted(__libc_valloc(size)); }
void* pvalloc(size_t size) noexcept { return Counted(__libc_pvalloc(size)); }

int posix_memalign(void** result, size_t alignment, size_t size) noexcept {
  if (alignment % sizeof(void*) != 0 || (alignment & (alignment - 1)) != 0) return EINVAL;
  void* block = memalign(alignment, size);
  if (block == nullptr) return ENOMEM;
  *result = block;
  return 0;
}

void free(void* block) noexcept {
  if (Counting()) SubtractLive(UsableSize(block));
  __libc_free(block);
}

void* realloc(void* block, size_t size) noexcept {
  if (!Counting()) return __libc_realloc(block, size);
  const int64_t old_size = UsableSize(block);
  void* moved = __libc_realloc(block, size);
  if (moved == nullptr) {
    // Failed (the old block stays), or size 0 (glibc freed the old block).
    if (size == 0) SubtractLive(old_size);
    return nullptr;
  }
  const int64_t new_size = UsableSize(moved);
  if (moved == block) {
    SubtractLive(old_size);
    AddLive(new_size);
  } else {
    AddLive(new_size);  // both blocks existed while the data was copied
    SubtractLive(old_size);
  }
  return moved;
}

void* reallocarray(void* block, size_t count, size_t size) noexcept {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return nullptr;
  }
  return realloc(block, bytes);
}
}  // extern "C"
#endif  // FERRY_BENCH_COUNT_ALLOCATIONS

namespace ferry::bench {

bool HeapAccountingEnabled() { return FERRY_BENCH_COUNT_ALLOCATIONS != 0; }
void StartHeapAccounting() {
  live_heap_bytes.store(0);
  peak_heap_bytes.store(0);
  counting.store(true);
}
void StopHeapAccounting() { counting.store(false); }
int64_t LiveHeapBytes() { return live_heap_bytes.load(); }
int64_t PeakHeapBytes() { return peak_heap_bytes.load(); }

}  // namespace ferry::bench
