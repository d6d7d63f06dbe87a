// Small device allocations carved out of shared 1 MiB slabs of host memory: the memory behind the
// buffers of small tensors on devices whose memory the host addresses (host, the direct pjrt
// path, ferry's plugin).
//
// Why: a batch of thousands of small tensors (a model's biases and norms, a data loader's
// records) otherwise costs one aligned malloc and one free per tensor, and glibc's memalign on a
// heap fragmented by them (searching, splitting and consolidating free chunks) took more time than
// copying the tensors' bytes. The idea of PyTorch's caching allocator's small pool, reduced: one
// process-wide current slab, each allocation a bump of its offset under a mutex held for a few
// instructions.
//
// Ownership: every allocation holds its slab (a shared_ptr), and the pool holds the current one;
// a slab goes back to the host memory cache (FreeHostMemory) when the pool has moved on and its
// last allocation is freed. Memory is never reused inside a slab, so one live allocation keeps
// its whole slab: at most 1 MiB (a slab holds at least 1 MiB / 32 KiB = 32 allocations). Slab
// memory is host memory, counted in no device's bytes_in_use (the allocations themselves are,
// exactly, by their callers).
//
// Thread-safe; the pool's mutex is held across fork() (fork_locks.h), and takes the host memory
// cache's locks (a new slab) while held.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ferry::internal {

// The largest allocation taken from a slab; larger ones come from AllocateHostMemory directly.
inline constexpr int64_t kSmallAllocationMaxBytes = int64_t{32} << 10;
inline constexpr int64_t kSlabBytes = int64_t{1} << 20;

// One slab of host memory; freed when its last holder lets go.
class HostSlab {
 public:
  HostSlab(std::byte* memory, int64_t size_bytes) : memory_(memory), size_bytes_(size_bytes) {}
  ~HostSlab();
  HostSlab(const HostSlab&) = delete;
  HostSlab& operator=(const HostSlab&) = delete;

  std::byte* memory() const { return memory_; }

 private:
  std::byte* const memory_;
  const int64_t size_bytes_;
};

struct SmallAllocation {
  std::byte* data = nullptr;  // null when memory ran out
  std::shared_ptr<HostSlab> slab;
};

// `size_bytes` (at most kSmallAllocationMaxBytes; 0 is allowed) of 64-byte aligned host memory
// from the current slab, or from a new one when it is full.
SmallAllocation AllocateSmall(int64_t size_bytes);

}  // namespace ferry::internal
