// Settings: every environment variable ferry reads, in one table (docs/settings.md shows the same
// table; a test keeps the two equal), each one settable from code.
//
// Where a value comes from, the first that is set wins:
//   1. for a client's settings, the client option the table names (ClientOptions::num_devices...);
//   2. a process-wide override set from code with SetSetting;
//   3. the environment variable;
//   4. the default.
// An empty value, in the environment or given to SetSetting, counts as unset.
//
// A value that does not parse is an InvalidArgument error that names the variable and says what
// it should be, e.g.
//   FERRY_HOST_MEMORY_CACHE_BYTES="abc": not a byte count (an integer >= 0)
// SetSetting refuses such a value at once. One in the environment is never silently replaced by
// the default: CreateClient checks the whole table first (CheckSettings), so creating any client
// reports any bad value; distributed::Initialize does the same; and HostTensor::Allocate reports a
// bad FERRY_HOST_MEMORY_CACHE_BYTES (the host memory cache caches nothing meanwhile).
//
// When values are read: a client's settings when a client is created; FERRY_CONVERT_KERNELS and
// FERRY_HOST_MEMORY_CACHE_BYTES when first needed, and again after every SetSetting or
// ClearSetting (a change of the environment after the first read is not seen; change them from
// code instead); the others whenever they are used.
//
// Thread-safe. The environment itself is read with getenv: a program that calls setenv while
// other threads run has a race of its own, whatever ferry does.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/convert.h"
#include "ferry/core/status.h"

namespace ferry {

enum class SettingScope {
  kProcess,  // one value for the whole process
  kClient,   // read when a client is created; the client option named in the table overrides it
  kPlugin,   // read by ferry_pjrt_plugin.so, which holds a private copy of ferry: environment
             // only (SetSetting refuses it)
};

// One row of the table. Every view is valid forever.
struct SettingInfo {
  std::string_view name;  // the environment variable, e.g. "FERRY_HOST_DEVICES"
  SettingScope scope;
  // What a value must be, as the error says after "not ": "a byte count (an integer >= 0)".
  std::string_view value_kind;
  std::string_view default_value;  // in words, for the docs: "1", "none", "1073741824 (1 GiB)..."
  // The code that overrides it per client ("ClientOptions::num_devices"), or empty.
  std::string_view client_option;
  std::string_view meaning;
};

// Every setting, sorted by name.
absl::Span<const SettingInfo> AllSettings();
// The row of `name`, or nullptr.
const SettingInfo* FindSetting(std::string_view name);

// Overrides the environment variable `name` for this whole process (an empty `value` makes it
// unset, whatever the environment says). InvalidArgument naming the variable when `value` does
// not parse; NotFound for a name that is not in the table; FailedPrecondition for a plugin
// setting (environment only).
Status SetSetting(std::string_view name, std::string_view value);
// Removes the override of `name`: the environment counts again. NotFound for an unknown name.
Status ClearSetting(std::string_view name);

// Where the value of a setting comes from now (client options aside).
enum class SettingSource { kDefault, kEnvironment, kOverride };
struct SettingValue {
  std::optional<std::string> text;  // nullopt: unset, the default applies
  SettingSource source = SettingSource::kDefault;
};
// The value of `name` in effect now, unparsed; NotFound for an unknown name.
StatusOr<SettingValue> CurrentSettingValue(std::string_view name);

// Parses every setting's current value: the first error (in table order), or OK.
Status CheckSettings();

// Counts SetSetting and ClearSetting calls: a reader that keeps a parsed value re-reads it when
// this changed.
uint64_t SettingsGeneration();

// The typed value of each setting (override, else environment, else default); a bad value is the
// InvalidArgument described above. Client options are applied by the client, not here.
namespace settings {
// FERRY_HOST_MEMORY_CACHE_BYTES: the most bytes of freed host memory kept for reuse.
StatusOr<int64_t> HostMemoryCacheBytes();
// FERRY_CONVERT_KERNELS: the highest conversion kernel level to use; nullopt: no cap.
StatusOr<std::optional<ConvertKernelLevel>> ConvertKernels();
// FERRY_HOST_DEVICES: how many devices the host backend presents (1 to 1024).
StatusOr<int> HostDevices();
// FERRY_HOST_HUGE_PAGES: whether ferry's large host allocations ask for transparent huge pages.
enum class HugePagesSetting { kAuto, kOn, kOff };
StatusOr<HugePagesSetting> HostHugePages();
// FERRY_HOST_PREFAULT: whether large writes into host memory fault their pages in first
// (prefault.h).
StatusOr<bool> HostPrefault();
// FERRY_HOST_MEMORY_LIMIT: each host device's memory limit in bytes; nullopt: none.
StatusOr<std::optional<int64_t>> HostMemoryLimit();
// FERRY_LOAD_READ_BYTES: the size of each read a load makes into device memory (pread).
StatusOr<int64_t> LoadReadBytes();
// FERRY_LOAD_READ_THREADS: a load's reads in flight (pread threads, threads faulting in its next
// window); nullopt: one per core.
StatusOr<std::optional<int>> LoadReadThreads();
// FERRY_LOAD_WINDOW_BYTES: bytes of a file a load puts at a time; 0: the whole file at once.
StatusOr<int64_t> LoadWindowBytes();
// FERRY_OPENCL_LIBRARY: the OpenCL library to dlopen; nullopt: the ICD loader, libOpenCL.so.1.
std::optional<std::string> OpenClLibrary();
// FERRY_PJRT_PLUGIN: the PJRT plugin (a path or a Python package name); nullopt: search for one.
std::optional<std::string> PjrtPlugin();
// FERRY_PJRT_SEARCH_PATH: folders where Python packages are installed, ':'-separated; empty
// entries are skipped.
std::vector<std::string> PjrtSearchPath();
// FERRY_PJRT_WRAPPED_PLUGIN: the plugin ferry_pjrt_plugin.so wraps; nullopt: as FERRY_PJRT_PLUGIN.
std::optional<std::string> PjrtWrappedPlugin();
// FERRY_DISTRIBUTED_TIMEOUT_S: seconds a collective waits for the other ranks (> 0).
StatusOr<double> DistributedTimeoutSeconds();
}  // namespace settings

}  // namespace ferry
