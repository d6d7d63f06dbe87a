#include "transfer_cases.h"

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/core/dtype.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/host_view.h"
#include "ferry/device/device.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/tensor_source.h"
#include "ferry/runtime/transfer.h"
#include "file_put_cases.h"
#include "fmt/format.h"
#include "pjrt_paths.h"
#include "transfer_paths.h"

namespace ferry::bench {
namespace {

// Values in [0.5, 1.5) with varied mantissas for the float dtypes (conversions must round), odd
// bytes for the others; every page written.
void FillSource(HostTensor& tensor, uint64_t seed) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const int64_t count = tensor.size_bytes() / DTypeSize(tensor.dtype());
  if (tensor.dtype() == DType::kF64) {
    auto* values = reinterpret_cast<double*>(tensor.data());
    for (int64_t i = 0; i < count; ++i)
      values[i] = 0.5 + static_cast<double>(next() >> 11) * 0x1p-53;
  } else if (tensor.dtype() == DType::kF32) {
    auto* values = reinterpret_cast<float*>(tensor.data());
    for (int64_t i = 0; i < count; ++i)
      values[i] = 0.5f + static_cast<float>(next() >> 40) * 0x1p-24f;
  } else {
    for (int64_t i = 0; i < tensor.size_bytes(); ++i) {
      tensor.data()[i] = static_cast<std::byte>(next() | 1);
    }
  }
}

StatusOr<HostTensor> MakeFilledTensor(DType dtype, absl::Span<const int64_t> dims, uint64_t seed) {
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, HostTensor::Allocate(dtype, dims));
  FillSource(tensor, seed);
  return tensor;
}

std::vector<int64_t> DimsOf(const Dims& dims) { return {dims.begin(), dims.end()}; }

// A source that borrows `view` of `owner` (a strided view over the whole allocation).
StatusOr<std::shared_ptr<const TensorSource>> BorrowView(std::shared_ptr<HostTensor> owner,
                                                         Dims dims, Dims byte_strides,
                                                         const std::string& name) {
  HostView view(owner->data(), owner->dtype(), std::move(dims), std::move(byte_strides));
  const void* begin = owner->data();
  const int64_t size = owner->size_bytes();
  return TensorSource::Borrow(view, begin, size, std::shared_ptr<const void>(std::move(owner)),
                              name);
}

// What vs_raw_pjrt compares a converting put with (pjrt_paths.h).
constexpr char kPjrtAstypePut[] =
    "astype (the old copy-convert into a fresh temporary) + BufferFromHostBuffer";

// An h2d case over `sources`; `device_dtype` nullopt lets the device profile choose.
StatusOr<PreparedCase> MakeH2DCase(std::vector<std::shared_ptr<const TensorSource>> sources,
                                   std::optional<DType> device_dtype, const CaseContext& context) {
  PreparedCase prepared;
  TransferToDeviceOptions options;
  options.semantics = kBenchSemantics;
  std::vector<DType> staged_dtypes;
  for (const auto& source : sources) {
    prepared.bytes += source->view().num_elements() * source->view().element_size();
    if (device_dtype.has_value()) options.device_dtypes.push_back(*device_dtype);
    // The staged path stores what the ferry path stores: the explicit dtype, else the source's
    // (every case without an explicit dtype uses one the host device holds).
    staged_dtypes.push_back(device_dtype.value_or(source->view().dtype));
  }
  prepared.tensors = static_cast<int64_t>(sources.size());
  const HostView& first = sources.front()->view();
  prepared.details["source_dtype"] = std::string(DTypeName(first.dtype));
  prepared.details["device_dtype"] = std::string(DTypeName(staged_dtypes.front()));
  prepared.details["dims"] = DimsOf(first.dims);
  prepared.details["source_byte_strides"] = DimsOf(first.byte_strides);
  prepared.details["semantics"] = std::string(HostBufferSemanticsName(kBenchSemantics));
  if (!device_dtype.has_value()) prepared.unconverted_sources = sources;
  if (IsPjrtDevice(context.device)) {
    FERRY_ASSIGN_OR_RETURN(
        prepared.raw_pjrt,
        MakePjrtPutPath(sources, std::vector<Device*>(sources.size(), context.device),
                        staged_dtypes));
    prepared.raw_pjrt_method =
        device_dtype.has_value() && *device_dtype != first.dtype
            ? kPjrtAstypePut
            : "BufferFromHostBuffer with the source's byte strides (none when dense)";
  }
  prepared.ferry = MakeH2DFerryPath(sources, context.device, options);
  prepared.staged = MakeH2DStagedPath(std::move(sources), context.device, std::move(staged_dtypes));
  return prepared;
}

StatusOr<PreparedCase> PrepareH2DDense(const CaseContext& context, DType source_dtype,
                                       std::optional<DType> device_dtype, const char* name) {
  if (device_dtype.has_value() && !context.device->capabilities().Holds(*device_dtype)) {
    return Skipped(
        fmt::format("{} does not hold {}", context.device->name(), DTypeName(*device_dtype)));
  }
  const int64_t count = ScaledCount(256 * kMiB / DTypeSize(source_dtype), context.scale, 64);
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, MakeFilledTensor(source_dtype, {count}, 1));
  PreparedCase prepared;
  FERRY_ASSIGN_OR_RETURN(
      prepared,
      MakeH2DCase({TensorSource::FromHostTensor(std::move(tensor), name)}, device_dtype, context));
  prepared.compare_to_raw_clwrite = true;
  if (device_dtype.has_value() && 2 * DTypeSize(*device_dtype) == DTypeSize(source_dtype)) {
    prepared.halving_floor_bytes = count * DTypeSize(*device_dtype);
  }
  return prepared;
}

StatusOr<PreparedCase> PrepareH2DTransposed(const CaseContext& context) {
  const int64_t side = ScaledCount(4096, std::sqrt(context.scale));
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, MakeFilledTensor(DType::kF32, {side, side}, 2));
  auto owner = std::make_shared<HostTensor>(std::move(tensor));
  const int64_t element = 4;
  // The row-major buffer seen through a transpose: the byte strides swapped.
  FERRY_ASSIGN_OR_RETURN(auto source, BorrowView(std::move(owner), Dims{side, side},
                                                 Dims{element, side * element}, "transposed"));
  return MakeH2DCase({std::move(source)}, std::nullopt, context);
}

StatusOr<PreparedCase> PrepareH2DStridedSlice(const CaseContext& context) {
  const int64_t side = ScaledCount(8192, std::sqrt(context.scale), 2);
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, MakeFilledTensor(DType::kF32, {side, side}, 3));
  auto owner = std::make_shared<HostTensor>(std::move(tensor));
  const int64_t element = 4;
  // x[::2, ::2]
  FERRY_ASSIGN_OR_RETURN(auto source,
                         BorrowView(std::move(owner), Dims{side / 2, side / 2},
                                    Dims{2 * side * element, 2 * element}, "strided_slice"));
  PreparedCase prepared;
  FERRY_ASSIGN_OR_RETURN(prepared, MakeH2DCase({std::move(source)}, std::nullopt, context));
  prepared.details["allocation_dims"] = std::vector<int64_t>{side, side};
  return prepared;
}

StatusOr<PreparedCase> PrepareH2DManySmall(const CaseContext& context) {
  const int64_t count = ScaledCount(16384, context.scale);
  constexpr int64_t kElements = 1024;  // 4 KiB of f32
  std::vector<std::shared_ptr<const TensorSource>> sources;
  sources.reserve(count);
  for (int64_t i = 0; i < count; ++i) {
    FERRY_ASSIGN_OR_RETURN(HostTensor tensor, HostTensor::Allocate(DType::kF32, {kElements}));
    FillSource(tensor, 100 + i);
    sources.push_back(TensorSource::FromHostTensor(std::move(tensor), fmt::format("small_{}", i)));
  }
  return MakeH2DCase(std::move(sources), std::nullopt, context);
}

// A d2h case: a source of `count` f32 put on the device as `device_dtype` (outside timing), then
// read back in its logical dtype, f32.
StatusOr<PreparedCase> PrepareD2H(const CaseContext& context, int64_t full_count,
                                  DType device_dtype, const char* name) {
  const int64_t count = ScaledCount(full_count, context.scale, 64);
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, MakeFilledTensor(DType::kF32, {count}, 4));
  std::vector<std::shared_ptr<const TensorSource>> sources = {
      TensorSource::FromHostTensor(std::move(tensor), name)};
  TransferToDeviceOptions options;
  options.device_dtypes = {device_dtype};
  FERRY_ASSIGN_OR_RETURN(std::vector<DataPtr> data,
                         TransferToDevice(sources, context.device, options));
  FERRY_RETURN_IF_ERROR(AwaitReady(data));
  sources.clear();  // only the device copy remains
  PreparedCase prepared;
  prepared.bytes = count * DTypeSize(device_dtype);
  prepared.details["device_dtype"] = std::string(DTypeName(device_dtype));
  prepared.details["host_dtype"] = std::string(DTypeName(DType::kF32));
  prepared.details["dims"] = std::vector<int64_t>{count};
  prepared.details["host_bytes"] = count * DTypeSize(DType::kF32);
  if (IsPjrtDevice(context.device)) {
    FERRY_ASSIGN_OR_RETURN(prepared.raw_pjrt, MakePjrtReadPath(data));
    prepared.raw_pjrt_method = device_dtype == DType::kF32
                                   ? "ToHostBuffer into a reused destination"
                                   : "ToHostBuffer into a reused destination + astype (the old "
                                     "copy-convert into a fresh temporary)";
  }
  prepared.ferry = MakeD2HFerryPath(data);
  prepared.staged = MakeD2HStagedPath(std::move(data));
  return prepared;
}

// d2d_copy: 64 MiB of f32 on the device (put outside timing) copied to a second device of the
// backend (the mesh's second device), or to the host backend's device where there is none.
StatusOr<PreparedCase> PrepareD2DCopy(const CaseContext& context) {
  const int64_t count = ScaledCount(16 * kMiB, context.scale, 64);
  PreparedCase prepared;
  Device* target = context.mesh_devices.size() > 1 ? context.mesh_devices[1] : nullptr;
  if (target == nullptr) {
    FERRY_ASSIGN_OR_RETURN(std::shared_ptr<Client> host, CreateClient("host"));
    target = host->devices()[0];
    prepared.keep_alive = std::move(host);
  }
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, MakeFilledTensor(DType::kF32, {count}, 6));
  std::vector<std::shared_ptr<const TensorSource>> sources = {
      TensorSource::FromHostTensor(std::move(tensor), "d2d")};
  FERRY_ASSIGN_OR_RETURN(std::vector<DataPtr> data, TransferToDevice(sources, context.device));
  FERRY_RETURN_IF_ERROR(AwaitReady(data));
  prepared.bytes = count * 4;
  prepared.details["target"] = target->name();
  prepared.details["dims"] = std::vector<int64_t>{count};
  prepared.devices = {context.device, target};
  prepared.ferry = MakeD2DFerryPath(data, target);
  prepared.staged = MakeD2DStagedPath(std::move(data), target);
  return prepared;
}

// The sharded cases' tensor: 8192x8192 f32 (each side scaled by sqrt(scale)), rows split over
// mesh axis "x" and columns over "y" of a 2x2 mesh, so every shard is a strided quarter.
struct ShardedSetup {
  std::shared_ptr<const TensorSource> source;
  Sharding sharding;
  std::vector<ShardIndex> indices;
};

StatusOr<ShardedSetup> MakeShardedSetup(const CaseContext& context, const char* name) {
  const int64_t side = ScaledCount(8192, std::sqrt(context.scale), 2);
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, MakeFilledTensor(DType::kF32, {side, side}, 5));
  FERRY_ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create(context.mesh_devices, {2, 2}, {"x", "y"}));
  FERRY_ASSIGN_OR_RETURN(Sharding sharding, Sharding::Create(std::move(mesh), {{"x"}, {"y"}}));
  FERRY_ASSIGN_OR_RETURN(std::vector<ShardIndex> indices, sharding.ShardIndices({side, side}));
  return ShardedSetup{TensorSource::FromHostTensor(std::move(tensor), name), std::move(sharding),
                      std::move(indices)};
}

void DescribeSharding(const ShardedSetup& setup, PreparedCase& prepared) {
  const HostView& view = setup.source->view();
  prepared.details["dims"] = DimsOf(view.dims);
  prepared.details["mesh_shape"] = setup.sharding.mesh().shape();
  prepared.details["sharding_spec"] = setup.sharding.spec();
  const HostView shard = SubView(view, setup.indices.front());
  prepared.details["shard_dims"] = DimsOf(shard.dims);
  prepared.details["shard_byte_strides"] = DimsOf(shard.byte_strides);
  std::vector<std::string> names;
  for (Device* device : setup.sharding.mesh().devices()) names.push_back(device->name());
  prepared.details["mesh_devices"] = names;
}

StatusOr<PreparedCase> PrepareH2DSharded(const CaseContext& context) {
  if (context.mesh_devices.empty()) return Skipped(context.mesh_unavailable);
  FERRY_ASSIGN_OR_RETURN(ShardedSetup setup, MakeShardedSetup(context, "sharded"));
  PreparedCase prepared;
  const HostView& view = setup.source->view();
  prepared.bytes = view.num_elements() * view.element_size();
  prepared.tensors = kMeshDevices;
  prepared.devices = context.mesh_devices;
  DescribeSharding(setup, prepared);
  prepared.details["source_dtype"] = std::string(DTypeName(view.dtype));
  prepared.details["device_dtype"] = std::string(DTypeName(view.dtype));
  prepared.details["semantics"] = std::string(HostBufferSemanticsName(kBenchSemantics));
  // Each shard's device data is spot-checked against its sub-view of the source.
  for (size_t i = 0; i < setup.indices.size(); ++i) {
    FERRY_ASSIGN_OR_RETURN(
        auto shard,
        TensorSource::Borrow(SubView(view, setup.indices[i]), view.data, view.dense_size_bytes(),
                             setup.source, fmt::format("sharded[shard {}]", i)));
    prepared.unconverted_sources.push_back(std::move(shard));
  }
  if (IsPjrtDevice(context.device)) {
    // Each shard handed to the plugin with its byte strides, on its mesh device, in mesh order.
    FERRY_ASSIGN_OR_RETURN(
        prepared.raw_pjrt,
        MakePjrtPutPath(prepared.unconverted_sources, context.mesh_devices,
                        std::vector<DType>(prepared.unconverted_sources.size(), view.dtype)));
    prepared.raw_pjrt_method =
        "BufferFromHostBuffer of each shard with its byte strides onto its device";
  }
  prepared.ferry = MakeShardedH2DFerryPath(setup.source, setup.sharding);
  prepared.staged = MakeShardedH2DStagedPath(std::move(setup.source), std::move(setup.sharding));
  return prepared;
}

StatusOr<PreparedCase> PrepareD2HShardedAssemble(const CaseContext& context) {
  if (context.mesh_devices.empty()) return Skipped(context.mesh_unavailable);
  FERRY_ASSIGN_OR_RETURN(ShardedSetup setup, MakeShardedSetup(context, "d2h_sharded"));
  PreparedCase prepared;
  const HostView& view = setup.source->view();
  prepared.bytes = view.num_elements() * view.element_size();
  prepared.devices = context.mesh_devices;
  DescribeSharding(setup, prepared);
  prepared.details["device_dtype"] = std::string(DTypeName(view.dtype));
  prepared.details["host_dtype"] = std::string(DTypeName(view.dtype));
  prepared.details["host_bytes"] = prepared.bytes;
  FERRY_ASSIGN_OR_RETURN(ShardedDataPtr data,
                         TransferShardsToDevice(std::move(setup.source), setup.sharding));
  FERRY_RETURN_IF_ERROR(AwaitReady(data->shards()));  // only the device copy remains
  prepared.ferry = MakeAssembleShardsPath(data);
  prepared.staged = MakeLocalShardsStagedPath(std::move(data));
  return prepared;
}

StatusOr<PreparedCase> PrepareRawClWrite(const CaseContext& context) {
  if (StatusOr<NativeDeviceHandles> handles = context.device->NativeHandles();
      !handles.ok() || handles->backend != "opencl") {
    return Skipped(
        fmt::format("needs an opencl device (--device opencl:N), not {}", context.device->name()));
  }
  const int64_t count = ScaledCount(256 * kMiB / 4, context.scale, 64);
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, MakeFilledTensor(DType::kF32, {count}, 1));
  std::shared_ptr<const TensorSource> source =
      TensorSource::FromHostTensor(std::move(tensor), "raw_clwrite");
  PreparedCase prepared;
  prepared.bytes = count * 4;
  prepared.details["dims"] = std::vector<int64_t>{count};
  prepared.details["source_dtype"] = std::string(DTypeName(DType::kF32));
  prepared.details["device_dtype"] = std::string(DTypeName(DType::kF32));
  prepared.details["call"] = "clEnqueueWriteBuffer, blocking, into a pre-written buffer";
  FERRY_ASSIGN_OR_RETURN(prepared.ferry, MakeRawClWritePath(source, context.device));
  prepared.unconverted_sources = {std::move(source)};
  return prepared;
}

StatusOr<PreparedCase> PrepareRawPjrtPut(const CaseContext& context) {
  if (!IsPjrtDevice(context.device)) {
    return Skipped(
        fmt::format("needs a pjrt device (--device pjrt:N), not {}", context.device->name()));
  }
  const int64_t count = ScaledCount(256 * kMiB / 4, context.scale, 64);
  FERRY_ASSIGN_OR_RETURN(HostTensor tensor, MakeFilledTensor(DType::kF32, {count}, 1));
  std::shared_ptr<const TensorSource> source =
      TensorSource::FromHostTensor(std::move(tensor), "raw_pjrt_put");
  PreparedCase prepared;
  prepared.bytes = count * 4;
  prepared.details["dims"] = std::vector<int64_t>{count};
  prepared.details["source_dtype"] = std::string(DTypeName(DType::kF32));
  prepared.details["device_dtype"] = std::string(DTypeName(DType::kF32));
  prepared.details["semantics"] = std::string(HostBufferSemanticsName(kBenchSemantics));
  prepared.details["call"] =
      "PJRT_Client_BufferFromHostBuffer, dense, kImmutableOnlyDuringCall; done_with_host_buffer "
      "and ReadyEvent awaited; the buffer destroyed after each timed run";
  prepared.no_staged_note = "no staged path: the plugin's own put";
  FERRY_ASSIGN_OR_RETURN(prepared.ferry,
                         MakePjrtPutPath({source}, {context.device}, {DType::kF32}));
  prepared.unconverted_sources = {std::move(source)};
  return prepared;
}

}  // namespace

std::vector<CaseDefinition> AllCases() {
  return {
      // First, so that the h2d cases after it in the same run get vs_raw_clwrite.
      {"raw_clwrite", "opencl only: 256 MiB, one blocking clEnqueueWriteBuffer (the ceiling)",
       PrepareRawClWrite},
      {"raw_pjrt_put",
       "pjrt only: 256 MiB f32, the plugin's own BufferFromHostBuffer (the yardstick)",
       PrepareRawPjrtPut},
      {"h2d_contiguous", "256 MiB f32, dense",
       [](const CaseContext& c) { return PrepareH2DDense(c, DType::kF32, std::nullopt, "dense"); }},
      {"h2d_transposed", "4096x4096 f32 through a transpose (byte strides swapped)",
       PrepareH2DTransposed},
      {"h2d_strided_slice", "x[::2, ::2] of 8192x8192 f32", PrepareH2DStridedSlice},
      {"h2d_convert_f32_bf16", "256 MiB f32 stored as bf16",
       [](const CaseContext& c) {
         return PrepareH2DDense(c, DType::kF32, DType::kBF16, "f32_to_bf16");
       }},
      {"h2d_convert_f64_f32", "256 MiB f64 stored as f32",
       [](const CaseContext& c) {
         return PrepareH2DDense(c, DType::kF64, DType::kF32, "f64_to_f32");
       }},
      {"h2d_convert_f32_f16", "256 MiB f32 stored as f16",
       [](const CaseContext& c) {
         return PrepareH2DDense(c, DType::kF32, DType::kF16, "f32_to_f16");
       }},
      {"h2d_many_small", "16384 tensors of 4 KiB f32 in one call", PrepareH2DManySmall},
      {"h2d_sharded_4", "8192x8192 f32 over a 2x2 mesh, every shard strided", PrepareH2DSharded},
      {"d2h_contiguous", "256 MiB f32 read back",
       [](const CaseContext& c) {
         return PrepareD2H(c, 256 * kMiB / 4, DType::kF32, "d2h_dense");
       }},
      {"d2h_upcast_bf16_f32", "128 MiB bf16 on the device read back as 256 MiB f32",
       [](const CaseContext& c) { return PrepareD2H(c, 64 * kMiB, DType::kBF16, "d2h_bf16"); }},
      {"d2d_copy", "64 MiB f32 copied to a second device (the host backend's if none)",
       PrepareD2DCopy},
      {"d2h_sharded_4_assemble", "8192x8192 f32 on a 2x2 mesh read back whole (AssembleShards)",
       PrepareD2HShardedAssemble},
      {"file_put_safetensors",
       "1 GiB sample checkpoint (f32, i64) in a warm safetensors file: open, put every tensor",
       [](const CaseContext& c) { return PrepareFilePutSafetensors(c, DType::kF32); }},
      {"file_put_safetensors_bf16", "the same sample stored as bf16: open, put every tensor",
       [](const CaseContext& c) { return PrepareFilePutSafetensors(c, DType::kBF16); }},
      {"file_parse_many_tensors",
       "200,000 one-element tensors in a 13 MB safetensors header: open (parse, validate, map)",
       PrepareFileParseManyTensors},
  };
}

}  // namespace ferry::bench
