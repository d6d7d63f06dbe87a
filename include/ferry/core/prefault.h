// Prefaulting a destination before a large copy writes it.
//
// The first write to a page of memory the process has never touched (a fresh allocation, a
// tensor a framework just made) takes a page fault: one trap per 4 KiB page, taken one after the
// other inside the copy loop. A copy into fresh memory spends most of its time there (on this
// project's 2-core VM a 64 MiB memcpy takes 5 ms into memory written before and 19 ms into fresh
// memory on two threads). Linux 5.14's MADV_POPULATE_WRITE faults a whole range in, writable, in
// one call, without writing a byte of it: the same pages for less (that copy 13 ms; a 256 MiB
// pread from the page cache 67 -> 51 ms). On memory already written it would cost a page-table
// walk (40% of a warm copy), so the range is first checked with mincore (one call per 8 MiB,
// under 0.5 us per MiB) and only each MiB that holds a page not yet resident is faulted in.
//
// Used by ferry's large writes into memory it does not know to be warm: the transfer engine's
// chunks with a dense destination, and the reads of a load into device memory.
//
// Threading: any thread, any number at once; ranges may overlap.
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

// Ranges smaller than this are left to the copy: the system calls would cost what they save.
inline constexpr int64_t kMinPrefaultBytes = int64_t{256} << 10;

// Faults in, writable, the pages lying wholly inside [data, data + size) that are not resident yet,
// leaving every byte as it is. Advice only, never an error: nothing happens for a range under
// kMinPrefaultBytes, with FERRY_HOST_PREFAULT=off, on a kernel without MADV_POPULATE_WRITE, or
// where the kernel refuses (a range not mapped, or not writable: the copy then fails as it would
// have anyway). Returns the bytes it asked the kernel to fault in (0 when it asked for none),
// for tests and metrics.
int64_t PrefaultForWriting(void* data, int64_t size);

// Whether this kernel has MADV_POPULATE_WRITE (probed once per process on a page of its own).
bool KernelCanPrefault();

// In words, for `ferry devices`: whether fresh pages are faulted in ahead now, and if not, why.
std::string PrefaultDescription();

}  // namespace ferry
