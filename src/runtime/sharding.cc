#include "ferry/runtime/sharding.h"

#include <algorithm>
#include <set>

#include "ferry/core/metrics.h"
#include "ferry/distributed/global_devices.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/runtime/transfer_internal.h"

namespace ferry {

StatusOr<Mesh> Mesh::Create(std::vector<Device*> devices, std::vector<int64_t> shape,
                            std::vector<std::string> axis_names) {
  if (shape.size() != axis_names.size()) {
    return InvalidArgumentError(fmt::format("mesh shape [{}] has {} axes but {} axis names",
                                            fmt::join(shape, ", "), shape.size(),
                                            axis_names.size()));
  }
  int64_t count = 1;
  for (int64_t size : shape) {
    if (size < 1) {
      return InvalidArgumentError(
          fmt::format("mesh shape [{}] has an axis smaller than 1", fmt::join(shape, ", ")));
    }
    if (__builtin_mul_overflow(count, size, &count)) {
      return InvalidArgumentError(fmt::format("mesh shape [{}] has more devices than int64 counts",
                                              fmt::join(shape, ", ")));
    }
  }
  if (count != static_cast<int64_t>(devices.size())) {
    return InvalidArgumentError(fmt::format("mesh shape [{}] needs {} devices, got {}",
                                            fmt::join(shape, ", "), count, devices.size()));
  }
  std::set<std::string> names;
  for (const std::string& name : axis_names) {
    if (name.empty() || !names.insert(name).second) {
      std::vector<std::string> quoted;
      for (const std::string& each : axis_names) quoted.push_back(fmt::format("'{}'", each));
      return InvalidArgumentError(fmt::format("mesh axis names [{}] must be non-empty and unique",
                                              fmt::join(quoted, ", ")));
    }
  }
  std::set<Device*> seen;
  for (Device* device : devices) {
    if (device == nullptr) return InvalidArgumentError("a mesh device is null");
    if (!seen.insert(device).second) {
      return InvalidArgumentError(
          fmt::format("device {} appears twice in the mesh", distributed::NameInJob(*device)));
    }
  }
  Mesh mesh;
  mesh.devices_ = std::move(devices);
  mesh.shape_ = std::move(shape);
  mesh.axis_names_ = std::move(axis_names);
  return mesh;
}

std::optional<int> Mesh::AxisIndex(std::string_view name) const {
  for (size_t i = 0; i < axis_names_.size(); ++i) {
    if (axis_names_[i] == name) return static_cast<int>(i);
  }
  return std::nullopt;
}

std::vector<int64_t> Mesh::Coordinates(int64_t device_position) const {
  std::vector<int64_t> coordinates(shape_.size());
  for (size_t axis = shape_.size(); axis-- > 0;) {
    coordinates[axis] = device_position % shape_[axis];
    device_position /= shape_[axis];
  }
  return coordinates;
}

StatusOr<Sharding> Sharding::Create(Mesh mesh, std::vector<std::vector<std::string>> spec) {
  Sharding sharding;
  std::set<int> used;
  for (size_t dim = 0; dim < spec.size(); ++dim) {
    std::vector<int> axes;
    for (const std::string& name : spec[dim]) {
      std::optional<int> axis = mesh.AxisIndex(name);
      if (!axis.has_value()) {
        return InvalidArgumentError(
            fmt::format("sharding names mesh axis '{}' for dim {}, but the mesh's axes are [{}]",
                        name, dim, fmt::join(mesh.axis_names(), ", ")));
      }
      if (!used.insert(*axis).second) {
        return InvalidArgumentError(
            fmt::format("sharding uses mesh axis '{}' more than once", name));
      }
      axes.push_back(*axis);
    }
    sharding.spec_axes_.push_back(std::move(axes));
  }
  sharding.mesh_ = std::move(mesh);
  sharding.spec_ = std::move(spec);
  return sharding;
}

StatusOr<std::vector<ShardIndex>> Sharding::ShardIndices(
    absl::Span<const int64_t> global_dims) const {
  if (global_dims.size() < spec_.size()) {
    return InvalidArgumentError(
        fmt::format("sharding spec has {} entries but the tensor has rank {} (a spec may be "
                    "shorter than the rank, its missing dims replicated, never longer)",
                    spec_.size(), global_dims.size()));
  }
  std::vector<ShardIndex> indices;
  indices.reserve(mesh_.size());
  for (int64_t position = 0; position < mesh_.size(); ++position) {
    const std::vector<int64_t> coordinates = mesh_.Coordinates(position);
    ShardIndex index(global_dims.size());
    for (size_t dim = 0; dim < global_dims.size(); ++dim) {
      const int64_t n = global_dims[dim];
      if (n < 0) return InvalidArgumentError(fmt::format("dim {} is negative ({})", dim, n));
      int64_t ways = 1;
      int64_t shard = 0;
      if (dim < spec_axes_.size()) {        // dims past the spec's end are replicated
        for (int axis : spec_axes_[dim]) {  // major to minor
          shard = shard * mesh_.shape()[axis] + coordinates[axis];
          ways *= mesh_.shape()[axis];
        }
      }
      // ceil(n / ways), and each bound clamped to n, without overflow for n near 2^63.
      const int64_t chunk = n / ways + (n % ways != 0 ? 1 : 0);
      int64_t begin = 0;
      if (__builtin_mul_overflow(shard, chunk, &begin) || begin > n) begin = n;
      index[dim] = DimRange{begin, begin + std::min(chunk, n - begin)};
    }
    indices.push_back(std::move(index));
  }
  return indices;
}

namespace {

template <typename View>
View SubViewImpl(const View& view, const ShardIndex& index) {
  View sub = view;
  int64_t offset = 0;
  bool empty = false;
  for (size_t dim = 0; dim < index.size(); ++dim) {
    sub.dims[dim] = index[dim].size();
    empty |= sub.dims[dim] == 0;
    offset += index[dim].begin * view.byte_strides[dim];
  }
  // An empty shard addresses nothing: keep the original pointer rather than one past the end.
  if (!empty) {
    using Byte = std::conditional_t<std::is_same_v<View, HostView>, const std::byte, std::byte>;
    sub.data = static_cast<Byte*>(view.data) + offset;
  }
  return sub;
}

Status CheckOptions(const TransferToDeviceOptions& options) {
  if (options.device_dtypes.size() > 1) {
    return InvalidArgumentError("sharded transfers take at most one device dtype");
  }
  return OkStatus();
}

// Sends `sources[i]` to mesh device i; all or nothing. `one_source`: every source is a part of
// one tensor, so shards of equal index hold equal data (replicas may be copied from each other).
StatusOr<ShardedDataPtr> SendShards(absl::Span<const int64_t> global_dims, const Sharding& sharding,
                                    std::vector<ShardIndex> indices, DType logical_dtype,
                                    absl::Span<const std::shared_ptr<const TensorSource>> sources,
                                    const TransferToDeviceOptions& options, bool one_source) {
  FERRY_RETURN_IF_ERROR(CheckOptions(options));
  ScopedTimer timer(metrics::TransferToDeviceTime());
  // Every shard is started before any is waited for: the devices fill in parallel.
  const std::optional<DType> device_dtype =
      options.device_dtypes.empty() ? std::nullopt : options.device_dtypes[0];
  // Only this process's devices get a transfer; another process's entries stay null. A replica
  // (the same part of the tensor as an earlier shard) whose device can take a copy from the first
  // one's device directly (Device::CopiesBuffersTo: an accelerator's peer copy) is copied there
  // once the first one has arrived, instead of being uploaded again. Only when the call waits
  // anyway (kImmutableOnlyDuringCall): the copy starts after the first upload.
  const bool copy_replicas = one_source &&
                             options.semantics == HostBufferSemantics::kImmutableOnlyDuringCall &&
                             options.memory_kind.empty();
  std::vector<internal::DeviceTransfer> transfers;
  std::vector<size_t> positions;
  std::vector<std::pair<size_t, size_t>> replicas;  // (shard, the earlier shard it copies)
  transfers.reserve(sources.size());
  for (size_t i = 0; i < sources.size(); ++i) {
    Device* device = sharding.mesh().devices()[i];
    if (!device->is_addressable()) continue;
    if (copy_replicas) {
      auto first = std::find_if(positions.begin(), positions.end(), [&](size_t j) {
        const Device* origin = sharding.mesh().devices()[j];
        return indices[j] == indices[i] && origin->CopiesBuffersTo(device) &&
               origin->capabilities().dtypes == device->capabilities().dtypes;
      });
      if (first != positions.end()) {
        replicas.emplace_back(i, *first);
        continue;
      }
    }
    transfers.push_back({sources[i], device, device_dtype, options.memory_kind});
    positions.push_back(i);
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<DataPtr> started,
                         internal::StartTransfers(transfers, options.semantics));
  std::vector<DataPtr> shards(sources.size());
  for (size_t k = 0; k < positions.size(); ++k) shards[positions[k]] = std::move(started[k]);
  for (const auto& [replica, origin] : replicas) {
    const Data& first = *shards[origin];
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Buffer> copy,
                           first.buffer().CopyToDevice(sharding.mesh().devices()[replica]));
    metrics::ReplicaDeviceCopies()->Add();
    // A copy is only as good as what it copies: its Ready() waits for the first's too.
    shards[replica] = std::make_shared<Data>(std::move(copy), first.logical_dtype(),
                                             sources[replica]->name(), first.Ready());
  }
  return std::make_shared<ShardedData>(sharding, Dims(global_dims.begin(), global_dims.end()),
                                       logical_dtype, std::move(indices), std::move(shards));
}

}  // namespace

HostView SubView(const HostView& view, const ShardIndex& index) { return SubViewImpl(view, index); }
MutableHostView SubView(const MutableHostView& view, const ShardIndex& index) {
  return SubViewImpl(view, index);
}

StatusOr<ShardedDataPtr> TransferShardsToDevice(std::shared_ptr<const TensorSource> source,
                                                const Sharding& sharding,
                                                const TransferToDeviceOptions& options) {
  if (source == nullptr) return InvalidArgumentError("TransferShardsToDevice: null source");
  const HostView& view = source->view();
  FERRY_ASSIGN_OR_RETURN(std::vector<ShardIndex> indices, sharding.ShardIndices(view.dims));
  FERRY_ASSIGN_OR_RETURN(AddressedBytes addressed, view.ComputeAddressedBytes(source->name()));
  const auto* region = static_cast<const std::byte*>(view.data) + addressed.begin;
  std::vector<std::shared_ptr<const TensorSource>> shard_sources(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    if (!sharding.mesh().devices()[i]->is_addressable()) continue;  // another process's shard
    // Each shard borrows the source's memory and keeps the source itself alive: the source goes
    // when the last shard's transfer drops its reference.
    FERRY_ASSIGN_OR_RETURN(
        auto shard_source,
        TensorSource::Borrow(SubView(view, indices[i]), region, addressed.end - addressed.begin,
                             source, fmt::format("{}[shard {}]", source->name(), i)));
    shard_sources[i] = std::move(shard_source);
  }
  const DType dtype = view.dtype;
  source.reset();
  return SendShards(view.dims, sharding, std::move(indices), dtype, shard_sources, options,
                    /*one_source=*/true);
}

StatusOr<ShardedDataPtr> MakeArrayFromShards(
    absl::Span<const int64_t> global_dims, const Sharding& sharding,
    absl::Span<const std::shared_ptr<const TensorSource>> per_device_sources,
    const TransferToDeviceOptions& options) {
  return MakeArrayFromShards(global_dims, sharding, per_device_sources, options, std::nullopt);
}

StatusOr<ShardedDataPtr> MakeArrayFromShards(
    absl::Span<const int64_t> global_dims, const Sharding& sharding,
    absl::Span<const std::shared_ptr<const TensorSource>> per_device_sources,
    const TransferToDeviceOptions& options, std::optional<DType> logical_dtype) {
  FERRY_ASSIGN_OR_RETURN(std::vector<ShardIndex> indices, sharding.ShardIndices(global_dims));
  if (per_device_sources.size() != indices.size()) {
    return InvalidArgumentError(fmt::format("the mesh has {} devices but {} shards were given",
                                            indices.size(), per_device_sources.size()));
  }
  std::optional<DType> dtype = logical_dtype;
  for (size_t i = 0; i < indices.size(); ++i) {
    if (!sharding.mesh().devices()[i]->is_addressable()) continue;  // another process's shard
    const std::shared_ptr<const TensorSource>& shard = per_device_sources[i];
    const std::string device_name(sharding.mesh().devices()[i]->name());
    if (shard == nullptr) {
      return InvalidArgumentError(fmt::format(
          "shard {} (for {}, a device of this process) is missing: give an array for every "
          "device this process addresses (None only for other processes' devices)",
          i, device_name));
    }
    Dims expected;
    for (const DimRange& range : indices[i]) expected.push_back(range.size());
    if (shard->view().dims != expected) {
      // A source named for its position says nothing more; another name (a file's tensor) does.
      const std::string named = shard->name() == fmt::format("shard {}", i)
                                    ? std::string()
                                    : fmt::format(" ('{}')", shard->name());
      return InvalidArgumentError(
          fmt::format("shard {}{} for {} has dims [{}] but its index needs [{}]", i, named,
                      device_name, fmt::join(shard->view().dims, ", "), fmt::join(expected, ", ")));
    }
    if (dtype.has_value() && shard->view().dtype != *dtype) {
      return InvalidArgumentError(fmt::format("shard {} is {} but the array is {}", i,
                                              DTypeName(shard->view().dtype), DTypeName(*dtype)));
    }
    dtype = shard->view().dtype;
  }
  return SendShards(global_dims, sharding, std::move(indices), dtype.value_or(DType::kF32),
                    per_device_sources, options, /*one_source=*/false);
}

StatusOr<ShardedDataPtr> MakeArrayFromCallback(absl::Span<const int64_t> global_dims,
                                               const Sharding& sharding,
                                               const ShardSourceCallback& shard_source,
                                               const TransferToDeviceOptions& options) {
  FERRY_ASSIGN_OR_RETURN(std::vector<ShardIndex> indices, sharding.ShardIndices(global_dims));
  std::vector<std::shared_ptr<const TensorSource>> sources(indices.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    if (!sharding.mesh().devices()[i]->is_addressable()) continue;  // another process's shard
    FERRY_ASSIGN_OR_RETURN(sources[i], shard_source(indices[i]));
  }
  return MakeArrayFromShards(global_dims, sharding, sources, options);
}

std::vector<DataPtr> ShardedData::addressable_shards() const {
  std::vector<DataPtr> local;
  for (const DataPtr& shard : shards_) {
    if (shard != nullptr) local.push_back(shard);
  }
  return local;
}

bool ShardedData::is_fully_addressable() const {
  return std::all_of(shards_.begin(), shards_.end(),
                     [](const DataPtr& shard) { return shard != nullptr; });
}

StatusOr<std::vector<LocalShard>> LocalShards(const ShardedData& data) {
  std::vector<size_t> positions;
  for (size_t i = 0; i < data.shards().size(); ++i) {
    if (data.shards()[i] != nullptr) positions.push_back(i);
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> tensors,
                         TransferFromDevice(data.addressable_shards()));
  std::vector<LocalShard> shards;
  shards.reserve(tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) {
    const size_t i = positions[k];
    shards.push_back(
        LocalShard{data.shards()[i]->device(), data.indices()[i], std::move(tensors[k])});
  }
  return shards;
}

Status CheckAssemblableHere(const ShardedData& data) {
  for (size_t i = 0; i < data.shards().size(); ++i) {
    if (data.shards()[i] != nullptr) continue;
    const ShardIndex& index = data.indices()[i];
    bool held_here = false;
    for (size_t j = 0; j < data.shards().size() && !held_here; ++j) {
      held_here = data.shards()[j] != nullptr && data.indices()[j] == index;
    }
    if (!held_here) {
      std::vector<std::string> ranges;
      for (const DimRange& range : index)
        ranges.push_back(fmt::format("{}:{}", range.begin, range.end));
      return FailedPreconditionError(fmt::format(
          "shard {} [{}] lives only on device {} of another process: this process can read "
          "only its own shards (addressable shards)",
          i, fmt::join(ranges, ", "),
          distributed::NameInJob(*data.sharding().mesh().devices()[i])));
    }
  }
  return OkStatus();
}

namespace {

// The shards to read to assemble the tensor here: for each distinct index, the first of this
// process's shards that holds it (another process's shards are null; replicas are read once).
std::vector<size_t> ShardsToRead(const ShardedData& data) {
  std::vector<size_t> chosen;
  std::vector<ShardIndex> done;
  for (size_t i = 0; i < data.shards().size(); ++i) {
    if (data.shards()[i] == nullptr) continue;  // another process's: a local replica is read
    const ShardIndex& index = data.indices()[i];
    if (std::find(done.begin(), done.end(), index) != done.end()) continue;  // a replica
    done.push_back(index);
    chosen.push_back(i);
  }
  return chosen;
}

}  // namespace

StatusOr<HostTensor> AssembleShards(const ShardedData& data) {
  // Every part of the tensor must have a replica here before any memory is allocated.
  FERRY_RETURN_IF_ERROR(CheckAssemblableHere(data));
  ScopedTimer timer(metrics::TransferFromDeviceTime());
  // Owns `whole`: every read writes into it, and none may outlive it, whatever path returns.
  internal::PendingReads pending;
  FERRY_ASSIGN_OR_RETURN(HostTensor allocated,
                         HostTensor::Allocate(data.logical_dtype(), data.global_dims()));
  const MutableHostView whole_view = pending.Hold(std::move(allocated)).mutable_view();
  const std::vector<size_t> read_shards = ShardsToRead(data);
  for (size_t i : read_shards) {
    pending.Add(data.shards()[i]->ToHost(SubView(whole_view, data.indices()[i])));
  }
  const std::vector<Status> statuses = pending.AwaitAll();
  Status first_error;
  for (size_t r = 0; r < statuses.size(); ++r) {
    const Status& status = statuses[r];
    if (!status.ok() && first_error.ok()) {
      first_error =
          Status(status.code(),
                 fmt::format("assembling shard {} ('{}'): {}", read_shards[r],
                             data.shards()[read_shards[r]]->name(), std::string(status.message())));
    }
  }
  if (!first_error.ok()) return first_error;
  HostTensor whole = std::move(pending.TakeTensors().front());
  metrics::InboundData()->AddSample(static_cast<double>(whole.size_bytes()));
  return whole;
}

Future<> AssembleShardsInto(const ShardedData& data, const MutableHostView& dst) {
  if (Status here = CheckAssemblableHere(data); !here.ok()) return Future<>::Ready(here);
  if (dst.dims != data.global_dims()) {
    return Future<>::Ready(InvalidArgumentError(
        fmt::format("AssembleShardsInto: destination dims [{}] differ from the tensor's [{}]",
                    fmt::join(dst.dims, ","), fmt::join(data.global_dims(), ","))));
  }
  if (Status valid = dst.ComputeAddressedBytes("destination").status(); !valid.ok()) {
    return Future<>::Ready(valid);
  }
  std::vector<DataPtr> shards;
  std::vector<MutableHostView> parts;
  for (size_t i : ShardsToRead(data)) {
    shards.push_back(data.shards()[i]);
    parts.push_back(SubView(dst, data.indices()[i]));
  }
  return TransferFromDeviceInto(shards, parts);
}

}  // namespace ferry
