// Sharding: a tensor split over a mesh of devices, each shard sent from a strided sub-view of the
// source (same byte strides, shifted pointer): no per-shard host copy.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/status.h"
#include "ferry/device/device.h"
#include "ferry/runtime/tensor_source.h"
#include "ferry/runtime/transfer.h"

namespace ferry {

// Devices arranged in an n-d grid with named axes. Devices are listed in row-major grid order.
// A Mesh does not own its devices (their client must outlive it). Immutable; cheap to copy.
class Mesh {
 public:
  // InvalidArgument unless the shape's product equals the device count, every axis has a name,
  // names are unique and non-empty, and no device appears twice.
  static StatusOr<Mesh> Create(std::vector<Device*> devices, std::vector<int64_t> shape,
                               std::vector<std::string> axis_names);

  const std::vector<Device*>& devices() const { return devices_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  const std::vector<std::string>& axis_names() const { return axis_names_; }
  int64_t size() const { return static_cast<int64_t>(devices_.size()); }
  // The axis called `name`, or nullopt.
  std::optional<int> AxisIndex(std::string_view name) const;
  // The grid coordinates of the device at row-major position `device_position`.
  std::vector<int64_t> Coordinates(int64_t device_position) const;

 private:
  std::vector<Device*> devices_;
  std::vector<int64_t> shape_;
  std::vector<std::string> axis_names_;
};

// The half-open range [begin, end) of one tensor dim that a shard covers.
struct DimRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const DimRange&) const = default;
};
// One range per tensor dim.
using ShardIndex = std::vector<DimRange>;

// For each tensor dim, the mesh axes it is split over (major to minor); an empty list replicates
// the tensor along that dim. Mesh axes named by no dim replicate the tensor over them. A spec may
// be shorter than the tensor's rank: the dims it does not reach are replicated (as JAX pads a
// PartitionSpec with None); a longer one is an error.
class Sharding {
 public:
  // InvalidArgument for an unknown axis or an axis used twice.
  static StatusOr<Sharding> Create(Mesh mesh, std::vector<std::vector<std::string>> spec);

  const Mesh& mesh() const { return mesh_; }
  const std::vector<std::vector<std::string>>& spec() const { return spec_; }

  // Each mesh device's shard of a tensor of `global_dims`, in the mesh's row-major device order.
  // Along a dim of size n split k ways, shard i covers [i*ceil(n/k), min((i+1)*ceil(n/k), n)):
  // trailing shards may be smaller or empty. InvalidArgument when the rank differs from the
  // spec's.
  StatusOr<std::vector<ShardIndex>> ShardIndices(absl::Span<const int64_t> global_dims) const;

 private:
  Mesh mesh_;
  std::vector<std::vector<std::string>> spec_;
  std::vector<std::vector<int>> spec_axes_;  // spec_ as axis indices
};

// The part of `view` that `index` selects: same dtype and byte strides, shifted pointer.
HostView SubView(const HostView& view, const ShardIndex& index);
MutableHostView SubView(const MutableHostView& view, const ShardIndex& index);

// For a view into a memory-mapped file (a TensorFile source): advises the kernel to read exactly
// the pages of this process's shards of `view` under `sharding`, not its usual read-around window
// past each shard's edge (which, for tensors of a few MiB, reads the other processes' shards too).
// A shard split on the leading dim is one contiguous range; a shard split on a later dim is a set
// of strided runs (one per row of the dims before it), and only the pages those runs cover are
// read. Reads are page-granular: where the gap between two runs is under a page it holds no whole
// page, so a split of rows narrower than a few pages reads nearly the whole tensor. Applies
// to row-major dense views; does nothing otherwise, or for memory that is not a file mapping.
// Advice only: the data read is the same either way. Call it before the transfer that reads the
// shards.
void AdviseExactShardReads(const HostView& view, const Sharding& sharding);

// A tensor spread over a mesh: one Data handle per mesh device (row-major mesh order). In a
// multi-process job the mesh may hold other processes' devices (Device::is_addressable() false):
// their entries in shards() are null; this process holds only its own shards.
class ShardedData {
 public:
  ShardedData(Sharding sharding, Dims global_dims, DType logical_dtype,
              std::vector<ShardIndex> indices, std::vector<DataPtr> shards)
      : sharding_(std::move(sharding)),
        global_dims_(std::move(global_dims)),
        logical_dtype_(logical_dtype),
        indices_(std::move(indices)),
        shards_(std::move(shards)) {}

  const Sharding& sharding() const { return sharding_; }
  const Dims& global_dims() const { return global_dims_; }
  DType logical_dtype() const { return logical_dtype_; }
  const std::vector<ShardIndex>& indices() const { return indices_; }
  // One per mesh device; null for a device of another process.
  const std::vector<DataPtr>& shards() const { return shards_; }
  // The non-null shards (this process's), in mesh order.
  std::vector<DataPtr> addressable_shards() const;
  // True when every mesh device belongs to this process.
  bool is_fully_addressable() const;

 private:
  Sharding sharding_;
  Dims global_dims_;
  DType logical_dtype_;
  std::vector<ShardIndex> indices_;
  std::vector<DataPtr> shards_;
};
using ShardedDataPtr = std::shared_ptr<ShardedData>;

// Sends each mesh device of this process its shard of `source`, from a strided sub-view (no host
// copy; the bytes of other processes' shards are never read). Each
// shard's transfer holds the source; it is released once, after the last shard has read it.
// `options.device_dtypes` may hold one entry (applied to every shard) or none.
StatusOr<ShardedDataPtr> TransferShardsToDevice(std::shared_ptr<const TensorSource> source,
                                                const Sharding& sharding,
                                                const TransferToDeviceOptions& options = {});

// Builds a sharded tensor from per-device sources (one per mesh device, row-major mesh order),
// each of exactly its shard's dims and of one common dtype. The entries of other processes'
// devices are ignored and may be null. `logical_dtype`, when given, is the array's dtype (needed
// when this process has no shard at all; otherwise the sources must match it).
StatusOr<ShardedDataPtr> MakeArrayFromShards(
    absl::Span<const int64_t> global_dims, const Sharding& sharding,
    absl::Span<const std::shared_ptr<const TensorSource>> per_device_sources,
    const TransferToDeviceOptions& options, std::optional<DType> logical_dtype);
StatusOr<ShardedDataPtr> MakeArrayFromShards(
    absl::Span<const int64_t> global_dims, const Sharding& sharding,
    absl::Span<const std::shared_ptr<const TensorSource>> per_device_sources,
    const TransferToDeviceOptions& options = {});

// As above, asking `shard_source(index)` for the data of each mesh device's shard (in mesh order;
// called once per device of this process, replicas included; never for another process's
// devices), e.g. to load a checkpoint shard by shard.
using ShardSourceCallback =
    std::function<StatusOr<std::shared_ptr<const TensorSource>>(const ShardIndex& index)>;
StatusOr<ShardedDataPtr> MakeArrayFromCallback(absl::Span<const int64_t> global_dims,
                                               const Sharding& sharding,
                                               const ShardSourceCallback& shard_source,
                                               const TransferToDeviceOptions& options = {});

struct LocalShard {
  Device* device = nullptr;
  ShardIndex index;
  HostTensor data;  // in the logical dtype
};

// Every shard of this process read back (every read started before any wait), in mesh order.
StatusOr<std::vector<LocalShard>> LocalShards(const ShardedData& data);

// OK when every part of the tensor has a replica on this process's devices (always in one process;
// a replicated tensor across processes); else FailedPrecondition naming the first part that lives
// only on another process's device. What AssembleShards and AssembleShardsInto check first.
Status CheckAssemblableHere(const ShardedData& data);

// The whole tensor, each distinct shard read straight into its place in one host tensor (replicas
// are read once; no intermediate copies). FailedPrecondition when a part of the tensor lies only
// on other processes' devices (read this process's part with LocalShards).
StatusOr<HostTensor> AssembleShards(const ShardedData& data);

// The same into the caller's view of the whole tensor (the global dims, any byte strides, any dtype
// the device dtypes convert to): each distinct shard is read straight into its part of `dst`
// (TransferFromDeviceInto: every check first, nothing written on a bad argument; never waits on
// the calling thread). The caller keeps `dst` alive and untouched until the future completes.
Future<> AssembleShardsInto(const ShardedData& data, const MutableHostView& dst);

}  // namespace ferry
