#include "ferry/distributed/global_devices.h"

#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ferry::distributed {

StatusOr<std::shared_ptr<const GlobalDevices>> GlobalDevices::Gather(
    ProcessGroup& group, std::string_view backend, absl::Span<Device* const> local) {
  nlohmann::json mine;
  mine["backend"] = std::string(backend);
  mine["devices"] = nlohmann::json::array();
  for (const Device* device : local) {
    const DeviceCapabilities& capabilities = device->capabilities();
    mine["devices"].push_back({{"index", device->index()},
                               {"name", device->name()},
                               {"description", device->description()},
                               {"dtypes", capabilities.dtypes.to_string()},
                               {"memory_limit", capabilities.memory_limit_bytes.value_or(-1)},
                               {"max_buffer", capabilities.max_buffer_bytes.value_or(-1)}});
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> all,
                         group.AllGather(mine.dump(), fmt::format("global_devices({})", backend)));
  std::shared_ptr<GlobalDevices> result(new GlobalDevices());
  result->process_count_ = group.size();
  result->process_index_ = group.rank();
  const nlohmann::json first = nlohmann::json::parse(all[0], nullptr, false);
  for (size_t rank = 0; rank < all.size(); ++rank) {
    const nlohmann::json theirs = nlohmann::json::parse(all[rank], nullptr, false);
    if (theirs.is_discarded() || !theirs.contains("devices")) {
      return absl::InternalError(fmt::format("rank {} sent a malformed device list", rank));
    }
    // Compared with rank 0's, so that every rank finds the same first difference.
    if (first.is_discarded() || theirs["backend"] != first["backend"]) {
      return InvalidArgumentError(fmt::format(
          "global_devices: rank {} lists backend {} while rank 0 lists {}", rank,
          theirs["backend"].dump(), first.is_discarded() ? "?" : first["backend"].dump()));
    }
    if (static_cast<int>(rank) == group.rank()) {
      for (Device* device : local) {
        result->devices_.push_back(device);
        result->process_of_.push_back(static_cast<int>(rank));
      }
      continue;
    }
    for (const nlohmann::json& entry : theirs["devices"]) {
      DeviceCapabilities capabilities;
      capabilities.dtypes = decltype(capabilities.dtypes)(entry["dtypes"].get<std::string>());
      if (int64_t limit = entry["memory_limit"].get<int64_t>(); limit >= 0) {
        capabilities.memory_limit_bytes = limit;
      }
      if (int64_t limit = entry["max_buffer"].get<int64_t>(); limit >= 0) {
        capabilities.max_buffer_bytes = limit;
      }
      auto remote = std::make_unique<RemoteDevice>(
          static_cast<int>(rank), entry["index"].get<int>(), entry["name"].get<std::string>(),
          std::string(backend), entry["description"].get<std::string>(), capabilities);
      result->devices_.push_back(remote.get());
      result->process_of_.push_back(static_cast<int>(rank));
      result->remote_.push_back(std::move(remote));
    }
  }
  return std::shared_ptr<const GlobalDevices>(std::move(result));
}

std::vector<Device*> GlobalDevices::local_devices() const {
  std::vector<Device*> local;
  for (size_t id = 0; id < devices_.size(); ++id) {
    if (process_of_[id] == process_index_) local.push_back(devices_[id]);
  }
  return local;
}

int GlobalDevices::ProcessIndexOf(const Device* device) const {
  const int64_t id = GlobalIdOf(device);
  return id < 0 ? -1 : process_of_[static_cast<size_t>(id)];
}

namespace {
// The name of process `process`'s `device` in a job of several processes.
std::string WithProcess(int process, const Device& device) {
  return fmt::format("p{}/{}", process, device.name());
}
}  // namespace

std::string GlobalDevices::NameOf(const Device* device) const {
  const int process = ProcessIndexOf(device);
  if (process < 0) return "";
  return process_count_ == 1 ? device->name() : WithProcess(process, *device);
}

std::string NameInJob(const Device& device) {
  if (const auto* remote = dynamic_cast<const RemoteDevice*>(&device)) {
    return WithProcess(remote->process_index(), device);
  }
  const ProcessGroup& group = CurrentProcessGroup();
  return group.size() == 1 ? device.name() : WithProcess(group.rank(), device);
}

int64_t GlobalDevices::GlobalIdOf(const Device* device) const {
  for (size_t id = 0; id < devices_.size(); ++id) {
    if (devices_[id] == device) return static_cast<int64_t>(id);
  }
  return -1;
}

}  // namespace ferry::distributed
