// Global devices (JAX's model): the devices of every process of a job, each with a global id and
// the index of the process that owns it. This process's devices are its own clients' `Device`s;
// another process's devices are `RemoteDevice`s: descriptions that a `Mesh` may hold and a
// sharding may place shards on, but that this process never sends to or reads from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/status.h"
#include "ferry/device/device.h"
#include "ferry/distributed/process_group.h"

namespace ferry::distributed {

// A device of another process. `client()` is null: it cannot be transferred to or read here;
// `is_addressable()` is false. Owned by the GlobalDevices that made it.
class RemoteDevice final : public Device {
 public:
  RemoteDevice(int process_index, int index, std::string name, std::string backend,
               std::string description, DeviceCapabilities capabilities)
      : process_index_(process_index),
        index_(index),
        name_(std::move(name)),
        backend_(std::move(backend)),
        description_(std::move(description)),
        capabilities_(capabilities) {}

  Client* client() const override { return nullptr; }
  int index() const override { return index_; }
  const std::string& name() const override { return name_; }
  const DeviceCapabilities& capabilities() const override { return capabilities_; }
  int64_t bytes_in_use() const override { return 0; }
  std::string description() const override { return description_; }
  bool is_addressable() const override { return false; }

  int process_index() const { return process_index_; }
  const std::string& backend() const { return backend_; }

 private:
  int process_index_;
  int index_;
  std::string name_;
  std::string backend_;
  std::string description_;
  DeviceCapabilities capabilities_;
};

// Every process's devices of one backend, in process order (then each process's device order):
// the position in `devices()` is the device's global id.
class GlobalDevices {
 public:
  // Collective: every rank passes its own devices of `backend` (all of one client); the group
  // all-gathers their descriptions (name, index, capabilities, description). The local devices
  // keep their pointers; the others become RemoteDevices owned by the result. Errors: the
  // group's collective errors; InvalidArgument (on every rank) when ranks name different backends.
  static StatusOr<std::shared_ptr<const GlobalDevices>> Gather(ProcessGroup& group,
                                                               std::string_view backend,
                                                               absl::Span<Device* const> local);

  // Non-owning; valid while this object lives (local ones: while their client lives).
  const std::vector<Device*>& devices() const { return devices_; }
  // This process's devices, in their client's order.
  std::vector<Device*> local_devices() const;
  // The process that owns `device`, and its global id; -1 for a device not in this table.
  int ProcessIndexOf(const Device* device) const;
  int64_t GlobalIdOf(const Device* device) const;
  // `device`'s name in the job. In a job of one process, its own name ("host:0"). With several
  // processes, where every process names its devices from 0, its process first: "p1/host:0" is
  // process 1's host:0 (the same name on every rank). Empty for a device not in this table.
  // (NameInJob below gives the same name without a table.)
  std::string NameOf(const Device* device) const;
  int process_count() const { return process_count_; }
  int process_index() const { return process_index_; }

 private:
  GlobalDevices() = default;
  std::vector<Device*> devices_;
  std::vector<int> process_of_;  // per global id
  std::vector<std::unique_ptr<RemoteDevice>> remote_;
  int process_count_ = 1;
  int process_index_ = 0;
};

// `device`'s name in the job, as GlobalDevices::NameOf gives it, for code that holds a device but
// no table (a mesh's error messages, Python's Device repr): "p1/host:0" for another process's
// device (a RemoteDevice) and, while the process-wide group (CurrentProcessGroup) has several
// processes, for this process's own ("p0/host:0" on rank 0); else the device's own name, so a
// single-process program sees "host:0" as before.
std::string NameInJob(const Device& device);

}  // namespace ferry::distributed
