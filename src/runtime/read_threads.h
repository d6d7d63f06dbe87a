// How many reads a file load keeps in flight when FERRY_LOAD_READ_THREADS does not say
// (FileLoadOptionsFromSettings, file_load.h).
//
// A warm load is CPU work in the kernel (each read copies the page cache into device memory), so
// on a quiet machine one read thread per core is fastest (measured: more threads cost about 10%).
// On a busy one (a parallel build), the scheduler shares the cores among runnable threads as
// equals, and a load with one thread per core gets a fraction of them: it ran about 1.4-1.7x
// slower than with four per core there (docs/performance.md). So the default counts the threads
// of other work runnable right now and adds read threads for them.
//
// Thread-safe (no state).
#pragma once

#include <optional>
#include <string_view>

namespace ferry {

// The read threads for `cores` cores while `other_runnable` threads of other work are runnable:
// `cores` when there are none; else three more per other runnable thread, at most four per core.
int LoadReadThreadsFor(int cores, int other_runnable);

// The runnable scheduling entities of the whole machine in the text of /proc/loadavg (the
// number before the slash in its fourth field, "2.98 3.00 2.62 3/108 13543": 3); nullopt where
// the text is not of that form.
std::optional<int> RunnableThreadsIn(std::string_view loadavg);

// Threads of other work runnable now: /proc/loadavg's runnable count less the calling thread,
// the least of three readings (one reading may catch another process waking for an instant); 0
// where the file cannot be read (not Linux).
int OtherRunnableThreadsNow();

// LoadReadThreadsFor(the cores this process may run on, OtherRunnableThreadsNow()).
int DefaultLoadReadThreads();

}  // namespace ferry
