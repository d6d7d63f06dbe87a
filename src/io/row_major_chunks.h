// Streams a strided host view as its row-major (C order) bytes, in bounded pieces: what every
// writer needs to put a tensor with arbitrary strides into a file without a full-size copy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"

namespace ferry::io_internal {

inline constexpr int64_t kDefaultChunkBytes = int64_t{4} << 20;

// Calls `consume(bytes, size)` with the bytes of `view`'s elements in row-major order, in pieces
// of whole elements, at most `max_chunk_bytes` (at least one element), in order, on the calling
// thread.
// A row-major dense view is passed straight from its own memory; any other view is gathered into
// one reused buffer of `max_chunk_bytes`, block by block, with the fused strided copy. Stops at
// and returns the first error of `consume`. InvalidArgument when the view is inconsistent
// (strides vs dims, overflow); the memory it points to is the caller's responsibility.
Status ForEachRowMajorChunk(const HostView& view, int64_t max_chunk_bytes,
                            absl::FunctionRef<Status(const std::byte*, int64_t)> consume);

}  // namespace ferry::io_internal
