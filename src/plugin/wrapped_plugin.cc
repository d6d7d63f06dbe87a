#include "src/plugin/wrapped_plugin.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string_view>
#include <system_error>
#include <thread>

#include "ferry/core/metrics.h"
#include "ferry/core/settings.h"
#include "fmt/format.h"
#include "src/core/fork_locks.h"
#include "src/device/pjrt/pjrt_runtime.h"
#include "src/plugin/device_to_host.h"
#include "src/plugin/host_to_device.h"
#include "src/plugin/plugin_errors.h"
#include "src/plugin/plugin_events.h"
#include "src/plugin/version_bridge.h"

namespace ferry::plugin {
namespace {

namespace fs = std::filesystem;

// The file this code was loaded from (ferry_pjrt_plugin.so), to refuse wrapping itself.
std::string OwnPath() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&OwnPath), &info) == 0 || info.dli_fname == nullptr) {
    return {};
  }
  return info.dli_fname;
}

StatusOr<std::string> WrappedPluginPath() {
  const std::optional<std::string> wrapped = settings::PjrtWrappedPlugin();
  FERRY_ASSIGN_OR_RETURN(const std::string path, pjrt::FindPjrtPlugin(wrapped.value_or("")));
  std::error_code error;
  const std::string own = OwnPath();
  if (!own.empty() && fs::equivalent(fs::path(path), fs::path(own), error)) {
    return InvalidArgumentError(fmt::format(
        "the plugin to wrap is ferry's own ({}): set FERRY_PJRT_WRAPPED_PLUGIN to another plugin",
        path));
  }
  return path;
}

// Writes `entry` at `offset` of `table` when the wrapped table has that slot (it is never grown).
template <typename Function>
void Replace(PJRT_Api* table, size_t offset, Function* entry) {
  if (offset + sizeof(entry) > table->struct_size) return;
  std::memcpy(reinterpret_cast<std::byte*>(table) + offset, &entry, sizeof(entry));
}
#define FERRY_REPLACE(table, name, entry) Replace(table, offsetof(PJRT_Api, name), entry)

PJRT_Error* InitializeAlreadyDone(PJRT_Plugin_Initialize_Args* /*args*/) {
  // LoadPjrtLibrary initialised the wrapped plugin when ferry loaded it.
  return nullptr;
}

}  // namespace

PathCounters& Counters() {
  static auto* counters = new PathCounters();
  return *counters;
}

void CountTransferPath(TransferPath path) {
  struct Entry {
    std::atomic<int64_t>& own;
    Counter* metric;
  };
  PathCounters& counters = Counters();
  // The metrics are looked up once (GetCounter takes the registry's lock); indexed by path.
  static const Entry* entries = new Entry[]{
      {counters.puts_by_ferry, GetCounter("PjrtPluginPutsByFerry")},
      {counters.puts_by_plugin, GetCounter("PjrtPluginPutsByPlugin")},
      {counters.reads_by_ferry, GetCounter("PjrtPluginReadsByFerry")},
      {counters.reads_by_plugin, GetCounter("PjrtPluginReadsByPlugin")},
      {counters.refused, GetCounter("PjrtPluginRefusedCalls")},
      {counters.puts_after_the_call, GetCounter("PjrtPluginPutsAfterTheCall")},
  };
  if (path == TransferPath::kPutByFerryAfterTheCall) CountTransferPath(TransferPath::kPutByFerry);
  const Entry& entry = entries[static_cast<int>(path)];
  entry.own.fetch_add(1, std::memory_order_relaxed);
  entry.metric->Add();
}

namespace {

// ferry's PJRT_Client_Destroy: the wrapped plugin's, once ferry's work that still calls it after
// a call returned (puts to fulfil, reads of the caller's buffers) is over.
PJRT_Error* ClientDestroy(PJRT_Client_Destroy_Args* args) {
  StatusOr<WrappedPlugin*> plugin = WrappedPlugin::Get();
  if (!plugin.ok()) return MakeError(plugin.status());
  (*plugin)->WaitForClientWork();
  return (*plugin)->wrapped().PJRT_Client_Destroy(args);
}

// One copy worker per core.
int NumCopyWorkers() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

}  // namespace

StatusOr<WrappedPlugin*> WrappedPlugin::Get() {
  static const StatusOr<WrappedPlugin*>* instance = new StatusOr<WrappedPlugin*>(Make());
  return *instance;
}

StatusOr<WrappedPlugin*> WrappedPlugin::Make() {
  FERRY_ASSIGN_OR_RETURN(const std::string path, WrappedPluginPath());
  FERRY_ASSIGN_OR_RETURN(const pjrt::PjrtLibrary* library, pjrt::LoadPjrtLibrary(path));
  const PJRT_Api& wrapped = *library->api;
  if (wrapped.struct_size < offsetof(PJRT_Api, PJRT_Buffer_ToHostBuffer) + sizeof(void*)) {
    return UnavailableError(
        fmt::format("the PJRT plugin {} has a table of only {} bytes", path, wrapped.struct_size));
  }
  auto* plugin = new WrappedPlugin();
  plugin->library_ = library;
  SetWrappedErrorApi(library->api);
  SetWrappedEventApi(library->api);
  // The whole table, at its own size: entries newer than ferry's header pass through untouched.
  auto* table = static_cast<PJRT_Api*>(std::calloc(1, wrapped.struct_size));
  std::memcpy(table, &wrapped, wrapped.struct_size);
  FERRY_REPLACE(table, PJRT_Error_Destroy, &DestroyError);
  FERRY_REPLACE(table, PJRT_Error_Message, &ErrorMessage);
  FERRY_REPLACE(table, PJRT_Error_GetCode, &ErrorGetCode);
  FERRY_REPLACE(table, PJRT_Event_Destroy, &EventDestroy);
  FERRY_REPLACE(table, PJRT_Event_IsReady, &EventIsReady);
  FERRY_REPLACE(table, PJRT_Event_Error, &EventError);
  FERRY_REPLACE(table, PJRT_Event_Await, &EventAwait);
  FERRY_REPLACE(table, PJRT_Event_OnReady, &EventOnReady);
  FERRY_REPLACE(table, PJRT_Plugin_Initialize, &InitializeAlreadyDone);
  FERRY_REPLACE(table, PJRT_Client_BufferFromHostBuffer, &BufferFromHostBuffer);
  FERRY_REPLACE(table, PJRT_Buffer_ToHostBuffer, &ToHostBuffer);
  FERRY_REPLACE(table, PJRT_Buffer_Destroy, &BufferDestroy);
  FERRY_REPLACE(table, PJRT_Client_Destroy, &ClientDestroy);
  FERRY_REPLACE(table, PJRT_LoadedExecutable_Execute, &ExecuteBridged);
  if (wrapped.struct_size >= kErrorForEachPayloadOffset + sizeof(ErrorForEachPayloadEntry)) {
    ErrorForEachPayloadEntry wrapped_entry = nullptr;
    std::memcpy(&wrapped_entry,
                reinterpret_cast<const std::byte*>(&wrapped) + kErrorForEachPayloadOffset,
                sizeof(wrapped_entry));
    if (wrapped_entry != nullptr) {  // an entry the plugin left empty stays empty
      SetWrappedForEachPayload(wrapped_entry);
      Replace(table, kErrorForEachPayloadOffset, &ErrorForEachPayload);
    }
  }
  plugin->table_ = table;
  plugin->workers_.store(new ProcessWorkers(internal::ForkGeneration(), NumCopyWorkers()),
                         std::memory_order_release);
  plugin->memory_ = std::make_shared<MemoryAccount>(std::nullopt);
  internal::RegisterForkLock(internal::ForkLockRank::kPluginState, plugin->mutex_);
  internal::RegisterForkLock(internal::ForkLockRank::kPluginState, plugin->pending_mutex_);
  internal::RegisterForkLock(internal::ForkLockRank::kPluginState, plugin->use_mutex_);
  internal::RegisterForkLock(internal::ForkLockRank::kPluginState, plugin->work_mutex_);
  return plugin;
}

WrappedPlugin::ProcessWorkers& WrappedPlugin::ThisProcessWorkers() {
  ProcessWorkers* current = workers_.load(std::memory_order_acquire);
  const uint64_t generation = internal::ForkGeneration();
  if (current->fork_generation == generation) return *current;
  // A forked child's first transfer: its own threads. Another thread of the child may race here;
  // the loser's workers are joined and freed at once, in the process that made them.
  auto own = std::make_unique<ProcessWorkers>(generation, NumCopyWorkers());
  while (current->fork_generation != generation) {
    if (workers_.compare_exchange_weak(current, own.get(), std::memory_order_acq_rel,
                                       std::memory_order_acquire)) {
      return *own.release();  // the parent's are abandoned: destroying them would join threads
                              // that do not exist in this process
    }
  }
  return *current;
}

bool WrappedPlugin::MayAlias() const {
  return FERRY_PJRT_HAS(library(), PJRT_Client_CreateAliasBuffer) &&
         FERRY_PJRT_HAS(library(), PJRT_Client_FulfillAliasBuffer) &&
         !alias_refused_.load(std::memory_order_relaxed);
}

uint64_t WrappedPlugin::AddPendingPut(PJRT_Buffer* buffer, Future<> fulfilled) {
  MutexLock lock(pending_mutex_);
  const uint64_t id = ++next_pending_id_;
  pending_puts_.insert_or_assign(buffer, PendingPutEntry{id, std::move(fulfilled)});
  return id;
}

void WrappedPlugin::RemovePendingPut(PJRT_Buffer* buffer, uint64_t id) {
  MutexLock lock(pending_mutex_);
  auto entry = pending_puts_.find(buffer);
  if (entry != pending_puts_.end() && entry->second.id == id) pending_puts_.erase(entry);
}

std::optional<Future<>> WrappedPlugin::PendingPut(PJRT_Buffer* buffer) const {
  MutexLock lock(pending_mutex_);
  auto entry = pending_puts_.find(buffer);
  if (entry == pending_puts_.end()) return std::nullopt;
  return entry->second.fulfilled;
}

void WrappedPlugin::ForgetWorkOfParent() {
  // A forked child: the work counted was the parent's, whose threads are not here to end it.
  if (const uint64_t generation = internal::ForkGeneration(); generation != work_generation_) {
    work_generation_ = generation;
    client_work_ = 0;
  }
}

void WrappedPlugin::BeginClientWork() {
  MutexLock lock(work_mutex_);
  ForgetWorkOfParent();
  ++client_work_;
}

void WrappedPlugin::EndClientWork() {
  MutexLock lock(work_mutex_);
  ForgetWorkOfParent();
  if (client_work_ > 0 && --client_work_ == 0) work_done_.notify_all();
}

void WrappedPlugin::WaitForClientWork() {
  MutexLock lock(work_mutex_);
  ForgetWorkOfParent();
  while (client_work_ > 0) lock.Wait(work_done_);
}

void WrappedPlugin::BeginUse(PJRT_Buffer* buffer) {
  BeginClientWork();
  MutexLock lock(use_mutex_);
  ++buffers_in_use_[buffer].uses;
}

void WrappedPlugin::EndUse(PJRT_Buffer* buffer) {
  bool destroy = false;
  {
    MutexLock lock(use_mutex_);
    auto it = buffers_in_use_.find(buffer);
    if (it == buffers_in_use_.end()) return;  // unbalanced: nothing to end
    if (--it->second.uses == 0) {
      destroy = it->second.destroy_deferred;
      buffers_in_use_.erase(it);
    }
  }
  if (destroy) {
    auto args = FERRY_PJRT_ARGS(PJRT_Buffer_Destroy_Args);
    args.buffer = buffer;
    TakeError(wrapped(), wrapped().PJRT_Buffer_Destroy(&args)).IgnoreError();
  }
  EndClientWork();  // after the deferred Destroy, which needs the client
}

bool WrappedPlugin::DeferDestroy(PJRT_Buffer* buffer) {
  MutexLock lock(use_mutex_);
  auto it = buffers_in_use_.find(buffer);
  if (it == buffers_in_use_.end()) return false;
  it->second.destroy_deferred = true;
  return true;
}

bool WrappedPlugin::HostAddressable(PJRT_Client* client) {
  {
    MutexLock lock(mutex_);
    if (auto it = host_addressable_.find(client); it != host_addressable_.end()) return it->second;
  }
  bool addressable = FERRY_PJRT_HAS(library(), PJRT_Client_CreateViewOfDeviceBuffer) &&
                     FERRY_PJRT_HAS(library(), PJRT_Buffer_OpaqueDeviceMemoryDataPointer) &&
                     FERRY_PJRT_HAS(library(), PJRT_Client_PlatformName);
  if (addressable) {
    auto args = FERRY_PJRT_ARGS(PJRT_Client_PlatformName_Args);
    args.client = client;
    addressable =
        TakeError(wrapped(), wrapped().PJRT_Client_PlatformName(&args)).ok() &&
        std::string_view(args.platform_name, args.platform_name_size) == std::string_view("cpu");
  }
  MutexLock lock(mutex_);
  host_addressable_[client] = addressable;
  return addressable;
}

namespace {

Status* failure_reason = nullptr;

PJRT_Error* Unavailable(void* /*args*/) { return MakeError(*failure_reason); }

}  // namespace

const PJRT_Api* FailureTable(const Status& reason) {
  static PJRT_Api* table = [&reason] {
    failure_reason = new Status(reason);
    auto* failure = new PJRT_Api{};
    failure->struct_size = PJRT_Api_STRUCT_SIZE;
    failure->pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
    failure->pjrt_api_version.major_version = PJRT_API_MAJOR;
    failure->pjrt_api_version.minor_version = PJRT_API_MINOR;
    // Every entry of the C API has the shape PJRT_Error*(Args*), except the error entries.
    auto* unavailable = &Unavailable;
    const size_t first = offsetof(PJRT_Api, PJRT_Error_Destroy);
    for (size_t offset = first; offset + sizeof(void*) <= PJRT_Api_STRUCT_SIZE;
         offset += sizeof(void*)) {
      std::memcpy(reinterpret_cast<std::byte*>(failure) + offset, &unavailable, sizeof(void*));
    }
    failure->PJRT_Error_Destroy = &DestroyError;
    failure->PJRT_Error_Message = &ErrorMessage;
    failure->PJRT_Error_GetCode = &ErrorGetCode;
    return failure;
  }();
  return table;
}

}  // namespace ferry::plugin
