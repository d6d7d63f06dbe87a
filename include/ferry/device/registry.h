// The backend registry: creates clients by backend name ("host", "opencl").
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "ferry/core/status.h"
#include "ferry/device/client.h"

namespace ferry {

// What a client is created with. Each option that has an environment variable too (the table in
// ferry/core/settings.h and docs/settings.md) takes precedence over it and over SetSetting.
struct ClientOptions {
  // Number of devices, for backends that can present several (host). nullopt: the backend's
  // default (host: the setting FERRY_HOST_DEVICES, default 1).
  std::optional<int> num_devices = std::nullopt;
  // Overrides the capability profile the backend would report (the opencl backend narrows its
  // device's own profile with it: dtypes intersected, limits lowered). Without it the host
  // backend holds every dtype, with the memory limit of the setting FERRY_HOST_MEMORY_LIMIT
  // (bytes) if set.
  std::optional<DeviceCapabilities> capabilities = std::nullopt;
  // Worker threads of the backend's transfer engine; nullopt: the number of cores.
  std::optional<int> num_worker_threads = std::nullopt;

  // The opencl backend's library (a name dlopen finds, or a path). nullopt: the setting
  // FERRY_OPENCL_LIBRARY, else the ICD loader libOpenCL.so.1.
  std::optional<std::string> opencl_library = std::nullopt;

  // The pjrt backend's plugin: a path to its shared library, or the name of an installed Python
  // package that ships one ("xla_cpu_pjrt"). nullopt: the setting FERRY_PJRT_PLUGIN, else the
  // first plugin found among installed packages (src/device/pjrt/pjrt_library.h says where ferry
  // looks: the setting FERRY_PJRT_SEARCH_PATH first).
  std::optional<std::string> pjrt_plugin = std::nullopt;
  // Options handed to the plugin's PJRT_Client_Create as named values, e.g.
  // {"cpu_device_count", int64_t{4}}: int64, float (double here), bool, string or int64 list.
  // Which names a plugin takes is the plugin's business; some refuse names they do not know.
  using PluginOptionValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;
  std::map<std::string, PluginOptionValue> plugin_options = {};
  // pjrt: write device memory that the host can address (the CPU plugin's) directly, through
  // ferry's own kernels and warm memory. nullopt: when the plugin's buffers are on the CPU;
  // false: always through the plugin's own transfer entries, as on a GPU (tests use it to run
  // those paths here).
  std::optional<bool> pjrt_direct_host_access = std::nullopt;
  // pjrt: whether ferry may address the plugin's buffers as dense row-major arrays (its raw paths:
  // partial reads and chunked writes at byte offsets, direct host access, device pointers).
  // nullopt (or true): where the plugin lays out a probe buffer that way (its
  // PJRT_Buffer_GetMemoryLayout: row-major, no tiles, as the CPU and GPU plugins do; a TPU's tiled
  // layouts are not); false: never, so that every transfer takes the plugin's layout-aware entries
  // (tests use it to run those paths here).
  std::optional<bool> pjrt_row_major_layouts = std::nullopt;
};

// Creates a client. The caller owns it. Returns Unavailable (with the reason) for a backend that
// cannot start on this machine, NotFound for an unknown name, and InvalidArgument naming the
// variable when any setting of the table has a bad value (CheckSettings).
using ClientFactory = std::function<StatusOr<std::unique_ptr<Client>>(const ClientOptions&)>;

// Registers `factory` under `backend`. Built-in backends register themselves on first use of
// the registry. Thread-safe.
void RegisterBackend(std::string backend, ClientFactory factory);

// Names of the registered backends, sorted.
std::vector<std::string> RegisteredBackends();

StatusOr<std::unique_ptr<Client>> CreateClient(std::string_view backend,
                                               const ClientOptions& options = {});

// For a message about too few devices: how `backend`'s device count is chosen, as a sentence
// ("the host backend presents FERRY_HOST_DEVICES devices, ..."); empty where the hardware decides.
std::string DeviceCountHint(std::string_view backend);

}  // namespace ferry
