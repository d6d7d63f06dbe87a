#include "device_queues.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/tensor_source.h"
#include "ferry/runtime/transfer.h"
#include "fmt/format.h"
#include "nlohmann/json.hpp"

namespace ferry::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

// One device's share: its float32 source (filled once, so that the reads are of real data) and the
// float32 destination its read converts back into.
struct DeviceWork {
  Device* device = nullptr;
  std::shared_ptr<const TensorSource> source;
  HostTensor destination;
};

// Starts a staged put on each of `work` (asynchronously, from this thread) and waits for all.
StatusOr<std::vector<DataPtr>> PutAll(const std::vector<DeviceWork*>& work) {
  TransferToDeviceOptions options;
  options.semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  options.device_dtypes = {DType::kBF16};
  std::vector<DataPtr> handles;
  for (DeviceWork* each : work) {
    FERRY_ASSIGN_OR_RETURN(std::vector<DataPtr> put,
                           TransferToDevice({each->source}, each->device, options));
    handles.push_back(std::move(put.front()));
  }
  FERRY_RETURN_IF_ERROR(AwaitReady(handles));
  return handles;
}

// Reads every handle back into its float32 destination at once and waits.
Status ReadAll(const std::vector<DeviceWork*>& work, const std::vector<DataPtr>& handles) {
  std::vector<MutableHostView> destinations;
  for (DeviceWork* each : work) destinations.push_back(each->destination.mutable_view());
  return TransferFromDeviceInto(handles, destinations).Await();
}

struct Timings {
  std::vector<double> put_one, put_all, read_one, read_all, dense_serial, dense_queued;
};

// Reads queued on one device: kQueuedReads dense float32 reads of one buffer (no conversion: the
// plugin's ToHostBuffer straight into each destination), one after the other (each waited for)
// and all started at once, then waited for together.
constexpr int kQueuedReads = 8;

struct QueuedReads {
  DataPtr handle;
  std::vector<HostTensor> destinations;
};

StatusOr<QueuedReads> PrepareQueuedReads(const DeviceWork& first, int64_t bytes) {
  const int64_t elements = std::max<int64_t>(1, bytes / 4);
  const auto* values = static_cast<const float*>(first.source->view().data);
  FERRY_ASSIGN_OR_RETURN(HostTensor source, HostTensor::Allocate(DType::kF32, {elements}));
  std::memcpy(source.data(), values, static_cast<size_t>(elements * 4));
  TransferToDeviceOptions options;
  options.semantics = HostBufferSemantics::kImmutableOnlyDuringCall;
  FERRY_ASSIGN_OR_RETURN(
      std::vector<DataPtr> put,
      TransferToDevice({TensorSource::FromHostTensor(std::move(source), "dense")}, first.device,
                       options));
  FERRY_RETURN_IF_ERROR(AwaitReady(put));
  QueuedReads reads{.handle = put.front(), .destinations = {}};
  for (int i = 0; i < kQueuedReads; ++i) {
    FERRY_ASSIGN_OR_RETURN(HostTensor destination, HostTensor::Allocate(DType::kF32, {elements}));
    std::memset(destination.data(), 0, static_cast<size_t>(destination.size_bytes()));
    reads.destinations.push_back(std::move(destination));
  }
  return reads;
}

Status TimeQueuedReads(QueuedReads& reads, Timings& timings) {
  Clock::time_point start = Clock::now();
  for (HostTensor& destination : reads.destinations) {
    FERRY_RETURN_IF_ERROR(
        TransferFromDeviceInto({reads.handle}, {destination.mutable_view()}).Await());
  }
  timings.dense_serial.push_back(SecondsSince(start));
  start = Clock::now();
  std::vector<Future<>> started;
  for (HostTensor& destination : reads.destinations) {
    started.push_back(TransferFromDeviceInto({reads.handle}, {destination.mutable_view()}));
  }
  FERRY_RETURN_IF_ERROR(JoinFutures(started).Await());
  timings.dense_queued.push_back(SecondsSince(start));
  return OkStatus();
}

// Puts on each device of `group` and reads them back, appending each phase's time.
Status TimeGroup(const std::vector<DeviceWork*>& group, std::vector<double>& put_times,
                 std::vector<double>& read_times) {
  Clock::time_point start = Clock::now();
  FERRY_ASSIGN_OR_RETURN(std::vector<DataPtr> handles, PutAll(group));
  put_times.push_back(SecondsSince(start));
  start = Clock::now();
  FERRY_RETURN_IF_ERROR(ReadAll(group, handles));
  read_times.push_back(SecondsSince(start));
  return OkStatus();
}

// One repeat: device 0 alone, then every device at once (interleaved, so that both see the same
// machine).
Status TimeOnce(std::vector<DeviceWork>& work, Timings& timings) {
  std::vector<DeviceWork*> all;
  for (DeviceWork& each : work) all.push_back(&each);
  FERRY_RETURN_IF_ERROR(TimeGroup({all.front()}, timings.put_one, timings.read_one));
  return TimeGroup(all, timings.put_all, timings.read_all);
}

StatusOr<std::vector<DeviceWork>> PrepareWork(Client& client, const DeviceQueuesOptions& options) {
  if (static_cast<int>(client.devices().size()) < options.devices) {
    return FailedPreconditionError(fmt::format("{} has {} devices, {} wanted", options.backend,
                                               client.devices().size(), options.devices));
  }
  const int64_t elements = std::max<int64_t>(1, options.bytes_per_device / 4);
  std::vector<DeviceWork> work(options.devices);
  for (int i = 0; i < options.devices; ++i) {
    FERRY_ASSIGN_OR_RETURN(HostTensor source, HostTensor::Allocate(DType::kF32, {elements}));
    auto* values = reinterpret_cast<float*>(source.data());
    for (int64_t j = 0; j < elements; ++j) values[j] = static_cast<float>((j * 7 + i) % 1000);
    work[i].device = client.devices()[i];
    work[i].source = TensorSource::FromHostTensor(std::move(source), fmt::format("x{}", i));
    FERRY_ASSIGN_OR_RETURN(work[i].destination, HostTensor::Allocate(DType::kF32, {elements}));
  }
  return work;
}

}  // namespace

int RunDeviceQueues(const DeviceQueuesOptions& options) {
  ClientOptions client_options;
  client_options.num_devices = options.devices;
  client_options.pjrt_direct_host_access = false;  // the staged paths, as on a GPU
  StatusOr<std::unique_ptr<Client>> client = CreateClient(options.backend, client_options);
  if (!client.ok()) {
    std::fprintf(stderr, "device queues: %s\n", client.status().ToString().c_str());
    return 1;
  }
  StatusOr<std::vector<DeviceWork>> work = PrepareWork(**client, options);
  StatusOr<QueuedReads> queued =
      work.ok() ? PrepareQueuedReads(work->front(), options.bytes_per_device / kQueuedReads)
                : StatusOr<QueuedReads>(work.status());
  // An untimed first run makes the staging chunks and threads.
  Timings warm_up;
  Status status = queued.ok() ? TimeOnce(*work, warm_up) : queued.status();
  if (status.ok()) status = TimeQueuedReads(*queued, warm_up);
  Timings timings;
  for (int repeat = 0; status.ok() && repeat < options.repeats; ++repeat) {
    status = TimeOnce(*work, timings);
    if (status.ok()) status = TimeQueuedReads(*queued, timings);
  }
  if (!status.ok()) {
    std::fprintf(stderr, "device queues: %s\n", status.ToString().c_str());
    return 1;
  }
  const double mib = static_cast<double>(options.bytes_per_device) / (1 << 20);
  const int n = options.devices;
  const double put_one = Median(timings.put_one), put_all = Median(timings.put_all);
  const double read_one = Median(timings.read_one), read_all = Median(timings.read_all);
  // Throughput of n devices at once over one device's: n transfers in put_all against one in
  // put_one (1.0: the devices queue behind one another; n: they run fully side by side).
  const double put_scaling = n * put_one / put_all;
  const double read_scaling = n * read_one / read_all;
  fmt::print(
      "device queues: {} {:.0f} MiB float32 per device, stored as bfloat16 (staged),\n"
      "medians of {}\n",
      options.backend, mib, options.repeats);
  fmt::print("{:<28}{:>14}{:>18}{:>12}\n", "transfer", "one device", fmt::format("{} at once", n),
             "scaling");
  fmt::print("{:<28}{:>11.1f} ms{:>15.1f} ms{:>11.2f}x\n", "staged put (f32 -> bf16)",
             put_one * 1e3, put_all * 1e3, put_scaling);
  fmt::print("{:<28}{:>11.1f} ms{:>15.1f} ms{:>11.2f}x\n", "staged read (bf16 -> f32)",
             read_one * 1e3, read_all * 1e3, read_scaling);
  nlohmann::ordered_json json = {{"case", "device_queues"},
                                 {"backend", options.backend},
                                 {"devices", n},
                                 {"bytes_per_device", options.bytes_per_device},
                                 {"repeats", options.repeats},
                                 {"put_one_seconds_median", put_one},
                                 {"put_all_seconds_median", put_all},
                                 {"put_scaling", put_scaling},
                                 {"read_one_seconds_median", read_one},
                                 {"read_all_seconds_median", read_all},
                                 {"read_scaling", read_scaling}};
  const double dense_serial = Median(timings.dense_serial);
  const double dense_queued = Median(timings.dense_queued);
  fmt::print(
      "dense reads on one device, {} of {:.0f} MiB float32:\n"
      "  one after the other {:.1f} ms, all queued at once {:.1f} ms ({:.2f}x)\n",
      kQueuedReads, mib / kQueuedReads, dense_serial * 1e3, dense_queued * 1e3,
      dense_serial / dense_queued);
  json["dense_reads_queued"] = kQueuedReads;
  json["dense_read_bytes"] = options.bytes_per_device / kQueuedReads;
  json["dense_serial_seconds_median"] = dense_serial;
  json["dense_queued_seconds_median"] = dense_queued;
  json["dense_queued_speedup"] = dense_serial / dense_queued;
  fmt::print("{}\n", json.dump());
  if (!options.json_path.empty()) std::ofstream(options.json_path) << json.dump(2) << "\n";
  return 0;
}

}  // namespace ferry::bench
