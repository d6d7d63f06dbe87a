#include "ferry/core/host_tensor.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <new>
#include <optional>

#include "absl/strings/numbers.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/core/freed_memory_cache.h"

namespace ferry {

namespace {

// Below this, glibc's bins serve allocations well enough; from it on, 64-byte aligned blocks go
// through its memalign path, which splits and consolidates chunks (measured: half the time of a
// 16384-tensor put of 4 KiB tensors was in it), and large ones cost first-touch page faults.
constexpr int64_t kMinCachedBytes = int64_t{1} << 10;

// GCC says __SANITIZE_ADDRESS__, clang __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define FERRY_ADDRESS_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_ADDRESS_SANITIZER 1
#endif
#endif
#if defined(FERRY_ADDRESS_SANITIZER)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

// Off under AddressSanitizer, so that a use after free of a cached block stays detectable.
constexpr int64_t kDefaultCacheLimitBytes = kAddressSanitizer ? 0 : int64_t{1} << 30;

int64_t CacheLimitFromEnvironment() {
  const char* env = std::getenv("FERRY_HOST_MEMORY_CACHE_BYTES");
  int64_t limit = 0;
  if (env == nullptr || !absl::SimpleAtoi(env, &limit) || limit < 0) {
    return kDefaultCacheLimitBytes;
  }
  return limit;
}

std::byte* AllocateFromSystem(int64_t size_bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  const size_t size = static_cast<size_t>(std::max<int64_t>(size_bytes, 1));
  const size_t alignment = size >= kHugePage ? kHugePage : kHostAlignment;
  // aligned_alloc needs a size that is a multiple of the alignment.
  const size_t rounded = (size + alignment - 1) / alignment * alignment;
  void* memory = std::aligned_alloc(alignment, rounded);
  if (memory != nullptr && alignment == kHugePage) {
    madvise(memory, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing
  }
  return static_cast<std::byte*>(memory);
}

// Never destroyed: blocks freed during static destruction still find it.
FreedMemoryCache<std::byte*>& Cache() {
  static auto* const cache = new FreedMemoryCache<std::byte*>(
      CacheLimitFromEnvironment(), kMinCachedBytes, [](std::byte* memory) { std::free(memory); });
  return *cache;
}

}  // namespace

std::byte* AllocateHostMemory(int64_t size_bytes) {
  if (size_bytes >= kMinCachedBytes) {
    if (std::optional<std::byte*> cached = Cache().Take(size_bytes)) return *cached;
  }
  std::byte* memory = AllocateFromSystem(size_bytes);
  if (memory == nullptr && Cache().ReleaseAll()) memory = AllocateFromSystem(size_bytes);
  return memory;
}

void FreeHostMemory(std::byte* memory, int64_t size_bytes) {
  if (memory == nullptr) return;
  Cache().Give(memory, size_bytes);
}

int64_t CachedHostMemoryBytes() { return Cache().cached_bytes(); }
int64_t HostMemoryCacheLimitBytes() { return Cache().limit_bytes(); }
void ReleaseCachedHostMemory() { Cache().ReleaseAll(); }

StatusOr<HostTensor> HostTensor::Allocate(DType dtype, absl::Span<const int64_t> dims) {
  FERRY_ASSIGN_OR_RETURN(int64_t count, CheckedNumElements(dims));
  int64_t size_bytes;
  if (__builtin_mul_overflow(count, DTypeSize(dtype), &size_bytes)) {
    return InvalidArgumentError("host tensor size in bytes overflows int64");
  }
  HostTensor tensor;
  tensor.dtype_ = dtype;
  tensor.dims_.assign(dims.begin(), dims.end());
  tensor.size_bytes_ = size_bytes;
  std::byte* memory = AllocateHostMemory(size_bytes);
  if (memory == nullptr) {
    return ResourceExhaustedError(
        fmt::format("cannot allocate {} bytes of host memory", size_bytes));
  }
  tensor.data_ = std::unique_ptr<std::byte[], AlignedFree>(memory, AlignedFree{size_bytes});
  return tensor;
}

}  // namespace ferry
