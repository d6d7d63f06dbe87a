// Which pages of a tensor a process's shards cover, and the advice that makes the kernel read
// exactly those from a file mapping (AdviseExactShardReads in ferry/runtime/sharding.h). Internal.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/host_view.h"
#include "ferry/runtime/sharding.h"

namespace ferry::internal {

// [begin, end): addresses, both multiples of the page size.
struct PageRange {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool operator==(const PageRange&) const = default;
};

// The pages of memory holding the elements that `parts` select from `view` (a row-major dense
// view; nothing otherwise), as sorted ranges that neither overlap nor touch. A part is a set of
// contiguous runs: the elements along its innermost partly-selected dim and every dim after it.
// Runs closer than a page merge (their gap holds no whole page), so a part split on a later dim
// with narrow rows is one range and a part split on a dim whose rows span pages is one range per
// run: what `parts` cover and nothing more, page by page, in at most (view's bytes / page_size)
// ranges. Computes addresses only: never reads `view`'s memory.
std::vector<PageRange> ShardPageRanges(const HostView& view, absl::Span<const ShardIndex> parts,
                                       uintptr_t page_size);

// For `view` in a file mapping: turns the kernel's read-around off on the view's pages
// (MADV_RANDOM; a fault then reads its own page only) and reads `ranges` ahead (MADV_WILLNEED, in
// steps of the read-ahead window, which caps one call). False when the kernel refused the first
// advice (not a mapping, an old kernel): then nothing was advised. Advice only: what a later read
// of the memory finds is the same either way.
bool AdviseExactReads(const HostView& view, absl::Span<const PageRange> ranges,
                      uintptr_t page_size);

}  // namespace ferry::internal
