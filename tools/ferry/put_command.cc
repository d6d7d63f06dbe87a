// `ferry put FILE...`: puts every tensor of safetensors/.npy/.npz files on a device (or sharded
// over a mesh), converted on the way when asked, with a progress bar, a table per tensor, totals
// against a memcpy of the same bytes timed in the same run, and an optional read-back check.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstring>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "ferry/core/copy_convert.h"
#include "ferry/io/tensor_file.h"
#include "ferry/runtime/dtype_policy.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/transfer.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/commands.h"

namespace ferry::cli {
namespace {

struct PutOptions {
  std::vector<std::string> files;
  std::string device = "host:0";
  std::string mesh;
  int shard_dim = 0;
  std::string device_dtype;
  bool device_dtype_all = false;  // apply --device-dtype to every tensor, not only its kind
  std::string semantics = "async";
  bool verify = false;
  std::string json_path;
};

// One tensor of one file, and where it went.
struct PutTensor {
  std::string file;
  TensorFileEntry entry;
  DType device_dtype = DType::kF32;
  std::string path;  // aliased / direct / converted / byte-swapped (sharded: "sharded/" + path)
  DataPtr data;      // unsharded
  ShardedDataPtr sharded;  // sharded over the mesh
  int64_t bytes = 0;       // bytes read from the file
};

StatusOr<HostBufferSemantics> ParseSemantics(const std::string& name) {
  if (name == "copy") return HostBufferSemantics::kImmutableOnlyDuringCall;
  if (name == "async") return HostBufferSemantics::kImmutableUntilTransferCompletes;
  if (name == "zero_copy") return HostBufferSemantics::kImmutableZeroCopy;
  return InvalidArgumentError(
      fmt::format("--semantics must be copy, async or zero_copy, not '{}'", name));
}

// Whether a requested device dtype applies to a tensor of `source` dtype: only to tensors of its
// own kind (a floating-point request to floating-point tensors, an integer one to integers), so
// that `--device-dtype bfloat16` stores the weights as bfloat16 and leaves integer ids alone.
bool RequestAppliesTo(DType requested, DType source) {
  const DTypeKind requested_kind = GetDTypeInfo(requested).kind;
  const DTypeKind source_kind = GetDTypeInfo(source).kind;
  const auto integer = [](DTypeKind kind) {
    return kind == DTypeKind::kSignedInt || kind == DTypeKind::kUnsignedInt;
  };
  return requested_kind == source_kind || (integer(requested_kind) && integer(source_kind));
}

// How a tensor read back compares with the file.
struct VerifyResult {
  bool exact = true;
  int64_t differing = 0;  // elements that differ from the file
  double max_error = 0;   // largest |read back - file| (complex: modulus); NaN vs NaN is 0
};

// Reads `tensor` back in the file's dtype and compares it with the file itself (not with the
// file converted to the device dtype and back, which would call any lossy conversion a match).
StatusOr<VerifyResult> Verify(const PutTensor& tensor) {
  const HostView& view = tensor.entry.source->view();
  HostTensor got;
  if (tensor.sharded) {
    FERRY_ASSIGN_OR_RETURN(got, AssembleShards(*tensor.sharded));
  } else {
    FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> back, TransferFromDevice({tensor.data}));
    got = std::move(back[0]);
  }
  // The file's values, dense and in this machine's byte order.
  FERRY_ASSIGN_OR_RETURN(HostTensor expected, HostTensor::Allocate(view.dtype, view.dims));
  FERRY_RETURN_IF_ERROR(CopyConvert(view, expected.mutable_view()));
  VerifyResult result;
  if (got.dtype() == expected.dtype() && got.size_bytes() == expected.size_bytes() &&
      std::memcmp(got.data(), expected.data(), expected.size_bytes()) == 0) {
    return result;
  }
  result.exact = false;
  if (got.dtype() != expected.dtype() || got.dims() != expected.dims()) {
    result.differing = -1;
    result.max_error = std::numeric_limits<double>::infinity();
    return result;
  }
  // Both as complex128 (which holds every dtype's values exactly but uint64/int64 beyond 2^53),
  // element by element.
  FERRY_ASSIGN_OR_RETURN(HostTensor got_wide, HostTensor::Allocate(DType::kC128, view.dims));
  FERRY_ASSIGN_OR_RETURN(HostTensor expected_wide, HostTensor::Allocate(DType::kC128, view.dims));
  FERRY_RETURN_IF_ERROR(CopyConvert(got.view(), got_wide.mutable_view()));
  FERRY_RETURN_IF_ERROR(CopyConvert(expected.view(), expected_wide.mutable_view()));
  const auto* a = reinterpret_cast<const std::complex<double>*>(got_wide.data());
  const auto* b = reinterpret_cast<const std::complex<double>*>(expected_wide.data());
  const int64_t count = got_wide.size_bytes() / static_cast<int64_t>(sizeof(std::complex<double>));
  for (int64_t i = 0; i < count; ++i) {
    const bool a_nan = std::isnan(a[i].real()) || std::isnan(a[i].imag());
    const bool b_nan = std::isnan(b[i].real()) || std::isnan(b[i].imag());
    double error = 0;
    if (a_nan != b_nan) {
      error = std::numeric_limits<double>::infinity();
    } else if (!a_nan && a[i] != b[i]) {
      error = std::abs(a[i] - b[i]);
      if (std::isnan(error)) error = std::numeric_limits<double>::infinity();  // inf - inf
    }
    if (error > 0) ++result.differing;
    result.max_error = std::max(result.max_error, error);
  }
  return result;  // differing == 0: only bit patterns differ (NaN payloads, -0.0)
}

// Seconds to memcpy every tensor's bytes (contiguous runs of the file data) through a 64 MiB
// scratch buffer: the yardstick of the same bytes, timed in the same run.
double TimeMemcpyOf(const std::vector<PutTensor>& tensors) {
  constexpr int64_t kScratchBytes = int64_t{64} << 20;
  std::vector<std::byte> scratch(kScratchBytes);
  std::memset(scratch.data(), 1, scratch.size());  // touch it before timing
  const auto start = std::chrono::steady_clock::now();
  for (const PutTensor& tensor : tensors) {
    const HostView& view = tensor.entry.source->view();
    auto addressed = view.ComputeAddressedBytes("memcpy");
    if (!addressed.ok()) continue;
    const auto* begin = static_cast<const std::byte*>(view.data) + addressed->begin;
    for (int64_t done = 0; done < tensor.bytes; done += kScratchBytes) {
      const int64_t count = std::min(kScratchBytes, tensor.bytes - done);
      std::memcpy(scratch.data(), begin + done, static_cast<size_t>(count));
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string ShapeString(const Dims& dims) { return fmt::format("[{}]", fmt::join(dims, ", ")); }

int RunPut(const PutOptions& options) {
  constexpr std::string_view kCommand = "put";
  auto semantics = ParseSemantics(options.semantics);
  if (!semantics.ok()) return ReportError(kCommand, semantics.status());
  std::optional<DType> requested;
  if (!options.device_dtype.empty()) {
    auto dtype = DTypeFromName(options.device_dtype);
    if (!dtype.ok()) return ReportError(kCommand, dtype.status());
    requested = *dtype;
  }

  // Devices: one, or a 1-d mesh sharding dim --shard-dim.
  DeviceSet device_set;
  Device* device = nullptr;
  std::optional<Sharding> row_sharding;  // built per rank below
  std::optional<Mesh> mesh;
  if (!options.mesh.empty()) {
    std::vector<Device*> devices;
    for (absl::string_view name : absl::StrSplit(options.mesh, ',')) {
      auto found = device_set.Find(std::string(name));
      if (!found.ok()) return ReportError(kCommand, found.status());
      devices.push_back(*found);
    }
    auto made = Mesh::Create(devices, {static_cast<int64_t>(devices.size())}, {"x"});
    if (!made.ok()) return ReportError(kCommand, made.status());
    mesh = *std::move(made);
    device = devices[0];
  } else {
    auto found = device_set.Find(options.device);
    if (!found.ok()) return ReportError(kCommand, found.status());
    device = *found;
  }

  // The timed job starts here: opening and mapping the files is part of loading them.
  const auto start = std::chrono::steady_clock::now();
  // Open every file first: a malformed one stops the command before anything moves.
  std::vector<TensorFile> files;
  std::vector<PutTensor> tensors;
  int64_t total_bytes = 0;
  for (const std::string& path : options.files) {
    auto file = TensorFile::Open(path);
    if (!file.ok()) return ReportError(kCommand, file.status());
    for (const TensorFileEntry& entry : file->tensors()) {
      PutTensor tensor;
      tensor.file = path;
      tensor.entry = entry;
      tensor.bytes = entry.source->view().dense_size_bytes();
      const DType file_dtype = entry.source->view().dtype;
      std::optional<DType> wanted = requested;
      if (wanted.has_value() && !options.device_dtype_all &&
          !RequestAppliesTo(*wanted, file_dtype)) {
        wanted.reset();  // the device's profile decides, as without --device-dtype
      }
      auto dtype =
          ChooseDeviceDType(file_dtype, wanted, device->capabilities(), entry.source->name());
      if (!dtype.ok()) return ReportError(kCommand, dtype.status());
      tensor.device_dtype = *dtype;
      total_bytes += tensor.bytes;
      tensors.push_back(std::move(tensor));
    }
    files.push_back(*std::move(file));
  }

  // Fault the mapped pages in from every core at once rather than one 4 KiB page fault at a time
  // inside the copy: a cold file is read ahead in parallel, a warm one is mapped fast.
  const int touch_threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (const TensorFile& file : files) file.Prefetch(touch_threads);

  TransferToDeviceOptions transfer_options;
  transfer_options.semantics = *semantics;
  ProgressBar progress("put", total_bytes);
  // Start every transfer (they run on the backend's threads), then follow them in order.
  for (PutTensor& tensor : tensors) {
    transfer_options.device_dtypes = {tensor.device_dtype};
    if (mesh.has_value()) {
      const int64_t rank = tensor.entry.source->view().rank();
      std::vector<std::vector<std::string>> spec(rank);
      if (options.shard_dim < rank) spec[options.shard_dim] = {"x"};  // else: replicated
      auto sharding = Sharding::Create(*mesh, spec);
      if (!sharding.ok()) return ReportError(kCommand, sharding.status());
      auto sharded = TransferShardsToDevice(tensor.entry.source, *sharding, transfer_options);
      if (!sharded.ok()) return ReportError(kCommand, sharded.status());
      tensor.sharded = *std::move(sharded);
    } else {
      auto data = TransferToDevice({tensor.entry.source}, device, transfer_options);
      if (!data.ok()) return ReportError(kCommand, data.status());
      tensor.data = std::move((*data)[0]);
    }
  }
  int64_t done_bytes = 0;
  for (PutTensor& tensor : tensors) {
    const Status ready =
        tensor.sharded ? AwaitReady(tensor.sharded->shards()) : AwaitReady({tensor.data});
    if (!ready.ok()) return ReportError(kCommand, ready);
    done_bytes += tensor.bytes;
    progress.Update(done_bytes);
  }
  // A file truncated while mapped was read as zeros where its pages vanished (MappedFile turns the
  // SIGBUS into that): an error naming the file, not a result.
  for (const TensorFile& file : files) {
    if (Status intact = file.file()->CheckIntact(); !intact.ok()) {
      progress.Finish();
      return ReportError(kCommand, intact);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  progress.Finish();

  for (PutTensor& tensor : tensors) {
    const DataPtr& first = tensor.sharded ? tensor.sharded->shards().front() : tensor.data;
    const HostView& view = tensor.entry.source->view();
    const std::string kind = first->buffer().is_alias()          ? "aliased"
                             : tensor.device_dtype != view.dtype ? "converted"
                             : !view.IsNativeByteOrder()         ? "byte-swapped"
                                                                 : "direct";
    tensor.path = tensor.sharded ? "sharded/" + kind : kind;
  }
  const double memcpy_seconds = TimeMemcpyOf(tensors);

  // --verify: every tensor read back and compared with the file. A tensor stored in another dtype
  // may differ (a lossy conversion, which was asked for): that is reported as exactly that. A
  // tensor stored in its own dtype must match bit for bit, or the command fails.
  bool verified = false;
  std::vector<std::string> lossy;  // "name (float32 -> bfloat16): N of M elements differ, max ..."
  if (options.verify) {
    ProgressBar verify_progress("verify", total_bytes);
    int64_t checked = 0;
    for (const PutTensor& tensor : tensors) {
      auto result = Verify(tensor);
      if (!result.ok()) return ReportError(kCommand, result.status());
      const DType file_dtype = tensor.entry.source->view().dtype;
      // Stored in its own dtype, a tensor must come back bit for bit; converted, value for value.
      if (!result->exact && (tensor.device_dtype == file_dtype || result->differing != 0)) {
        if (tensor.device_dtype == file_dtype) {
          return ReportError(
              kCommand,
              absl::DataLossError(fmt::format(
                  "verify: tensor '{}' of {} read back differently from the file ({} elements "
                  "differ, max error {:g})",
                  tensor.entry.name, tensor.file, result->differing, result->max_error)));
        }
        lossy.push_back(fmt::format("{} ({} -> {}): {} of {} elements differ, max error {:g}",
                                    tensor.entry.name, DTypeName(file_dtype),
                                    DTypeName(tensor.device_dtype), result->differing,
                                    tensor.entry.source->view().num_elements(), result->max_error));
      }
      checked += tensor.bytes;
      verify_progress.Update(checked);
    }
    verify_progress.Finish();
    verified = true;
  }

  // The table.
  fmt::print("{:<40} {:<18} {:<22} {:<18} {:>12}\n", "tensor", "shape", "dtype (file -> device)",
             "path", "size");
  for (const PutTensor& tensor : tensors) {
    const std::string dtypes = fmt::format("{} -> {}", DTypeName(tensor.entry.source->view().dtype),
                                           DTypeName(tensor.device_dtype));
    fmt::print("{:<40} {:<18} {:<22} {:<18} {:>12}\n", tensor.entry.name,
               ShapeString(tensor.entry.source->view().dims), dtypes, tensor.path,
               FormatBytes(static_cast<double>(tensor.bytes)));
  }
  const double gbps = seconds > 0 ? total_bytes / seconds / 1e9 : 0;
  const double vs_memcpy = seconds > 0 ? memcpy_seconds / seconds : 0;
  fmt::print("total: {} tensors, {} in {:.3f} s = {:.2f} GB/s on {}; vs_memcpy {:.2f}{}\n",
             tensors.size(), FormatBytes(static_cast<double>(total_bytes)), seconds, gbps,
             mesh.has_value() ? options.mesh : device->name(), vs_memcpy,
             !verified ? ""
             : lossy.empty()
                 ? "; verified: every tensor matches the file"
                 : fmt::format("; verified: {} of {} tensors match the file exactly, {} "
                               "differ by the requested conversion",
                               tensors.size() - lossy.size(), tensors.size(), lossy.size()));
  for (const std::string& line : lossy) fmt::print("lossy conversion: {}\n", line);

  if (!options.json_path.empty()) {
    nlohmann::json json;
    json["files"] = options.files;
    json["device"] = mesh.has_value() ? options.mesh : device->name();
    json["total_bytes"] = total_bytes;
    json["seconds"] = seconds;
    json["gbps"] = gbps;
    json["memcpy_seconds"] = memcpy_seconds;
    json["vs_memcpy"] = vs_memcpy;
    json["verified"] = verified;
    json["verified_exact"] = verified && lossy.empty();
    json["lossy"] = lossy;
    for (const PutTensor& tensor : tensors) {
      const HostView& view = tensor.entry.source->view();
      json["tensors"].push_back(
          {{"name", tensor.entry.name},
           {"file", tensor.file},
           {"shape", std::vector<int64_t>(view.dims.begin(), view.dims.end())},
           {"file_dtype", DTypeName(view.dtype)},
           {"device_dtype", DTypeName(tensor.device_dtype)},
           {"path", tensor.path},
           {"bytes", tensor.bytes}});
    }
    std::ofstream out(options.json_path);
    out << json.dump(2) << "\n";
    if (!out) {
      return ReportError(kCommand, InvalidArgumentError(fmt::format("cannot write --json file '{}'",
                                                                    options.json_path)));
    }
  }
  return kExitOk;
}

}  // namespace

CommandRunner AddPutCommand(CLI::App& app) {
  auto options = std::make_shared<PutOptions>();
  CLI::App* command = app.add_subcommand(
      "put", "Put every tensor of safetensors/.npy/.npz files on a device or a mesh");
  command->add_option("files", options->files, "Tensor files (.safetensors, .npy, .npz)")
      ->required();
  auto* device =
      command->add_option("--device", options->device, "Target device")->capture_default_str();
  auto* mesh = command->add_option("--mesh", options->mesh,
                                   "Comma-separated devices to shard over (a 1-d mesh)");
  device->excludes(mesh);
  command
      ->add_option("--shard-dim", options->shard_dim,
                   "With --mesh: the tensor dim split over the mesh (tensors of lower rank are "
                   "replicated)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  command->add_option("--device-dtype", options->device_dtype,
                      "Store the tensors of this dtype's kind as this dtype (e.g. bfloat16: every "
                      "floating-point tensor; integer and bool tensors keep theirs)");
  command->add_flag("--device-dtype-all", options->device_dtype_all,
                    "Apply --device-dtype to every tensor, whatever its kind");
  command
      ->add_option("--semantics", options->semantics,
                   "copy | async | zero_copy (the host device may then alias the mapped file)")
      ->capture_default_str();
  command->add_flag("--verify", options->verify,
                    "Read every tensor back and compare it with the file itself (a conversion "
                    "that changed values is reported as lossy, with its largest error)");
  command->add_option("--json", options->json_path, "Also write the results as JSON to this file");
  return [options] { return RunPut(*options); };
}

}  // namespace ferry::cli
