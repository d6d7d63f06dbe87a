// The shared runtime's MPI process group: opens libferry_mpi.so (mpi_process_group.cc built as a
// module, linked against the system's MPI) from the folder libferry.so lies in, on the first MPI
// group, and forwards to it. Where the module or the MPI library it needs cannot be loaded, the
// group is Unavailable with what to install.
#include <dlfcn.h>

#include <atomic>
#include <filesystem>
#include <mutex>

#include "fmt/format.h"
#include "src/distributed/mpi_process_group.h"

namespace ferry::distributed::internal {

const bool kHaveMpi = true;

namespace {

std::atomic<const MpiModule*> loaded_module{nullptr};

std::filesystem::path ModulePath() {
  Dl_info info{};
  // The folder of the library holding this function: libferry.so's.
  if (dladdr(reinterpret_cast<void*>(&ModulePath), &info) == 0 || info.dli_fname == nullptr) {
    return FERRY_MPI_MODULE;
  }
  return std::filesystem::path(info.dli_fname).parent_path() / FERRY_MPI_MODULE;
}

StatusOr<const MpiModule*> OpenModule() {
  const std::string path = ModulePath().string();
  // RTLD_GLOBAL: MPI libraries open their own components and expect their symbols to be visible.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* reason = dlerror();
    return UnavailableError(fmt::format(
        "MPI is not available: {} could not be loaded ({}). ferry runs many processes over the "
        "system's MPI (MPICH's ABI, libmpich.so.12), which a package never bundles: install it "
        "(Debian and Ubuntu: apt install mpich, which also gives mpiexec)",
        path, reason != nullptr ? reason : "unknown error"));
  }
  auto* entry = reinterpret_cast<const MpiModule* (*)()>(dlsym(handle, kMpiModuleEntry));
  const MpiModule* module = entry != nullptr ? entry() : nullptr;
  if (module == nullptr || module->version != kMpiModuleVersion) {
    return UnavailableError(fmt::format(
        "{} is not ferry's MPI module of this build (no {} of version {}): reinstall ferry", path,
        kMpiModuleEntry, kMpiModuleVersion));
  }
  return module;
}

StatusOr<const MpiModule*> Module() {
  static std::mutex* mutex = new std::mutex();
  static StatusOr<const MpiModule*>* result = nullptr;
  std::lock_guard<std::mutex> lock(*mutex);
  if (result == nullptr) {
    result = new StatusOr<const MpiModule*>(OpenModule());  // once per process, kept until exit
    if (result->ok()) loaded_module.store(**result);
  }
  return *result;
}

}  // namespace

StatusOr<std::unique_ptr<ProcessGroup>> MakeMpiProcessGroup() {
  FERRY_ASSIGN_OR_RETURN(const MpiModule* module, Module());
  return module->make_group();
}

void FinalizeIfMpi(ProcessGroup& group) {
  // An MPI group exists only where the module was loaded.
  if (const MpiModule* module = loaded_module.load(); module != nullptr) {
    module->finalize_if_mpi(group);
  }
}

int AbandonedCollectivesForTesting(ProcessGroup& group) {
  const MpiModule* module = loaded_module.load();
  return module != nullptr ? module->abandoned_collectives_for_testing(group) : 0;
}

}  // namespace ferry::distributed::internal
