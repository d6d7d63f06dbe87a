// Python objects as TensorSources: buffer-protocol objects (numpy arrays, memoryviews, bytes...)
// read through their real byte strides, and DLPack producers (torch, JAX) imported without a copy.
// The source holds the Python object through a PyHeld keep-alive (gil.h), so it is released under
// the GIL whichever thread drops it.
#pragma once

#include <nanobind/nanobind.h>

#include <memory>
#include <optional>
#include <string>

#include "ferry/core/dtype.h"
#include "ferry/core/status.h"
#include "ferry/runtime/tensor_source.h"

namespace ferry::python {

// Requires the GIL. `dtype_override` reinterprets the elements (same size) as another dtype:
// the Python layer passes a uint16 view of an ml_dtypes.bfloat16 array with kBF16, for example.
// `read_only` (optional) is set when the memory must not be written through an alias of it: a
// read-only buffer (a numpy view of a mapped file, a numpy array with writeable=False) or a
// DLPack producer other than torch (whose unversioned capsules cannot say; JAX arrays are
// immutable).
StatusOr<std::shared_ptr<const TensorSource>> SourceFromPython(nanobind::handle object,
                                                               std::optional<DType> dtype_override,
                                                               std::string name,
                                                               bool* read_only = nullptr);

// Requires the GIL. A writable view of `object`'s memory, through the buffer protocol with its real
// byte strides (a numpy array to read a device array into: device_get(out=)). `dtype_override`
// reinterprets the elements as in SourceFromPython. `keep_alive` receives what holds the buffer
// (and so the object) until the last copy of it is dropped, on any thread (released under the
// GIL). InvalidArgument naming `name` for an object without a writable strided buffer, a dtype
// ferry lacks, or big-endian memory.
StatusOr<MutableHostView> WritableViewFromPython(nanobind::handle object,
                                                 std::optional<DType> dtype_override,
                                                 std::string_view name,
                                                 std::shared_ptr<const void>* keep_alive);

// The dtype of a Python buffer-protocol format string ("f", "<d", "Zf", "?", ">i4"), or
// InvalidArgument. `big_endian` (optional) is set when the format says '>' or '!' (ferry reads
// such buffers as byte-swapped views; this machine is little-endian).
StatusOr<DType> DTypeFromBufferFormat(std::string_view format, int64_t itemsize,
                                      bool* big_endian = nullptr);

}  // namespace ferry::python
