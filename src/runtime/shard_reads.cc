// Exact reads of a process's shards from a mapped file. The kernel's read-around on a page fault
// reads a window (read_ahead_kb, often 8 MiB) past a shard's edge, which for tensors of a few MiB
// is the whole tensor, other processes' shards included. Turning it off alone would read page by
// page, one synchronous read per fault; so the read-around goes off and the pages the shards cover
// are read ahead instead, and nothing else.
#include "src/runtime/shard_reads.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

namespace ferry {
namespace internal {

std::vector<PageRange> ShardPageRanges(const HostView& view, absl::Span<const ShardIndex> parts,
                                       uintptr_t page_size) {
  std::vector<PageRange> runs;
  if (!view.IsRowMajorDense() || page_size == 0) return runs;
  const int64_t rank = view.rank();
  // Row-major strides from the dims (a size-1 dim of a dense view may carry any stride).
  std::vector<int64_t> strides(static_cast<size_t>(rank), view.element_size());
  for (int64_t d = rank - 2; d >= 0; --d) strides[d] = strides[d + 1] * view.dims[d + 1];
  const auto base = reinterpret_cast<uintptr_t>(view.data);
  const auto add = [&](uintptr_t begin, uintptr_t size) {
    runs.push_back(
        {begin / page_size * page_size, (begin + size + page_size - 1) / page_size * page_size});
  };
  for (const ShardIndex& index : parts) {
    if (static_cast<int64_t>(index.size()) != rank) continue;
    bool empty = false;
    for (const DimRange& range : index) empty = empty || range.size() <= 0;
    if (empty) continue;
    if (rank == 0) {
      add(base, static_cast<uintptr_t>(view.element_size()));
      continue;
    }
    // The innermost partly-selected dim: a run is its selected range times everything after it.
    int64_t inner = -1;
    for (int64_t d = rank - 1; d >= 0 && inner < 0; --d) {
      if (index[d].begin != 0 || index[d].end != view.dims[d]) inner = d;
    }
    if (inner < 0) {  // the whole tensor
      add(base, static_cast<uintptr_t>(view.dense_size_bytes()));
      continue;
    }
    uintptr_t extent = static_cast<uintptr_t>(index[inner].size() * strides[inner]);
    uintptr_t first = base + static_cast<uintptr_t>(index[inner].begin * strides[inner]);
    // Outward, while the runs of a dim lie closer than a page, they are one run.
    int64_t outer = inner - 1;
    for (; outer >= 0; --outer) {
      const int64_t count = index[outer].size();
      const auto pitch = static_cast<uintptr_t>(strides[outer]);
      if (count > 1 && pitch - extent >= page_size) break;
      first += static_cast<uintptr_t>(index[outer].begin) * pitch;
      extent += static_cast<uintptr_t>(count - 1) * pitch;
    }
    // One run per index of dims 0..outer (row-major order, so the runs come in address order).
    std::vector<int64_t> position(static_cast<size_t>(outer + 1), 0);
    while (true) {
      uintptr_t begin = first;
      for (int64_t d = 0; d <= outer; ++d) {
        begin += static_cast<uintptr_t>((index[d].begin + position[d]) * strides[d]);
      }
      add(begin, extent);
      int64_t d = outer;
      for (; d >= 0; --d) {
        if (++position[d] < index[d].size()) break;
        position[d] = 0;
      }
      if (d < 0) break;
    }
  }
  // Parts of several local devices interleave (a split on a later dim): sort, then join ranges that
  // overlap or touch.
  std::sort(runs.begin(), runs.end(),
            [](const PageRange& a, const PageRange& b) { return a.begin < b.begin; });
  std::vector<PageRange> merged;
  for (const PageRange& run : runs) {
    if (!merged.empty() && run.begin <= merged.back().end) {
      merged.back().end = std::max(merged.back().end, run.end);
    } else {
      merged.push_back(run);
    }
  }
  return merged;
}

bool AdviseExactReads(const HostView& view, absl::Span<const PageRange> ranges,
                      uintptr_t page_size) {
  const auto begin = reinterpret_cast<uintptr_t>(view.data);
  const uintptr_t aligned = begin / page_size * page_size;
  const uintptr_t end = begin + static_cast<uintptr_t>(view.dense_size_bytes());
  if (madvise(reinterpret_cast<void*>(aligned), end - aligned, MADV_RANDOM) != 0) return false;
  // One MADV_WILLNEED reads at most the device's read-ahead window (Linux caps it there: 128 KiB
  // by default), so a long range goes in steps of that size.
  constexpr uintptr_t kStep = uintptr_t{128} << 10;
  for (const PageRange& range : ranges) {
    for (uintptr_t step = range.begin; step < range.end; step += kStep) {
      madvise(reinterpret_cast<void*>(step), std::min(kStep, range.end - step), MADV_WILLNEED);
    }
  }
  return true;
}

}  // namespace internal

void AdviseExactShardReads(const HostView& view, const Sharding& sharding) {
  auto indices = sharding.ShardIndices(view.dims);
  if (!indices.ok() || !view.IsRowMajorDense()) return;
  std::vector<ShardIndex> local;
  for (size_t i = 0; i < indices->size(); ++i) {
    if (sharding.mesh().devices()[i]->is_addressable()) local.push_back((*indices)[i]);
  }
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const std::vector<internal::PageRange> ranges = internal::ShardPageRanges(view, local, page);
  if (!ranges.empty()) internal::AdviseExactReads(view, ranges, page);
}

}  // namespace ferry
