// The tensor-file functions of `ferry._ferry` (ferry.load_file / open_file / save_file in
// python/ferry/_files.py): the io layer's TensorFile and writers (docs/files.md).
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <string_view>
#include <vector>

#include "ferry/io/tensor_file.h"

namespace ferry::python {

// A path as Python's os.fsencode gives it (the file system's bytes: a name that is not UTF-8
// stays the name it is).
std::string PathFromBytes(const nanobind::bytes& path);

// A tensor's name as Python text: UTF-8 decoded with "surrogateescape", so that a name that is not
// UTF-8 (a .npy file's stem is its file name's bytes; an .npz member's name is the archive's)
// stays the name it is, as os.fsdecode keeps a path, instead of raising UnicodeDecodeError.
nanobind::str TensorNameToPython(std::string_view name);

// Tensor names or patterns from Python as bytes: str encoded with "surrogateescape", so that a
// name load_file gave back (a .npy stem that is not UTF-8) selects that tensor again.
std::vector<std::string> StringsFromBytes(const std::vector<nanobind::bytes>& values);

// Opens `path` with the tensors `names`, `patterns` and `exclude` select (TensorSelector; all
// when they are empty), without the GIL; raises the ferry error (a message that is not UTF-8
// escaped) on failure, or NotFound for a name or pattern that matched nothing.
TensorFile OpenSelectedTensors(const std::string& path, std::vector<std::string> names,
                               std::vector<std::string> patterns, std::vector<std::string> exclude);

// Adds `_load_file` and `_save_file` to the module.
void AddTensorFileFunctions(nanobind::module_& module);

}  // namespace ferry::python
