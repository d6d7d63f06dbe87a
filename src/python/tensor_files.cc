#include "src/python/tensor_files.h"

#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ferry/core/settings.h"
#include "ferry/io/mapped_file.h"
#include "ferry/io/tensor_file.h"
#include "ferry/io/tensor_writer.h"
#include "ferry/runtime/file_load.h"
#include "fmt/format.h"
#include "src/io/file_error.h"
#include "src/io/utf8.h"
#include "src/python/gil.h"
#include "src/python/numpy_arrays.h"
#include "src/python/py_source.h"
#include "src/python/status_error.h"

namespace nb = nanobind;

namespace ferry::python {
namespace {

// (format name, metadata, [(name, numpy array, dtype name, zero_copy, byte_swapped)]): every
// tensor of the file that `names`, `patterns` and `exclude` select (TensorSelector; all when they
// are empty) as a read-only numpy view of its source; the others are never read. Opening
// (mapping, parsing, and decoding compressed or big-endian tensors) runs without the GIL.
nb::tuple LoadFile(const nb::bytes& path, const std::vector<nb::bytes>& names,
                   const std::vector<nb::bytes>& patterns, const std::vector<nb::bytes>& exclude) {
  ApiScope api;
  const TensorFile file =
      OpenSelectedTensors(PathFromBytes(path), StringsFromBytes(names), StringsFromBytes(patterns),
                          StringsFromBytes(exclude));
  nb::list entries;
  for (const TensorFileEntry& entry : file.tensors()) {
    const std::string dtype_name(DTypeName(entry.source->view().dtype));
    entries.append(nb::make_tuple(TensorNameToPython(entry.name), ReadOnlyNumpyView(entry.source),
                                  dtype_name, entry.zero_copy, entry.byte_swapped));
  }
  return nb::make_tuple(std::string(file.format_name()), file.metadata(), entries);
}

}  // namespace

std::string PathFromBytes(const nb::bytes& path) { return std::string(path.c_str(), path.size()); }

std::vector<std::string> StringsFromBytes(const std::vector<nb::bytes>& values) {
  std::vector<std::string> strings;
  strings.reserve(values.size());
  for (const nb::bytes& value : values) strings.push_back(PathFromBytes(value));
  return strings;
}

nb::str TensorNameToPython(std::string_view name) {
  PyObject* text =
      PyUnicode_DecodeUTF8(name.data(), static_cast<Py_ssize_t>(name.size()), "surrogateescape");
  if (text == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(text);
}

TensorFile OpenSelectedTensors(const std::string& path, std::vector<std::string> names,
                               std::vector<std::string> patterns,
                               std::vector<std::string> exclude) {
  TensorSelector selector(std::move(names), std::move(patterns), std::move(exclude));
  TensorFileOptions options;
  if (!selector.empty()) options.selector = &selector;
  StatusOr<TensorFile> opened;
  {
    ScopedGilRelease unlocked;
    opened = TensorFile::Open(path, options);
    if (opened.ok()) {
      if (Status matched = selector.CheckEverythingMatched(io_internal::FileContext(path));
          !matched.ok()) {
        opened = matched;
      }
    }
  }
  // The readers quote file text escaped; should a message still hold a byte that is not UTF-8,
  // Python could not decode it and would raise UnicodeDecodeError instead of the ferry.Error.
  if (!opened.ok()) {
    const std::string_view message(opened.status().message().data(),
                                   opened.status().message().size());
    if (io_internal::FindInvalidUtf8(message) >= 0) {
      throw StatusError{
          Status(opened.status().code(), io_internal::EscapeForMessage(message, message.size()))};
    }
  }
  return ValueOrThrow(std::move(opened));
}

namespace {

// Writes `objects` (buffer-protocol objects or DLPack producers, read through their own strides)
// as `names` in `format`. The objects are held until the write is done; the write runs without
// the GIL.
void SaveFile(const nb::bytes& path_bytes, const std::string& format,
              const std::vector<std::string>& names, const std::vector<nb::object>& objects,
              const std::vector<std::optional<std::string>>& dtype_overrides,
              const std::map<std::string, std::string>& metadata, bool compressed) {
  ApiScope api;
  const std::string path = PathFromBytes(path_bytes);
  if (format != "safetensors" && format != "npy" && format != "npz") {
    throw StatusError{InvalidArgumentError(
        fmt::format("format must be 'safetensors', 'npy' or 'npz', not '{}'", format))};
  }
  if (!metadata.empty() && format != "safetensors") {
    throw StatusError{InvalidArgumentError(
        fmt::format("metadata can only be written to safetensors files, not {}", format))};
  }
  if (compressed && format != "npz") {
    throw StatusError{
        InvalidArgumentError(fmt::format("compressed=True is for npz files only, not {}", format))};
  }
  if (format == "npy" && objects.size() != 1) {
    throw StatusError{InvalidArgumentError(
        fmt::format("a .npy file holds exactly one array, not {}", objects.size()))};
  }
  if (names.size() != objects.size() || dtype_overrides.size() != objects.size()) {
    throw StatusError{InvalidArgumentError("save_file: names, objects and dtypes differ in count")};
  }
  // Declared before the unlocked scope: the sources (which hold Python objects) are dropped here,
  // under the GIL, when the function returns.
  std::vector<std::shared_ptr<const TensorSource>> sources;
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < objects.size(); ++i) {
    std::optional<DType> override_dtype;
    if (dtype_overrides[i].has_value()) {
      override_dtype = ValueOrThrow(DTypeFromName(*dtype_overrides[i]));
    }
    sources.push_back(ValueOrThrow(SourceFromPython(objects[i], override_dtype, names[i])));
    tensors.push_back({names[i], sources.back()->view()});
  }
  Status status;
  {
    ScopedGilRelease unlocked;
    if (format == "safetensors") {
      status = WriteSafetensors(path, tensors, metadata);
    } else if (format == "npy") {
      status = WriteNpy(path, tensors[0].view);
    } else {
      status = WriteNpz(path, tensors, compressed);
    }
  }
  ThrowIfError(status);
}

}  // namespace

void AddTensorFileFunctions(nb::module_& module) {
  module.def("_load_file", &LoadFile, nb::arg("path"), nb::arg("names"), nb::arg("patterns"),
             nb::arg("exclude"));
  module.def(
      "_release_mapped_pages",
      [](uintptr_t address, int64_t size) {
        MappedFile::ReleaseMemory(reinterpret_cast<const void*>(address), size);
      },
      nb::arg("address"), nb::arg("size"),
      "Gives back the whole pages of [address, address + size) that lie in a mapped tensor file "
      "(MappedFile::ReleasePages): a load calls it on what it has put.");
  module.def(
      "_load_window_bytes",
      [] {
        StatusOr<int64_t> bytes = settings::LoadWindowBytes();
        ThrowIfError(bytes.status());
        return *bytes;
      },
      "FERRY_LOAD_WINDOW_BYTES (0: the whole file in one window); a bad value raises.");
  module.def(
      "_load_read_threads",
      [] {
        StatusOr<FileLoadOptions> options = FileLoadOptionsFromSettings();
        ThrowIfError(options.status());
        return options->read_threads;
      },
      "FERRY_LOAD_READ_THREADS, or one per core (more while other work keeps the cores busy); a "
      "bad value raises.");
  module.def(
      "_prefetch_mapped_pages",
      [](uintptr_t address, int64_t size, int threads) {
        ScopedGilRelease unlocked;
        MappedFile::PrefetchMemory(reinterpret_cast<const void*>(address), size, threads);
      },
      nb::arg("address"), nb::arg("size"), nb::arg("threads"),
      "Faults in the pages of [address, address + size) that lie in a mapped tensor file, from "
      "`threads` threads at once (MappedFile::Prefetch), without the GIL; the caller holds views "
      "of the mapping meanwhile.");
  module.def("_save_file", &SaveFile, nb::arg("path"), nb::arg("format"), nb::arg("names"),
             nb::arg("objects"), nb::arg("dtype_overrides"), nb::arg("metadata"),
             nb::arg("compressed"));
}

}  // namespace ferry::python
