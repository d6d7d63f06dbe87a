// The old path's two pieces, shared by the staged baseline (transfer_paths.cc) and the PJRT
// plugin's yardsticks (pjrt_paths.cc), where they stand for numpy's `astype`: a fresh heap
// temporary and the row-by-row portable copy-convert that fills it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/types/span.h"
#include "ferry/core/dtype.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"
#include "ferry/runtime/tensor_source.h"

namespace ferry::bench {

// The old path's temporary: plain heap memory (std::aligned_alloc, 2 MiB-aligned and advised
// MADV_HUGEPAGE from 2 MiB on, as numpy does for its large arrays), allocated and freed every run.
// Not a HostTensor: ferry's freed-memory cache would hand back last run's pages already faulted in,
// and the old path had no such cache. glibc maps a block this large afresh every time, so its
// pages are zeroed by the kernel on first touch, as for any new array a framework allocates.
// Move-only; the memory is freed with the object.
class OldTemporary {
 public:
  // ResourceExhausted when the heap has no such block.
  static StatusOr<OldTemporary> Allocate(DType dtype, absl::Span<const int64_t> dims);

  // A dense row-major view of the whole temporary; valid while the temporary lives.
  const MutableHostView& view() const { return view_; }

  // A source borrowing the temporary, which it then owns (freed with the source).
  static StatusOr<std::shared_ptr<const TensorSource>> ToSource(OldTemporary temporary,
                                                                std::string name);

 private:
  struct Free {
    void operator()(std::byte* memory) const;
  };
  std::unique_ptr<std::byte[], Free> memory_;
  MutableHostView view_;
  int64_t bytes_ = 0;
};

// The old copy-convert, as the foundation's CopyConvert did it and as numpy's copy loops do: the
// destination in row-major order, one innermost row at a time through the portable kernel, which
// reads the source with its own strides. No tiles, no vector kernels, one thread. `src` and `dst`
// have the same dims; `dst` is row-major dense.
Status OldCopyConvert(const HostView& src, const MutableHostView& dst);

}  // namespace ferry::bench
