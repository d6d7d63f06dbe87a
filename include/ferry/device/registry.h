// The backend registry: creates clients by backend name ("host", "opencl").
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/status.h"
#include "ferry/device/client.h"

namespace ferry {

struct ClientOptions {
  // Number of devices, for backends that can present several (host). nullopt: the backend's
  // default (host: 1, or the FERRY_HOST_DEVICES environment variable).
  std::optional<int> num_devices = std::nullopt;
  // Overrides the capability profile the backend would report (the opencl backend narrows its
  // device's own profile with it: dtypes intersected, limits lowered). Without it the host
  // backend holds every dtype, with the memory limit of FERRY_HOST_MEMORY_LIMIT (bytes) if set.
  std::optional<DeviceCapabilities> capabilities = std::nullopt;
  // Worker threads of the backend's transfer engine; nullopt: the number of cores.
  std::optional<int> num_worker_threads = std::nullopt;
};

// Creates a client. The caller owns it. Returns Unavailable (with the reason) for a backend that
// cannot start on this machine and NotFound for an unknown name.
using ClientFactory = std::function<StatusOr<std::unique_ptr<Client>>(const ClientOptions&)>;

// Registers `factory` under `backend`. Built-in backends register themselves on first use of
// the registry. Thread-safe.
void RegisterBackend(std::string backend, ClientFactory factory);

// Names of the registered backends, sorted.
std::vector<std::string> RegisteredBackends();

StatusOr<std::unique_ptr<Client>> CreateClient(std::string_view backend,
                                               const ClientOptions& options = {});

}  // namespace ferry
