// Heap accounting for ferry-bench's `peak_extra_bytes`: the live and peak bytes of every heap
// allocation in the process, whoever makes it.
//
// heap_accounting.cc replaces glibc's malloc family for the whole process (definitions in the
// executable interpose on libc's: the documented way to replace malloc) and forwards every call to
// glibc's own allocator (__libc_malloc and friends), adding and subtracting malloc_usable_size()
// of each block while accounting is on (the accounted runs only). So it sees operator new
// (libstdc++ calls malloc), std::aligned_alloc (HostTensor, the host device's memory) and any
// staging buffer a backend allocates; memory mapped outside the heap (mmap called directly, a
// driver's pinned memory) it does not see.
//
// Sanitizer runtimes replace malloc themselves: in a sanitizer build the accounting is off,
// HeapAccountingEnabled() is false and the counters stay 0. All functions are thread-safe.
#pragma once

#include <cstdint>

namespace ferry::bench {

bool HeapAccountingEnabled();
// Counts from now on, from zero: LiveHeapBytes() is then the bytes allocated and not freed since
// this call (negative when more was freed than allocated: blocks made before it), PeakHeapBytes()
// its largest value. Outside StartHeapAccounting() ... StopHeapAccounting() nothing is counted and
// malloc and free cost no more than glibc's (timed runs must not pay for the accounting).
void StartHeapAccounting();
void StopHeapAccounting();
int64_t LiveHeapBytes();
int64_t PeakHeapBytes();

}  // namespace ferry::bench
