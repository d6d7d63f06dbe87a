// Writers for safetensors, .npy and .npz files.
//
// Each writer takes host views with any byte strides (transposed, sliced, negative, broadcast),
// and writes their elements in row-major (C) order, little-endian, in the view's own dtype: dense
// views are written straight from their memory, others are gathered through a bounded buffer
// (a few MiB), never through a full-size copy. The caller keeps the viewed memory valid and
// unchanged until the call returns; nothing is kept afterwards.
//
// Files are written to "<path>.partial" and renamed to `path` only when complete, so a failed
// write never leaves a truncated file that looks valid under the final name. Errors: the file
// system's (from errno, naming the path); InvalidArgument for a dtype the format cannot hold, a
// duplicate or empty tensor name, or an inconsistent view.
#pragma once

#include <map>
#include <string>

#include "absl/types/span.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"

namespace ferry {

struct NamedTensor {
  std::string name;
  HostView view;
};

// Writes a safetensors file: the 8-byte header size, the JSON header padded with spaces to a
// multiple of 8 bytes, then the data. The entries are laid out in a stable order that does not
// depend on the order of `tensors`: by element size, largest first, then by name (the order the
// reference writer uses), so every tensor's data is aligned to its element size. `metadata`
// becomes `__metadata__` when not empty. Every dtype except complex128 can be written (safetensors
// has no name for it). Names must be unique, non-empty, valid UTF-8 and not "__metadata__".
Status WriteSafetensors(const std::string& path, absl::Span<const NamedTensor> tensors,
                        const std::map<std::string, std::string>& metadata = {});

// Writes a .npy file (format version 1.0, or 2.0 when the header needs more than 65535 bytes):
// little-endian descr, fortran_order False, data starting at a multiple of 64 bytes. bfloat16 and
// the float8 types cannot be written: numpy has no such dtypes.
Status WriteNpy(const std::string& path, const HostView& view);

// Writes a .npz archive (a zip of NAME.npy members) as numpy.savez (`compressed` = false: members
// stored, so a reader can map them zero-copy) or numpy.savez_compressed (deflated). Local headers
// carry zip64 size fields, as numpy's do; the central directory and end records use zip64 only
// where a value does not fit 32 bits. Member names are "<name>.npy".
Status WriteNpz(const std::string& path, absl::Span<const NamedTensor> tensors, bool compressed);

}  // namespace ferry
