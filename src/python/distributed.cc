#include "src/python/distributed.h"

#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <memory>

#include "ferry/core/mutex.h"
#include "ferry/distributed/global_devices.h"
#include "ferry/distributed/process_group.h"
#include "ferry/runtime/sharding.h"
#include "fmt/format.h"
#include "src/python/gil.h"
#include "src/python/py_source.h"
#include "src/python/status_error.h"

namespace nb = nanobind;

namespace ferry::python {
namespace {

// Global device tables by backend, gathered once per backend (a collective call) and kept for
// the life of the process, like the clients they describe.
struct GlobalTables {
  Mutex mutex;
  std::map<std::string, std::shared_ptr<const distributed::GlobalDevices>, std::less<>> tables
      ABSL_GUARDED_BY(mutex);
};

GlobalTables& Tables() {
  static auto* tables = new GlobalTables();
  return *tables;
}

std::shared_ptr<const distributed::GlobalDevices> CachedTable(std::string_view backend) {
  GlobalTables& tables = Tables();
  MutexLock lock(tables.mutex);
  auto it = tables.tables.find(backend);
  return it == tables.tables.end() ? nullptr : it->second;
}

distributed::ProcessGroup& Group() { return distributed::CurrentProcessGroup(); }

// The table of `backend`, gathering it (collectively) on first use; `local` are this process's
// devices of that backend (ferry.devices(backend), passed in from Python).
std::shared_ptr<const distributed::GlobalDevices> GatherTable(const std::string& backend,
                                                              const std::vector<Device*>& local) {
  ApiScope api;
  if (auto table = CachedTable(backend)) return table;
  StatusOr<std::shared_ptr<const distributed::GlobalDevices>> gathered;
  {
    ScopedGilRelease unlocked;
    gathered = distributed::GlobalDevices::Gather(Group(), backend, local);
  }
  auto table = ValueOrThrow(std::move(gathered));
  GlobalTables& tables = Tables();
  MutexLock lock(tables.mutex);
  return tables.tables.emplace(backend, std::move(table)).first->second;
}

std::vector<Device*> GlobalDevicesOf(const std::string& backend,
                                     const std::vector<Device*>& local) {
  return GatherTable(backend, local)->devices();
}

int ProcessIndexOf(const Device& device) {
  if (const auto* remote = dynamic_cast<const distributed::RemoteDevice*>(&device)) {
    return remote->process_index();
  }
  return Group().rank();
}

// The device's global id: its position in its backend's global device list. For a local device
// whose backend's global list was not gathered: its index in a single process, else an error.
int64_t GlobalIdOf(const Device& device, const std::string& backend) {
  if (auto table = CachedTable(backend)) {
    if (int64_t id = table->GlobalIdOf(&device); id >= 0) return id;
  }
  if (Group().size() == 1) return device.index();
  throw StatusError{FailedPreconditionError(
      fmt::format("device {}: global ids are known once every process has called "
                  "ferry.global_devices(\"{}\")",
                  device.name(), backend))};
}

std::string Initialize() {
  ApiScope api;
  StatusOr<distributed::ProcessGroup*> group;
  {
    ScopedGilRelease unlocked;
    group = distributed::Initialize();
  }
  distributed::ProcessGroup* joined = ValueOrThrow(std::move(group));
  // Tables gathered before, while this process was a group of its own, list its devices alone:
  // gathered again job-wide from here (kept alive: Python may still hold their devices).
  if (joined->size() > 1) {
    GlobalTables& tables = Tables();
    MutexLock lock(tables.mutex);
    static auto* retired =
        new std::vector<std::shared_ptr<const distributed::GlobalDevices>>();  // never freed
    for (auto& [backend, table] : tables.tables) retired->push_back(std::move(table));
    tables.tables.clear();
  }
  return std::string(joined->engine());
}

// The agreed outcome of `step`: raises the same error on every rank if any rank failed.
void Agree(std::optional<int> code, const std::string& message, const std::string& step) {
  ApiScope api;
  const Status local =
      code.has_value() ? Status(static_cast<absl::StatusCode>(*code), message) : OkStatus();
  Status agreed;
  {
    ScopedGilRelease unlocked;
    agreed = distributed::AgreeOnStatus(Group(), local, step);
  }
  ThrowIfError(agreed);
}

void AgreeOnValue(const std::string& value, const std::string& what) {
  ApiScope api;
  Status agreed;
  {
    ScopedGilRelease unlocked;
    agreed = distributed::AgreeOnValue(Group(), value, what);
  }
  ThrowIfError(agreed);
}

void Barrier(const std::string& step) {
  ApiScope api;
  Status status;
  {
    ScopedGilRelease unlocked;
    status = Group().Barrier(step);
  }
  ThrowIfError(status);
}

std::vector<nb::bytes> AllGather(nb::bytes local, const std::string& step) {
  ApiScope api;
  std::string bytes(local.c_str(), local.size());
  StatusOr<std::vector<std::string>> all;
  {
    ScopedGilRelease unlocked;
    all = Group().AllGather(bytes, step);
  }
  std::vector<nb::bytes> result;
  for (const std::string& each : ValueOrThrow(std::move(all))) {
    result.emplace_back(each.data(), each.size());
  }
  return result;
}

// load_file with a sharding: read exactly this process's shards of a mapped tensor (see
// AdviseExactShardReads); `object` is a numpy view of the mapped file.
void AdviseShardReads(nb::object object, std::optional<std::string> dtype_override,
                      const Sharding& sharding) {
  ApiScope api;
  std::optional<DType> dtype;
  if (dtype_override.has_value()) dtype = ValueOrThrow(DTypeFromName(*dtype_override));
  // Destroyed after `unlocked`, with the GIL held (it holds the Python object).
  auto source = ValueOrThrow(SourceFromPython(object, dtype, "array"));
  ScopedGilRelease unlocked;
  AdviseExactShardReads(source->view(), sharding);
}

}  // namespace

void AddDistributedFunctions(nb::module_& m) {
  m.def("_advise_shard_reads", &AdviseShardReads, nb::arg("object"),
        nb::arg("dtype_override").none(), nb::arg("sharding"));
  m.def("_distributed_initialize", &Initialize);
  m.def("_distributed_finalize", [] {
    ScopedGilRelease unlocked;
    distributed::Finalize();
  });
  m.def("_distributed_engine", [] { return std::string(Group().engine()); });
  m.def("_started_by_mpi_launcher", &distributed::StartedByMpiLauncher);
  m.def("_have_mpi", &distributed::HaveMpi);
  m.def("process_index", [] { return Group().rank(); });
  m.def("process_count", [] { return Group().size(); });
  m.def("_global_devices", &GlobalDevicesOf, nb::arg("backend"), nb::arg("local"),
        nb::rv_policy::reference);
  m.def("_process_index_of", &ProcessIndexOf);
  m.def("_global_id_of", &GlobalIdOf);
  m.def("_remote_backend", [](const Device& device) -> std::optional<std::string> {
    if (const auto* remote = dynamic_cast<const distributed::RemoteDevice*>(&device)) {
      return remote->backend();
    }
    return std::nullopt;
  });
  m.def("_agree", &Agree, nb::arg("code").none(), nb::arg("message"), nb::arg("step"));
  m.def("_agree_on_value", &AgreeOnValue);
  m.def("_barrier", &Barrier);
  m.def("_all_gather", &AllGather);
}

}  // namespace ferry::python
