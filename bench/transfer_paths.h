// The ways ferry-bench runs a case's transfer: ferry's own path, and the old staged path written
// out by hand as the baseline.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ferry/core/dtype.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/status.h"
#include "ferry/device/device.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/tensor_source.h"
#include "ferry/runtime/transfer.h"

namespace ferry::bench {

// Every h2d transfer of the benchmark, on both paths.
inline constexpr HostBufferSemantics kBenchSemantics =
    HostBufferSemantics::kImmutableOnlyDuringCall;

// One way of doing a case's transfer. Run() is what is timed; its results (device data, or
// returned host tensors) stay alive until Release(), so that the memory they hold can be told
// apart from the extra memory the run needed on the side. Not thread-safe.
class Path {
 public:
  virtual ~Path() = default;
  // One full transfer, including waiting until it is complete.
  virtual Status Run() = 0;
  // Bytes of the host tensors the last Run() returned to its caller (d2h; 0 for h2d).
  virtual int64_t ResultHostBytes() const { return 0; }
  // Bytes of device memory the last Run() left allocated on the host heap that no device's
  // bytes_in_use() counts: a CPU PJRT plugin's own buffers (pjrt_paths.h); 0 for ferry's paths.
  virtual int64_t ResultUncountedDeviceBytes() const { return 0; }
  // The last Run()'s results on the host, for the correctness check: for h2d the device data
  // read back in the device dtype; for d2h the returned tensors (moved out).
  virtual StatusOr<std::vector<HostTensor>> TakeResultsOnHost() = 0;
  // Frees the last Run()'s results.
  virtual void Release() = 0;
};

// A path whose results are device handles (`handles_`, set by Run): read back in the device dtype
// for the correctness check, freed by Release.
class DeviceHandlesPath : public Path {
 public:
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    return TransferFromDevice(handles_, {.in_device_dtype = true});
  }
  void Release() override { handles_.clear(); }

 protected:
  std::vector<DataPtr> handles_;
};

// TransferToDevice(sources, device, options) then AwaitReady.
std::unique_ptr<Path> MakeH2DFerryPath(std::vector<std::shared_ptr<const TensorSource>> sources,
                                       Device* device, TransferToDeviceOptions options);

// The old path ("staged" in bench/README.md): per source, a fresh dense temporary of
// `device_dtypes[i]` (plain heap memory allocated every run, not ferry's cached HostTensor memory),
// filled on the calling thread by the old copy-convert (row by row, the portable kernel, no
// tiles); then TransferToDevice of the temporaries with the same device dtypes, AwaitReady, and
// the temporaries freed before Run() returns.
std::unique_ptr<Path> MakeH2DStagedPath(std::vector<std::shared_ptr<const TensorSource>> sources,
                                        Device* device, std::vector<DType> device_dtypes);

// TransferFromDevice(data): each tensor in its logical dtype.
std::unique_ptr<Path> MakeD2HFerryPath(std::vector<DataPtr> data);

// CopyToDevice(data, target) then AwaitReady.
std::unique_ptr<Path> MakeD2DFerryPath(std::vector<DataPtr> data, Device* target);
// The old default of Buffer::CopyToDevice: wait for the data, read it into host tensors in the
// device dtype, put those on `target` with kImmutableOnlyDuringCall, AwaitReady.
std::unique_ptr<Path> MakeD2DStagedPath(std::vector<DataPtr> data, Device* target);

// The old path: TransferFromDevice in the device dtype, then a fresh temporary of the logical
// dtype filled by the old copy-convert on the calling thread (a plain copy when the dtypes are
// equal); the device-dtype copies are freed before Run() returns.
std::unique_ptr<Path> MakeD2HStagedPath(std::vector<DataPtr> data);

// TransferShardsToDevice(source, sharding) (kBenchSemantics, the source's dtype) then AwaitReady
// on every shard. Results on the host: the shards in mesh order.
std::unique_ptr<Path> MakeShardedH2DFerryPath(std::shared_ptr<const TensorSource> source,
                                              Sharding sharding);

// The old path of a sharded put: per shard, in mesh order, a fresh dense temporary of the shard's
// dims filled by the old copy-convert from the shard's SubView of the source, then
// TransferToDevice of that temporary to the shard's device (kBenchSemantics: the call has read it
// when it returns, so the temporary is freed before the next shard's); AwaitReady on all shards
// at the end.
std::unique_ptr<Path> MakeShardedH2DStagedPath(std::shared_ptr<const TensorSource> source,
                                               Sharding sharding);

// AssembleShards(data): one host tensor of the global dims, each shard read into its place.
std::unique_ptr<Path> MakeAssembleShardsPath(ShardedDataPtr data);

// The old path: LocalShards(data) (each shard into a tensor of its own), then a fresh temporary
// of the global dims and each shard copied into its SubView with the old copy-convert; the
// per-shard tensors are freed before Run() returns.
std::unique_ptr<Path> MakeLocalShardsStagedPath(ShardedDataPtr data);

// The OpenCL runtime's own ceiling: one blocking clEnqueueWriteBuffer of the dense `source` into
// a device buffer of the same size, made here and written once (so its pages are touched), on the
// opencl device's own queue. Results on the host: the buffer read back (clEnqueueReadBuffer), in
// the source's dtype and dims. FailedPrecondition unless `device` is an opencl device and the
// source is dense.
StatusOr<std::unique_ptr<Path>> MakeRawClWritePath(std::shared_ptr<const TensorSource> source,
                                                   Device* device);

}  // namespace ferry::bench
