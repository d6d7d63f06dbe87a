// ParallelFor: runs body(i) for every i in [0, count), in blocks of at least `grain` indices, on
// several threads at once (the calling thread takes part), returning once every index has run.
//
// Normally that is oneTBB's parallel_for, on every core. In a ThreadSanitizer build it is a
// std::thread pool made for the call instead, still running blocks on real threads at once, so
// that TSan checks the bodies for races. Not oneTBB there: oneTBB synchronises its tasks and its
// waiting caller inside libtbb, which such a build does not instrument, so TSan would report
// parallel_for's own bookkeeping (a wait counter on the caller's stack, decremented by a worker)
// and the results the caller reads afterwards as races; std::thread's start and join, and the
// atomic block counter below, are all in code TSan sees.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

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

// The std::thread ParallelFor (every build compiles it; only TSan builds call it from
// ParallelFor). At least two threads whenever there are two blocks, even on one core, so that
// the bodies always overlap under TSan.
template <typename Body>
void ThreadParallelFor(size_t count, size_t grain, const Body& body) {
  grain = std::max<size_t>(grain, 1);
  const size_t num_blocks = (count + grain - 1) / grain;
  const size_t num_threads =
      std::min<size_t>(num_blocks, std::max<size_t>(2, std::thread::hardware_concurrency()));
  std::atomic<size_t> next_block{0};
  auto run_blocks = [&] {
    for (size_t block = next_block.fetch_add(1); block < num_blocks;
         block = next_block.fetch_add(1)) {
      const size_t end = std::min(count, (block + 1) * grain);
      for (size_t i = block * grain; i < end; ++i) body(i);
    }
  };
  std::vector<std::thread> helpers;
  helpers.reserve(num_threads > 0 ? num_threads - 1 : 0);
  for (size_t t = 1; t < num_threads; ++t) helpers.emplace_back(run_blocks);
  run_blocks();
  for (std::thread& helper : helpers) helper.join();
}

template <typename Body>  // Body: void(size_t index), safe to run for different indices at once
void ParallelFor(size_t count, size_t grain, const Body& body) {
#if defined(FERRY_THREAD_SANITIZER)
  ThreadParallelFor(count, grain, body);
#else
  tbb::parallel_for(tbb::blocked_range<size_t>(0, count, std::max<size_t>(grain, 1)),
                    [&](const tbb::blocked_range<size_t>& range) {
                      for (size_t i = range.begin(); i != range.end(); ++i) body(i);
                    });
#endif
}

}  // namespace ferry::internal
