// PjrtLibrary: a PJRT C API plugin, loaded at run time, and how ferry finds one.
//
// ferry never links against a plugin: it opens the plugin's shared library with dlopen
// (RTLD_NODELETE: the XLA plugins crash the process at exit once unloaded), calls its
// `GetPjrtApi()` and keeps the returned function table for the life of the process. The header
// (`pjrt_c_api.h`) comes from the `xla-cpu-pjrt` wheel and is used for its types only. A plugin
// built against a newer header appends entries to its table (and fields to its argument
// structs, each of which starts with `struct_size`), so ferry checks `PJRT_Api::struct_size`
// before it calls any entry that a plugin older than ferry's header may lack.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/status.h"
#include "pjrt_c_api.h"

namespace ferry::pjrt {

struct PjrtLibrary {
  // The path the plugin was opened from.
  std::string path;
  // The plugin's table; valid for the life of the process.
  const PJRT_Api* api = nullptr;
  // The PJRT C API version the plugin was built with.
  int major_version = 0;
  int minor_version = 0;

  // True when the plugin's table has the entry at `offset` (offsetof(PJRT_Api, entry)) and it is
  // set: plugins older than ferry's header have shorter tables.
  bool Has(size_t offset) const;
};

// True when `library` offers the entry `name` (a PJRT_Api member, e.g. PJRT_Buffer_CopyRawToHost).
#define FERRY_PJRT_HAS(library, name) ((library).Has(offsetof(PJRT_Api, name)))

// Opens the plugin at `path` (dlopen with RTLD_NODELETE), calls GetPjrtApi() and
// PJRT_Plugin_Initialize once. Cached per path for the life of the process, errors included.
// Unavailable, naming the path and what failed (dlerror's text, a missing GetPjrtApi, a major
// version other than ferry's header, a table too short for the entries ferry needs, the
// plugin's own initialisation error). Thread-safe.
StatusOr<const PjrtLibrary*> LoadPjrtLibrary(const std::string& path);

// The folders where installed Python packages live, in search order: the setting
// FERRY_PJRT_SEARCH_PATH (a ':'-separated list; the Python package sets it from sys.path;
// ferry/core/settings.h), then PYTHONPATH, then
// $VIRTUAL_ENV/lib/python3.*/site-packages, then the site-packages that holds this ferry when it
// is installed as a Python package (site-packages/ferry/libferry.so: a process that loads ferry's
// PJRT plugin without importing ferry), then the site-packages this ferry was built against.
std::vector<std::string> PythonPackageSearchPath();

// The plugin file ferry uses for `requested`:
// - a path to a file: that file;
// - else the name of an installed Python package that ships a plugin ("xla_cpu_pjrt",
//   "xla-cpu-pjrt", "lammps_jax_pjrt_cpu"): the first `.so` in the package's folder (also looked
//   for under `xla_plugins/` and `jax_plugins/`), in PythonPackageSearchPath();
// - empty: the setting FERRY_PJRT_PLUGIN if set (a path or a package name, as above), else the
// first plugin
//   found among installed packages (a `.so` with "pjrt" in its name, or any `.so` in a package
//   under `xla_plugins/` or `jax_plugins/`), in search-path order.
// ferry's own plugin (ferry_pjrt_plugin.so, which wraps another) is found only by its path.
// Unavailable, saying where it looked, when there is none.
StatusOr<std::string> FindPjrtPlugin(std::string_view requested);

}  // namespace ferry::pjrt
