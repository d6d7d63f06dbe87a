#include "src/device/pjrt/pjrt_library.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>

#include "absl/strings/str_split.h"
#include "ferry/core/settings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"

namespace ferry::pjrt {
namespace {

namespace fs = std::filesystem;

// The search path for an error message; says where it would come from when it is empty.
std::string DescribeSearchPath() {
  const std::vector<std::string> roots = PythonPackageSearchPath();
  if (roots.empty()) {
    return "no folder (FERRY_PJRT_SEARCH_PATH, PYTHONPATH and VIRTUAL_ENV are unset, and this "
           "ferry is not installed in a Python environment)";
  }
  return fmt::format("{}", fmt::join(roots, ":"));
}

// Entries ferry calls on every plugin; a table without one of them is refused at load time, so
// the rest of the backend may call them without a check.
constexpr size_t kRequiredEntries[] = {
    offsetof(PJRT_Api, PJRT_Error_Destroy),
    offsetof(PJRT_Api, PJRT_Error_Message),
    offsetof(PJRT_Api, PJRT_Error_GetCode),
    offsetof(PJRT_Api, PJRT_Plugin_Initialize),
    offsetof(PJRT_Api, PJRT_Event_Destroy),
    offsetof(PJRT_Api, PJRT_Event_Await),
    offsetof(PJRT_Api, PJRT_Event_OnReady),
    offsetof(PJRT_Api, PJRT_Client_Create),
    offsetof(PJRT_Api, PJRT_Client_Destroy),
    offsetof(PJRT_Api, PJRT_Client_PlatformName),
    offsetof(PJRT_Api, PJRT_Client_AddressableDevices),
    offsetof(PJRT_Api, PJRT_Client_BufferFromHostBuffer),
    offsetof(PJRT_Api, PJRT_Device_GetDescription),
    offsetof(PJRT_Api, PJRT_DeviceDescription_Kind),
    offsetof(PJRT_Api, PJRT_Buffer_Destroy),
    offsetof(PJRT_Api, PJRT_Buffer_ToHostBuffer),
    offsetof(PJRT_Api, PJRT_Buffer_ReadyEvent),
};

StatusOr<std::unique_ptr<PjrtLibrary>> Open(const std::string& path) {
  // RTLD_LOCAL keeps the plugin's (many) symbols out of the global namespace; RTLD_NODELETE
  // because unloading the XLA plugins crashes the process at exit.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* error = dlerror();
    return UnavailableError(fmt::format("cannot load the PJRT plugin {}: {}", path,
                                        error != nullptr ? error : "unknown dlopen error"));
  }
  using GetPjrtApiFunction = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetPjrtApiFunction>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    return UnavailableError(
        fmt::format("{} is not a PJRT plugin: it does not export GetPjrtApi", path));
  }
  const PJRT_Api* api = get_api();
  if (api == nullptr) {
    return UnavailableError(fmt::format("the PJRT plugin {} returned no API table", path));
  }
  auto library = std::make_unique<PjrtLibrary>();
  library->path = path;
  library->api = api;
  library->major_version = api->pjrt_api_version.major_version;
  library->minor_version = api->pjrt_api_version.minor_version;
  if (library->major_version != PJRT_API_MAJOR) {
    return UnavailableError(
        fmt::format("the PJRT plugin {} implements PJRT C API {}.{}; ferry speaks major version {}",
                    path, library->major_version, library->minor_version, PJRT_API_MAJOR));
  }
  std::vector<size_t> missing;
  for (size_t offset : kRequiredEntries) {
    if (!library->Has(offset)) missing.push_back(offset);
  }
  if (!missing.empty()) {
    return UnavailableError(fmt::format(
        "the PJRT plugin {} (API {}.{}) lacks {} entries ferry needs (table of {} bytes)", path,
        library->major_version, library->minor_version, missing.size(), api->struct_size));
  }
  PJRT_Plugin_Initialize_Args args{};
  args.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE;
  if (PJRT_Error* error = api->PJRT_Plugin_Initialize(&args); error != nullptr) {
    PJRT_Error_Message_Args message{};
    message.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
    message.error = error;
    api->PJRT_Error_Message(&message);
    std::string text(message.message, message.message_size);
    PJRT_Error_Destroy_Args destroy{};
    destroy.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
    destroy.error = error;
    api->PJRT_Error_Destroy(&destroy);
    return UnavailableError(fmt::format("the PJRT plugin {} failed to initialise: {}", path, text));
  }
  return library;
}

bool IsRegularFile(const fs::path& path) {
  std::error_code error;
  return fs::is_regular_file(path, error);
}

// The shared libraries directly inside `folder`, sorted by name. ferry's own plugin (installed
// in ferry's package) is never one of them: it wraps a real plugin and is named only by path.
std::vector<fs::path> SharedLibrariesIn(const fs::path& folder) {
  std::vector<fs::path> found;
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    const fs::path& path = it->path();
    if (path.extension() == ".so" && path.filename() != "ferry_pjrt_plugin.so" &&
        IsRegularFile(path)) {
      found.push_back(path);
    }
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::vector<fs::path> SubfoldersOf(const fs::path& folder) {
  std::vector<fs::path> found;
  std::error_code error;
  for (fs::directory_iterator it(folder, error), end; !error && it != end; it.increment(error)) {
    if (it->is_directory(error)) found.push_back(it->path());
  }
  std::sort(found.begin(), found.end());
  return found;
}

std::optional<fs::path> FindInPackage(std::string_view package) {
  std::string module(package);
  std::replace(module.begin(), module.end(), '-', '_');
  std::replace(module.begin(), module.end(), '.', '/');
  for (const std::string& root : PythonPackageSearchPath()) {
    for (const fs::path& folder : {fs::path(root) / module, fs::path(root) / "xla_plugins" / module,
                                   fs::path(root) / "jax_plugins" / module}) {
      std::vector<fs::path> libraries = SharedLibrariesIn(folder);
      if (!libraries.empty()) return libraries.front();
    }
  }
  return std::nullopt;
}

std::optional<fs::path> FindAnyInstalledPlugin() {
  for (const std::string& root : PythonPackageSearchPath()) {
    // Packages in the plugin namespaces JAX and XLA use: any shared library there.
    for (const char* space : {"xla_plugins", "jax_plugins"}) {
      for (const fs::path& package : SubfoldersOf(fs::path(root) / space)) {
        std::vector<fs::path> libraries = SharedLibrariesIn(package);
        if (!libraries.empty()) return libraries.front();
      }
    }
    // Elsewhere only libraries that say what they are: opening arbitrary shared libraries of
    // other packages could run their initialisers.
    for (const fs::path& package : SubfoldersOf(root)) {
      for (const fs::path& library : SharedLibrariesIn(package)) {
        if (library.filename().string().find("pjrt") != std::string::npos) return library;
      }
    }
  }
  return std::nullopt;
}

StatusOr<std::string> FindRequested(std::string_view requested, std::string_view origin) {
  if (requested.find('/') != std::string_view::npos || IsRegularFile(fs::path(requested))) {
    if (!IsRegularFile(fs::path(requested))) {
      return UnavailableError(fmt::format("{}: no PJRT plugin file at {}", origin, requested));
    }
    return std::string(requested);
  }
  if (std::optional<fs::path> found = FindInPackage(requested); found.has_value()) {
    return found->string();
  }
  return UnavailableError(fmt::format(
      "{}: '{}' is neither a file nor an installed Python package with a PJRT plugin (searched: "
      "{})",
      origin, requested, DescribeSearchPath()));
}

}  // namespace

bool PjrtLibrary::Has(size_t offset) const {
  if (api == nullptr || offset + sizeof(void*) > api->struct_size) return false;
  const void* entry = nullptr;
  std::memcpy(&entry, reinterpret_cast<const std::byte*>(api) + offset, sizeof(entry));
  return entry != nullptr;
}

StatusOr<const PjrtLibrary*> LoadPjrtLibrary(const std::string& path) {
  // Tables are never freed: plugin threads may call back into ferry until the process exits.
  static std::mutex* mutex = new std::mutex();
  static auto* cache = new std::map<std::string, StatusOr<const PjrtLibrary*>, std::less<>>();
  std::lock_guard<std::mutex> lock(*mutex);
  if (auto it = cache->find(path); it != cache->end()) return it->second;
  StatusOr<std::unique_ptr<PjrtLibrary>> opened = Open(path);
  StatusOr<const PjrtLibrary*> result = opened.ok()
                                            ? StatusOr<const PjrtLibrary*>(opened->release())
                                            : StatusOr<const PjrtLibrary*>(opened.status());
  cache->emplace(path, result);
  return result;
}

namespace {

// The site-packages folder of the ferry package that holds this code, when it is installed as
// one (pip: site-packages/ferry/libferry.so; a plugin built without libferry.so sits there too):
// a process that loads ferry's PJRT plugin without importing ferry (torch_xla with
// PJRT_LIBRARY_PATH, JAX's register_plugin) finds the plugins installed beside ferry.
std::optional<fs::path> SitePackagesHoldingThisFerry() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&PythonPackageSearchPath), &info) == 0 ||
      info.dli_fname == nullptr) {
    return std::nullopt;
  }
  // The path as loaded first (a site-packages/ferry/libferry.so that is a symlink into a build
  // tree still names its package), then with links resolved.
  std::error_code error;
  const fs::path loaded = fs::absolute(fs::path(info.dli_fname), error).lexically_normal();
  for (const fs::path& library : {loaded, fs::canonical(loaded, error)}) {
    if (library.empty()) continue;
    const fs::path package = library.parent_path();
    std::error_code missing;
    if (package.filename() == "ferry" && fs::is_regular_file(package / "__init__.py", missing)) {
      return package.parent_path();
    }
  }
  return std::nullopt;
}

}  // namespace

std::vector<std::string> PythonPackageSearchPath() {
  std::vector<std::string> roots;
  auto add = [&roots](std::string root) {
    if (std::find(roots.begin(), roots.end(), root) == roots.end())
      roots.push_back(std::move(root));
  };
  auto add_list = [&add](const char* list) {
    if (list == nullptr) return;
    for (absl::string_view piece : absl::StrSplit(list, ':', absl::SkipEmpty())) {
      add(std::string(piece));
    }
  };
  for (const std::string& folder : settings::PjrtSearchPath()) add(folder);
  add_list(std::getenv("PYTHONPATH"));
  if (const char* venv = std::getenv("VIRTUAL_ENV"); venv != nullptr && *venv != '\0') {
    for (const fs::path& lib : SubfoldersOf(fs::path(venv) / "lib")) {
      const std::string name = lib.filename().string();
      fs::path site = lib / "site-packages";
      if (name.rfind("python3", 0) == 0 && fs::is_directory(site)) add(site.string());
    }
  }
  // Where this code lies does not change while the process runs: looked up once.
  static const std::optional<fs::path> holding_this_ferry = SitePackagesHoldingThisFerry();
  if (holding_this_ferry.has_value()) add(holding_this_ferry->string());
#ifdef FERRY_PJRT_BUILD_SITE_PACKAGES
  // The packages of the Python environment this ferry was built with (where its header came from).
  add_list(FERRY_PJRT_BUILD_SITE_PACKAGES);
#endif
  return roots;
}

StatusOr<std::string> FindPjrtPlugin(std::string_view requested) {
  if (!requested.empty()) return FindRequested(requested, "pjrt plugin");
  if (const std::optional<std::string> plugin = settings::PjrtPlugin(); plugin.has_value()) {
    return FindRequested(*plugin, "FERRY_PJRT_PLUGIN");
  }
  if (std::optional<fs::path> found = FindAnyInstalledPlugin(); found.has_value()) {
    return found->string();
  }
  return UnavailableError(fmt::format(
      "no PJRT plugin: set FERRY_PJRT_PLUGIN to a plugin's path or package, or install one (pip "
      "install xla-cpu-pjrt); searched: {}",
      DescribeSearchPath()));
}

}  // namespace ferry::pjrt
