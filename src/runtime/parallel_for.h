// ParallelFor: oneTBB's parallel_for over [0, count), in blocks of at least `grain` indices, on
// every core (the calling thread takes part), returning once every index has run.
//
// In a ThreadSanitizer build it runs the indices in order on the calling thread instead. oneTBB
// synchronises its tasks and its waiting caller inside libtbb, which such a build does not
// instrument: TSan then reports parallel_for's own bookkeeping (a wait counter on the caller's
// stack, decremented by a worker) and the results the caller reads afterwards as races. The calls
// a body makes (StartTransfer) are still run from many threads at once under TSan by the tests
// that call the runtime concurrently (TransferTest.ConcurrentCallersFromManyThreads); the
// parallel path itself runs in the plain and AddressSanitizer builds.
#pragma once

#include <cstddef>

#include "oneapi/tbb/blocked_range.h"
#include "oneapi/tbb/parallel_for.h"

#if defined(__SANITIZE_THREAD__)
#define FERRY_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_THREAD_SANITIZER 1
#endif
#endif

namespace ferry::internal {

template <typename Body>  // Body: void(size_t index), safe to run for different indices at once
void ParallelFor(size_t count, size_t grain, const Body& body) {
#if defined(FERRY_THREAD_SANITIZER)
  (void)grain;
  for (size_t i = 0; i < count; ++i) body(i);
#else
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, grain),
                    [&](const tbb::blocked_range<size_t>& range) {
                      for (size_t i = range.begin(); i != range.end(); ++i) body(i);
                    });
#endif
}

}  // namespace ferry::internal
