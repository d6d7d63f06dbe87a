#include "ferry/device/registry.h"

#include <map>
#include <mutex>

#include "absl/base/thread_annotations.h"
#include "ferry/core/mutex.h"
#include "ferry/core/settings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/core/fork_locks.h"

namespace ferry {

// Each built-in backend's tiny registration file defines one of these.
void RegisterHostBackend();
void RegisterOpenClBackend();
void RegisterPjrtBackend();

namespace {

struct Registry {
  Mutex mutex;
  std::map<std::string, ClientFactory, std::less<>> factories ABSL_GUARDED_BY(mutex);
};

Registry& GetRegistry() {
  static Registry* const registry = [] {
    auto* created = new Registry();
    internal::RegisterForkLock(internal::ForkLockRank::kDeviceRegistry, created->mutex);
    return created;
  }();
  return *registry;
}

void RegisterBuiltinBackends() {
  static std::once_flag once;
  std::call_once(once, [] {
    RegisterHostBackend();
    RegisterOpenClBackend();
    RegisterPjrtBackend();
  });
}

}  // namespace

void RegisterBackend(std::string backend, ClientFactory factory) {
  Registry& registry = GetRegistry();
  MutexLock lock(registry.mutex);
  registry.factories[std::move(backend)] = std::move(factory);
}

std::vector<std::string> RegisteredBackends() {
  RegisterBuiltinBackends();
  Registry& registry = GetRegistry();
  MutexLock lock(registry.mutex);
  std::vector<std::string> names;
  for (const auto& [name, factory] : registry.factories) names.push_back(name);
  return names;
}

namespace {

// The capability limits every backend reads, checked before any backend starts: a negative limit
// is an error here rather than a confusing failure of every later put ("0 of -1 bytes in use").
// (Device and worker counts are each backend's to check.)
Status CheckClientOptions(std::string_view backend, const ClientOptions& options) {
  auto refuse = [&](std::string_view field, int64_t value, std::string_view rule) {
    return InvalidArgumentError(fmt::format(
        "CreateClient(\"{}\"): ClientOptions::{} is {}; it must be {} (or unset for the default)",
        backend, field, value, rule));
  };
  if (options.capabilities.has_value()) {
    const DeviceCapabilities& capabilities = *options.capabilities;
    if (capabilities.memory_limit_bytes.has_value() && *capabilities.memory_limit_bytes < 0) {
      return refuse("capabilities.memory_limit_bytes", *capabilities.memory_limit_bytes,
                    "zero or more");
    }
    if (capabilities.max_buffer_bytes.has_value() && *capabilities.max_buffer_bytes < 0) {
      return refuse("capabilities.max_buffer_bytes", *capabilities.max_buffer_bytes,
                    "zero or more");
    }
  }
  return OkStatus();
}

}  // namespace

StatusOr<std::unique_ptr<Client>> CreateClient(std::string_view backend,
                                               const ClientOptions& options) {
  RegisterBuiltinBackends();
  ClientFactory factory;
  {
    Registry& registry = GetRegistry();
    MutexLock lock(registry.mutex);
    auto it = registry.factories.find(backend);
    if (it == registry.factories.end()) {
      std::vector<std::string> names;
      for (const auto& [name, unused] : registry.factories) names.push_back(name);
      return absl::NotFoundError(
          fmt::format("unknown backend '{}'; registered: {}", backend, fmt::join(names, ", ")));
    }
    factory = it->second;
  }
  // Every setting, not only this backend's: a bad value anywhere is reported by the first client.
  FERRY_RETURN_IF_ERROR(CheckSettings());
  FERRY_RETURN_IF_ERROR(CheckClientOptions(backend, options));
  try {
    return factory(options);
  } catch (const std::system_error& error) {
    // A thread the client needs could not start (a thread or memory limit): the one error of a
    // client that cannot be made, not an exception out of a Status API.
    return absl::ResourceExhaustedError(
        fmt::format("the {} client could not start its threads: {}", backend, error.what()));
  }
}

std::string DeviceCountHint(std::string_view backend) {
  if (backend == "host") {
    return "the host backend presents FERRY_HOST_DEVICES devices (1 by default; set it before "
           "the first use)";
  }
  return std::string();
}

}  // namespace ferry
