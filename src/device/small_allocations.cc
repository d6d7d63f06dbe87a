#include "src/device/small_allocations.h"

#include <algorithm>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/mutex.h"
#include "src/core/fork_locks.h"

namespace ferry::internal {
namespace {

struct SlabPool {
  Mutex mutex;
  std::shared_ptr<HostSlab> current ABSL_GUARDED_BY(mutex);
  int64_t used_bytes ABSL_GUARDED_BY(mutex) = 0;  // of `current`
};

SlabPool& Pool() {
  static SlabPool* const pool = [] {
    auto* made = new SlabPool;  // never destroyed: buffers may outlive static destruction
    RegisterForkLock(ForkLockRank::kSmallAllocations, made->mutex);
    return made;
  }();
  return *pool;
}

int64_t RoundToAlignment(int64_t size_bytes) {
  constexpr auto kAlignment = static_cast<int64_t>(kHostAlignment);
  return (std::max<int64_t>(size_bytes, 1) + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace

HostSlab::~HostSlab() { FreeHostMemory(memory_, size_bytes_); }

SmallAllocation AllocateSmall(int64_t size_bytes) {
  const int64_t rounded = RoundToAlignment(size_bytes);
  SlabPool& pool = Pool();
  std::shared_ptr<HostSlab> replaced;  // released after the lock: it may free its memory
  MutexLock lock(pool.mutex);
  if (pool.current == nullptr || pool.used_bytes + rounded > kSlabBytes) {
    // A new slab, made under the lock (once per 32 or more allocations), so that threads racing
    // past a full slab do not each make one and leave most of them empty.
    std::byte* memory = AllocateHostMemory(kSlabBytes);
    if (memory == nullptr) return {};
    replaced = std::exchange(pool.current, std::make_shared<HostSlab>(memory, kSlabBytes));
    pool.used_bytes = 0;
  }
  std::byte* data = pool.current->memory() + pool.used_bytes;
  pool.used_bytes += rounded;
  return {data, pool.current};
}

}  // namespace ferry::internal
