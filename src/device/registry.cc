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
  return factory(options);
}

std::string DeviceCountHint(std::string_view backend) {
  if (backend == "host") {
    return "the host backend presents FERRY_HOST_DEVICES devices (1 by default; set it before "
           "the first use)";
  }
  return std::string();
}

}  // namespace ferry
