// WrappedPlugin: the real PJRT plugin that ferry's plugin (ferry_pjrt_plugin.so) stands in front
// of, and what ferry's replacement entries share.
//
// GetPjrtApi() (ferry_pjrt_plugin.cc) makes the one instance the first time it is called:
// - the wrapped plugin is FERRY_PJRT_WRAPPED_PLUGIN (a path or an installed package name), else
//   the pjrt backend's discovery (FindPjrtPlugin: FERRY_PJRT_PLUGIN, then the installed packages;
//   ferry's own plugin is never picked), loaded with LoadPjrtLibrary (dlopen RTLD_NODELETE, its
//   PJRT_Plugin_Initialize run once);
// - ferry's table is a byte copy of the wrapped table, of the wrapped table's own struct_size (a
//   newer plugin's extra entries pass through untouched), with only these entries replaced: the
//   three error entries (plugin_errors.h), the five event entries (plugin_events.h: ferry's
//   asynchronous reads return events of ferry's own), PJRT_Plugin_Initialize (the wrapped plugin is
//   already initialised), PJRT_Client_BufferFromHostBuffer (host_to_device.h),
//   PJRT_Buffer_ToHostBuffer (device_to_host.h), PJRT_Buffer_Destroy (deferred while ferry's reads
//   use the buffer: BeginUse), PJRT_Client_Destroy (after ferry's work for it:
//   WaitForClientWork) and PJRT_LoadedExecutable_Execute
//   (version_bridge.h: an older framework's options, zero-extended). An entry the wrapped table
//   lacks is never added.
//
// Ownership: the instance, the table and the wrapped library live until the process exits (plugin
// threads may call into them at exit). Thread-safe.
//
// fork(): the copy workers and the fulfilment thread belong to the process that started them. A
// forked child has none of them, so its first transfer starts its own (the parent's are
// abandoned there, never joined); the instance's locks are held still across every fork
// (src/core/fork_locks.h). Buffers the parent left pending at the fork are never fulfilled in the
// child: as JAX says of fork() itself, transfer before the fork or after, not across it.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "ferry/core/mutex.h"
#include "ferry/core/status.h"
#include "ferry/device/memory_account.h"
#include "src/core/serial_executor.h"
#include "src/device/pjrt/pjrt_library.h"
#include "src/device/transfer_engine.h"

namespace ferry::plugin {

// How many calls of each replaced transfer entry took which path (ferry's counters, readable
// from outside through FerryPjrtPluginCounters in ferry_pjrt_plugin.cc). Relaxed atomics.
struct PathCounters {
  std::atomic<int64_t> puts_by_ferry{0};  // written by ferry, handed over as a view
  // Of those, puts returned before ferry wrote them (a pending buffer ferry fulfils later).
  std::atomic<int64_t> puts_after_the_call{0};
  std::atomic<int64_t> puts_by_plugin{0};   // passed to the wrapped plugin (aliasing included)
  std::atomic<int64_t> reads_by_ferry{0};   // ToHostBuffer copied by ferry
  std::atomic<int64_t> reads_by_plugin{0};  // ToHostBuffer passed to the wrapped plugin
  std::atomic<int64_t> refused{0};          // bad input answered with an error
};
PathCounters& Counters();
// Counts one call of a transfer entry by the path it took: in Counters() and in ferry's metrics
// (PjrtPluginPutsByFerry, PjrtPluginPutsByPlugin, PjrtPluginReadsByFerry,
// PjrtPluginReadsByPlugin, PjrtPluginRefusedCalls, PjrtPluginPutsAfterTheCall; a put after the
// call counts in PjrtPluginPutsByFerry too), which a process that also imports ferry sees
// in ferry.metrics(): the plugin and the Python module share one ferry runtime (libferry.so).
enum class TransferPath {
  kPutByFerry,
  kPutByPlugin,
  kReadByFerry,
  kReadByPlugin,
  kRefused,
  kPutByFerryAfterTheCall
};
void CountTransferPath(TransferPath path);

class WrappedPlugin {
 public:
  // The instance, made on the first call (later calls return the same result, errors included).
  static StatusOr<WrappedPlugin*> Get();

  const pjrt::PjrtLibrary& library() const { return *library_; }
  // The wrapped plugin's own table: every call ferry makes to the plugin goes here.
  const PJRT_Api& wrapped() const { return *library_->api; }
  // ferry's table, handed to the caller of GetPjrtApi.
  const PJRT_Api* table() const { return table_; }

  // The workers that run ferry's copies (one per core), this process's own (see fork() above).
  TransferEngine& engine() { return ThisProcessWorkers().engine; }
  // The account of the device memory ferry allocates for plugin buffers (no limit: the plugin's
  // own memory has none either).
  const std::shared_ptr<MemoryAccount>& memory() const { return memory_; }

  // Where ferry fulfils the buffers its puts return before they are written (host_to_device.h):
  // one thread of its own, so that the callbacks the plugin runs at fulfilment (those its users
  // registered on the buffer) never hold up a copy worker.
  Executor& fulfilments() { return ThisProcessWorkers().fulfilments; }
  // Whether ferry may return a buffer before writing it: the wrapped plugin has
  // PJRT_Client_CreateAliasBuffer and PJRT_Client_FulfillAliasBuffer (API 0.76 on), and has not
  // answered CreateAliasBuffer UNIMPLEMENTED (AliasRefused).
  bool MayAlias() const;
  void AliasRefused() { alias_refused_.store(true, std::memory_order_relaxed); }

  // The buffers ferry's puts returned before writing them (host_to_device.h), until the plugin
  // has them fulfilled: AddPendingPut when the put returns one, with a future that completes
  // after its fulfilment (with or without an error), RemovePendingPut (its id) just before that
  // future completes. PendingPut gives the future of a buffer still pending, so that a read of it
  // waits for nothing on the caller's thread (device_to_host.h). A buffer destroyed while pending
  // stays until its fulfilment; another buffer the plugin makes at its address meanwhile is read
  // once that fulfilment is done: late, never wrong.
  uint64_t AddPendingPut(PJRT_Buffer* buffer, Future<> fulfilled);
  void RemovePendingPut(PJRT_Buffer* buffer, uint64_t id);
  std::optional<Future<>> PendingPut(PJRT_Buffer* buffer) const;

  // The caller's buffers that ferry's reads still use after ToHostBuffer returned (an external
  // reference held on them, or a read waiting for a put's fulfilment): PJRT lets the caller
  // destroy a buffer with reads in flight ("the device memory will be freed when all async
  // operations using the buffer have completed"), but the reference lives in the handle. So
  // ferry's PJRT_Buffer_Destroy (BufferDestroy) defers the wrapped plugin's Destroy of a buffer
  // in use until its last use ends. BeginUse before the call returns; EndUse once the read no
  // longer touches the handle, which may then destroy it (on the calling thread).
  void BeginUse(PJRT_Buffer* buffer);
  void EndUse(PJRT_Buffer* buffer);
  // True (and the Destroy is deferred to the last EndUse) while `buffer` is in use.
  bool DeferDestroy(PJRT_Buffer* buffer);

  // ferry's work that still calls the wrapped plugin after a call returned (a put to fulfil, a
  // use of a caller's buffer: BeginUse), which needs the buffer's client: PJRT lets a caller
  // destroy its buffers and then its client while that work runs. ferry's PJRT_Client_Destroy
  // (ClientDestroy) first waits until none is left (it always ends: ferry's copies and the
  // plugin's computations finish on their own). Never called from the fulfilment thread, which
  // that work may need. Counted process-wide: a client's Destroy may wait for another's work.
  void BeginClientWork();
  void EndClientWork();
  void WaitForClientWork();

  // True when buffers of `client` are host memory that ferry may write and read itself: the
  // platform is "cpu" and the wrapped plugin has PJRT_Client_CreateViewOfDeviceBuffer and
  // PJRT_Buffer_OpaqueDeviceMemoryDataPointer. Asked once per client.
  bool HostAddressable(PJRT_Client* client);

 private:
  // The threads of one process: the copy engine and the fulfilment executor.
  struct ProcessWorkers {
    ProcessWorkers(uint64_t fork_generation, int num_workers)
        : fork_generation(fork_generation), engine(num_workers) {}
    const uint64_t fork_generation;  // internal::ForkGeneration() of the process that made them
    TransferEngine engine;
    SerialExecutor fulfilments;
  };

  WrappedPlugin() = default;
  static StatusOr<WrappedPlugin*> Make();
  // The workers of the calling process: those made at start-up, or in a forked child, its own,
  // made by its first call (the parent's are left as they are: their threads are not there).
  ProcessWorkers& ThisProcessWorkers();

  const pjrt::PjrtLibrary* library_ = nullptr;
  PJRT_Api* table_ = nullptr;
  std::atomic<ProcessWorkers*> workers_{nullptr};  // never freed once a child has replaced it
  std::shared_ptr<MemoryAccount> memory_;
  std::atomic<bool> alias_refused_{false};
  Mutex mutex_;
  // Client pointers may be reused by the plugin after PJRT_Client_Destroy; the answer depends
  // only on the plugin, so a stale entry is still right.
  absl::flat_hash_map<PJRT_Client*, bool> host_addressable_ ABSL_GUARDED_BY(mutex_);
  Mutex work_mutex_;
  std::condition_variable work_done_;
  int64_t client_work_ ABSL_GUARDED_BY(work_mutex_) = 0;
  uint64_t work_generation_ ABSL_GUARDED_BY(work_mutex_) = 0;  // ForkGeneration() it counts in
  void ForgetWorkOfParent() ABSL_EXCLUSIVE_LOCKS_REQUIRED(work_mutex_);
  struct BufferUse {
    int uses = 0;
    bool destroy_deferred = false;
  };
  Mutex use_mutex_;
  absl::flat_hash_map<PJRT_Buffer*, BufferUse> buffers_in_use_ ABSL_GUARDED_BY(use_mutex_);
  struct PendingPutEntry {
    uint64_t id;
    Future<> fulfilled;
  };
  mutable Mutex pending_mutex_;
  uint64_t next_pending_id_ ABSL_GUARDED_BY(pending_mutex_) = 0;
  absl::flat_hash_map<PJRT_Buffer*, PendingPutEntry> pending_puts_ ABSL_GUARDED_BY(pending_mutex_);
};

// The table ferry hands out when the wrapped plugin cannot be loaded: every entry returns an
// Unavailable error with `reason` (so the caller's PJRT_Plugin_Initialize fails with it), and the
// error entries answer ferry's errors.
const PJRT_Api* FailureTable(const Status& reason);

}  // namespace ferry::plugin
