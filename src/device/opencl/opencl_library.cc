#include "src/device/opencl/opencl_library.h"

#include <dlfcn.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "ferry/core/mutex.h"
#include "ferry/core/settings.h"
#include "fmt/format.h"

namespace ferry::opencl {
namespace {

StatusOr<std::unique_ptr<OpenClLibrary>> Open(const std::string& library_name) {
  // RTLD_LOCAL: the loader's symbols stay out of the global namespace, so they can never be
  // picked up by (or clash with) anything else linked into the process.
  void* handle = dlopen(library_name.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    return UnavailableError(fmt::format("cannot load the OpenCL library {}: {}", library_name,
                                        error != nullptr ? error : "unknown dlopen error"));
  }
  auto library = std::make_unique<OpenClLibrary>();
  library->handle = handle;
  library->name = library_name;
  std::string missing;
#define FERRY_OPENCL_LOOK_UP(function)                                                   \
  library->function = reinterpret_cast<decltype(&::function)>(dlsym(handle, #function)); \
  if (library->function == nullptr)                                                      \
    missing += (missing.empty() ? "" : ", ") + std::string(#function);
  FERRY_OPENCL_REQUIRED_FUNCTIONS(FERRY_OPENCL_LOOK_UP)
#undef FERRY_OPENCL_LOOK_UP
#define FERRY_OPENCL_LOOK_UP_OPTIONAL(function) \
  library->function = reinterpret_cast<decltype(&::function)>(dlsym(handle, #function));
  FERRY_OPENCL_OPTIONAL_FUNCTIONS(FERRY_OPENCL_LOOK_UP_OPTIONAL)
#undef FERRY_OPENCL_LOOK_UP_OPTIONAL
  if (library->clCreateCommandQueue == nullptr &&
      library->clCreateCommandQueueWithProperties == nullptr) {
    missing += (missing.empty() ? "" : ", ") + std::string("clCreateCommandQueue[WithProperties]");
  }
  if (!missing.empty()) {
    // The handle stays open: closing a half-initialised ICD loader is not worth the risk, and
    // the failure is cached, so this happens once per name.
    return UnavailableError(fmt::format(
        "the OpenCL library {} lacks required functions (an OpenCL 1.1+ ICD loader is needed): {}",
        library_name, missing));
  }
  return library;
}

}  // namespace

StatusOr<const OpenClLibrary*> LoadOpenClLibrary(std::string_view library_name) {
  // Tables are never freed: callbacks running on the runtime's threads may use them until exit.
  struct Cache {
    Mutex mutex;
    std::map<std::string, StatusOr<const OpenClLibrary*>, std::less<>> libraries
        ABSL_GUARDED_BY(mutex);
  };
  static auto* cache = new Cache();
  MutexLock lock(cache->mutex);
  if (auto it = cache->libraries.find(library_name); it != cache->libraries.end()) {
    return it->second;
  }
  const std::string name(library_name);
  StatusOr<std::unique_ptr<OpenClLibrary>> opened = Open(name);
  StatusOr<const OpenClLibrary*> result = opened.ok()
                                              ? StatusOr<const OpenClLibrary*>(opened->release())
                                              : StatusOr<const OpenClLibrary*>(opened.status());
  cache->libraries.emplace(name, result);
  return result;
}

StatusOr<const OpenClLibrary*> LoadDefaultOpenClLibrary() {
  const std::optional<std::string> name = settings::OpenClLibrary();
  return LoadOpenClLibrary(name.has_value() ? std::string_view(*name) : kDefaultOpenClLibrary);
}

}  // namespace ferry::opencl
