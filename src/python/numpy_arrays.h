// Numpy arrays over ferry's host memory, without copies. Every function requires the GIL.
//
// Numpy has no bfloat16 or float8: arrays of those dtypes are made with unsigned ints of the same
// size, and the Python layer views them as the ml_dtypes type (ferry/_dtypes.py, _NUMPY_DTYPES).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <memory>
#include <string_view>

#include "ferry/core/dtype.h"
#include "ferry/core/host_tensor.h"
#include "ferry/runtime/tensor_source.h"

namespace ferry::python {

// The DLPack dtype a numpy array of `dtype` is made with (unsigned ints for bf16 and float8).
nanobind::dlpack::dtype StorageDLPackDType(DType dtype);

// A writable numpy array that owns `tensor`: the tensor is freed when the array (and every view of
// it) is gone.
nanobind::object ToNumpy(HostTensor tensor);

// A read-only numpy array over the view of `source`, with the view's byte strides (which must be
// multiples of the element size, as every strided view read from a file is). The array holds a
// reference to the source, so the memory it borrows (a mapped file, for a TensorFile's sources)
// stays valid until the array and every view of it are gone.
nanobind::object ReadOnlyNumpyView(std::shared_ptr<const TensorSource> source);

// A read-only numpy array over `view` (strides multiples of the element size), holding `owner`
// until the array and every view of it are gone. `name` is for the error about strides.
nanobind::object ReadOnlyNumpyView(const HostView& view, std::shared_ptr<const void> owner,
                                   std::string_view name);

// How a ferry Array's memory is handed to a DLPack consumer (`Array.__dlpack__`).
struct DLPackExport {
  // Whether the consumer accepts a versioned capsule ("dltensor_versioned", DLPack >= 1.0),
  // which can say READ_ONLY; an unversioned one ("dltensor") cannot.
  bool versioned = false;
  // The memory must not be written by the consumer (a versioned capsule carries the READ_ONLY
  // flag; an unversioned capsule is never made over such memory: the caller exports a copy).
  bool read_only = false;
  // The capsule views a copy made for this export (the IS_COPIED flag of a versioned capsule).
  bool copied = false;
  // Where `view.data` points, as DLPack numbers devices (Buffer::DataAddress): kDLCPU (1) and 0
  // for host memory; kDLCUDA (2) or kDLROCM (10) and the device's ordinal for device memory.
  int32_t device_type = 1;
  int32_t device_id = 0;
};

// A DLPack capsule over `view` (its data in the memory `how` names; strides multiples of the
// element size). `owner` is
// held until the consumer calls the capsule's deleter (on any thread: it must not need the GIL),
// or the capsule is destroyed unused.
nanobind::object DLPackCapsule(const HostView& view, std::shared_ptr<const void> owner,
                               const DLPackExport& how);

}  // namespace ferry::python
