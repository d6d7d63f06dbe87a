// The tensor-file functions of `ferry._ferry` (ferry.load_file / open_file / save_file in
// python/ferry/__init__.py): the io layer's TensorFile and writers (docs/files.md).
#pragma once

#include <nanobind/nanobind.h>

namespace ferry::python {

// Adds `_load_file` and `_save_file` to the module.
void AddTensorFileFunctions(nanobind::module_& module);

}  // namespace ferry::python
