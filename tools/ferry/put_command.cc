// `ferry put FILE...`: puts every tensor of safetensors/.npy/.npz files on a device (or sharded
// over a mesh), converted on the way when asked, with a progress bar, a table per tensor, totals
// against a memcpy of the same bytes timed in the same run, and an optional read-back check.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <complex>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "ferry/core/copy_convert.h"
#include "ferry/io/mapped_file.h"
#include "ferry/io/tensor_file.h"
#include "ferry/runtime/dtype_policy.h"
#include "ferry/runtime/file_load.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/transfer.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/commands.h"
#include "tools/ferry/put_distributed.h"
#include "tools/ferry/put_report.h"
#include "tools/ferry/text_layout.h"

namespace ferry::cli {
namespace {

// How a tensor read back compares with the file.
struct VerifyResult {
  bool exact = true;
  int64_t differing = 0;  // elements that differ from the file
  double max_error = 0;   // largest |read back - file| (complex: modulus); NaN vs NaN is 0
};

// Element by element, `got` against `expected` (dense, native, one integer or bool dtype): every
// bit that differs is a value that differs, and the error is exact (a 64-bit integer does not fit
// a double's 53-bit mantissa, so these are not compared as floating point).
template <typename T>
void CompareIntegersAs(const HostTensor& got, const HostTensor& expected, VerifyResult& result) {
  const auto* a = reinterpret_cast<const T*>(got.data());
  const auto* b = reinterpret_cast<const T*>(expected.data());
  const int64_t count = expected.size_bytes() / static_cast<int64_t>(sizeof(T));
  for (int64_t i = 0; i < count; ++i) {
    if (a[i] == b[i]) continue;
    ++result.differing;
    const __int128 difference = static_cast<__int128>(a[i]) - static_cast<__int128>(b[i]);
    result.max_error =
        std::max(result.max_error, static_cast<double>(difference < 0 ? -difference : difference));
  }
}

void CompareIntegers(const HostTensor& got, const HostTensor& expected, VerifyResult& result) {
  switch (got.dtype()) {
    case DType::kBool:
    case DType::kU8:
      return CompareIntegersAs<uint8_t>(got, expected, result);
    case DType::kS8:
      return CompareIntegersAs<int8_t>(got, expected, result);
    case DType::kS16:
      return CompareIntegersAs<int16_t>(got, expected, result);
    case DType::kU16:
      return CompareIntegersAs<uint16_t>(got, expected, result);
    case DType::kS32:
      return CompareIntegersAs<int32_t>(got, expected, result);
    case DType::kU32:
      return CompareIntegersAs<uint32_t>(got, expected, result);
    case DType::kS64:
      return CompareIntegersAs<int64_t>(got, expected, result);
    case DType::kU64:
      return CompareIntegersAs<uint64_t>(got, expected, result);
    default:
      result.differing = -1;  // not an integer dtype: never called so
      result.max_error = std::numeric_limits<double>::infinity();
  }
}

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
  switch (GetDTypeInfo(view.dtype).kind) {
    case DTypeKind::kBool:
    case DTypeKind::kSignedInt:
    case DTypeKind::kUnsignedInt:
      CompareIntegers(got, expected, result);
      return result;
    case DTypeKind::kFloat:
    case DTypeKind::kComplex:
      break;
  }
  // Both as complex128 (which holds every floating-point dtype's values exactly), element by
  // element.
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

// Gives back the mapped pages under `tensor`'s bytes (MappedFile::ReleasePages) once the memcpy
// yardstick has read them: not for an inflated .npz member (no pages of the file), nor where a
// device array aliases the file (zero_copy on the host), which would fault them in again.
void ReleaseFilePages(const std::vector<TensorFile>& files, const PutTensor& tensor) {
  if (!tensor.entry.zero_copy || tensor.entry.file_offset < 0) return;
  const DataPtr& first = tensor.sharded ? tensor.sharded->shards().front() : tensor.data;
  if (first->buffer().is_alias()) return;
  files[tensor.file_number - 1].file()->ReleasePages(tensor.entry.file_offset, tensor.bytes);
}

// Seconds to memcpy every tensor's bytes (contiguous runs of the file data) through a 64 MiB
// scratch buffer: the yardstick of the same bytes, timed in the same run.
// The mapped pages each tensor faulted in are given back after its copy (outside the timing), as
// the put gave them back, so that this reference does not make the load's peak memory.
double TimeMemcpyOf(const std::vector<TensorFile>& files, const std::vector<PutTensor>& tensors) {
  constexpr int64_t kScratchBytes = int64_t{64} << 20;
  std::vector<std::byte> scratch(kScratchBytes);
  std::memset(scratch.data(), 1, scratch.size());  // touch it before timing
  std::chrono::steady_clock::duration copying{};
  for (const PutTensor& tensor : tensors) {
    const HostView& view = tensor.entry.source->view();
    auto addressed = view.ComputeAddressedBytes("memcpy");
    if (!addressed.ok()) continue;
    const auto* begin = static_cast<const std::byte*>(view.data) + addressed->begin;
    const auto start = std::chrono::steady_clock::now();
    for (int64_t done = 0; done < tensor.bytes; done += kScratchBytes) {
      const int64_t count = std::min(kScratchBytes, tensor.bytes - done);
      std::memcpy(scratch.data(), begin + done, static_cast<size_t>(count));
    }
    copying += std::chrono::steady_clock::now() - start;
    ReleaseFilePages(files, tensor);
  }
  return std::chrono::duration<double>(copying).count();
}

// "host:0, host:1,host:2" -> the device names, spaces around each name dropped. InvalidArgument
// for an empty list or an empty name.
StatusOr<std::vector<std::string>> ParseMeshList(std::string_view mesh) {
  std::vector<std::string> names;
  for (absl::string_view name : absl::StrSplit(absl::string_view(mesh.data(), mesh.size()), ',')) {
    name = absl::StripAsciiWhitespace(name);
    if (name.empty()) {
      return InvalidArgumentError(fmt::format(
          "--mesh '{}' has an empty device name: list devices separated by commas, e.g. "
          "host:0,host:1",
          mesh));
    }
    names.emplace_back(name);
  }
  return names;
}

StatusOr<PutTarget> ResolveTarget(const PutOptions& options, DeviceSet& device_set) {
  PutTarget target;
  if (options.mesh.has_value()) {
    FERRY_ASSIGN_OR_RETURN(std::vector<std::string> names, ParseMeshList(*options.mesh));
    for (const std::string& name : names) {
      FERRY_ASSIGN_OR_RETURN(Device * device, device_set.Find(name));
      target.devices.push_back(device);
    }
    FERRY_ASSIGN_OR_RETURN(
        Mesh mesh,
        Mesh::Create(target.devices, {static_cast<int64_t>(target.devices.size())}, {"x"}));
    target.mesh = std::move(mesh);
    target.name = fmt::format("{}", fmt::join(names, ","));
  } else {
    FERRY_ASSIGN_OR_RETURN(Device * device, device_set.Find(options.device));
    target.devices = {device};
    target.name = device->name();
  }
  target.device = target.devices.front();
  return target;
}

// Opens every file (only the tensors --only and --exclude select: the others' bytes are never
// read) and plans each tensor's device dtype, so that a malformed file, a pattern that matches
// nothing or a dtype a device cannot hold stops the command before anything moves.
Status OpenFiles(const PutOptions& options, std::optional<DType> requested, const PutTarget& target,
                 std::vector<TensorFile>& files, std::vector<PutTensor>& tensors) {
  // One selector for all the files: a checkpoint split over several files holds each name in one
  // of them, so a pattern need only match in some file.
  TensorSelector selector({}, options.only, options.exclude);
  TensorFileOptions open_options;
  if (!selector.empty()) open_options.selector = &selector;
  for (const std::string& path : options.files) {
    FERRY_ASSIGN_OR_RETURN(TensorFile file, TensorFile::Open(path, open_options));
    for (const TensorFileEntry& entry : file.tensors()) {
      PutTensor tensor;
      tensor.file = path;
      tensor.file_number = files.size() + 1;
      tensor.entry = entry;
      tensor.bytes = entry.source->view().dense_size_bytes();
      const DType file_dtype = tensor.file_dtype();
      tensor.requested_dtype = requested;
      if (requested.has_value() && !options.device_dtype_all &&
          !RequestAppliesTo(*requested, file_dtype)) {
        tensor.requested_dtype.reset();  // the device's profile decides, as without --device-dtype
      }
      // Every device must be able to hold it; the first one's choice is what the table shows
      // unless the shards end up differing (see StartTransfers).
      for (size_t i = target.devices.size(); i-- > 0;) {
        FERRY_ASSIGN_OR_RETURN(
            tensor.device_dtype,
            ChooseDeviceDType(file_dtype, tensor.requested_dtype, target.devices[i]->capabilities(),
                              entry.source->name()));
      }
      tensors.push_back(std::move(tensor));
    }
    files.push_back(std::move(file));
  }
  return selector.CheckEverythingMatched(FilesText(options.files));
}

// Puts the tensors (LoadFileTensors: window by window; on host:N those stored as they are kept
// read from the file straight into device memory; the others from the mapping, each window's
// pages given back once put), drawing `progress`.
Status PutAll(const std::vector<TensorFile>& files, const PutTarget& target,
              const PutOptions& options, HostBufferSemantics semantics,
              std::vector<PutTensor>& tensors, ProgressBar& progress) {
  FERRY_ASSIGN_OR_RETURN(FileLoadOptions load_options, FileLoadOptionsFromSettings());
  load_options.semantics = semantics;
  load_options.progress = [&progress](int64_t done) { progress.Update(done); };
  std::vector<FileLoadTensor> load;
  load.reserve(tensors.size());
  for (PutTensor& tensor : tensors) {
    FileLoadTensor item{&tensor.entry, files[tensor.file_number - 1].file().get(),
                        tensor.device_dtype, std::nullopt};
    if (target.mesh.has_value()) {
      // Shard by shard, each device's profile decides unless a dtype was asked for.
      item.requested_dtype = tensor.requested_dtype;
      const int64_t rank = tensor.entry.source->view().rank();
      std::vector<std::vector<std::string>> spec(rank);
      const bool split = options.shard_dim < rank;
      if (split) spec[options.shard_dim] = {"x"};
      tensor.placement = split ? "sharded" : "replicated";
      FERRY_ASSIGN_OR_RETURN(item.sharding, Sharding::Create(*target.mesh, spec));
    }
    load.push_back(std::move(item));
  }
  FERRY_ASSIGN_OR_RETURN(std::vector<FileLoadResult> loaded,
                         LoadFileTensors(load, target.device, load_options));
  for (size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].data = std::move(loaded[i].data);
    tensors[i].sharded = std::move(loaded[i].sharded);
    tensors[i].read_in_place = loaded[i].read_in_place;
  }
  return OkStatus();
}

// Each tensor's path label, and the device dtypes its shards really hold.
void DescribeTransfers(std::vector<PutTensor>& tensors) {
  for (PutTensor& tensor : tensors) {
    const DataPtr& first = tensor.sharded ? tensor.sharded->shards().front() : tensor.data;
    tensor.device_dtype = first->device_dtype();
    if (tensor.sharded) {
      std::vector<std::string_view> dtypes;
      for (const DataPtr& shard : tensor.sharded->shards()) {
        const std::string_view name = DTypeName(shard->device_dtype());
        if (std::find(dtypes.begin(), dtypes.end(), name) == dtypes.end()) dtypes.push_back(name);
      }
      if (dtypes.size() > 1) tensor.mixed_dtypes = fmt::format("{}", fmt::join(dtypes, "/"));
    }
    const HostView& view = tensor.entry.source->view();
    const std::string kind = tensor.read_in_place         ? "read"
                             : first->buffer().is_alias() ? "aliased"
                             : tensor.converted()         ? "converted"
                             : !view.IsNativeByteOrder()  ? "byte-swapped"
                                                          : "direct";
    tensor.path = kind;
  }
}

// --verify: every tensor read back and compared with the file. A tensor stored in another dtype
// may differ (a lossy conversion, which was asked for): it is added to `lossy` as exactly that. A
// tensor stored in its own dtype must match bit for bit, or this returns DataLoss.
Status VerifyAll(const std::vector<PutTensor>& tensors, int64_t total_bytes,
                 std::vector<std::string>& lossy) {
  ProgressBar verify_progress("verify", total_bytes);
  int64_t checked = 0;
  for (const PutTensor& tensor : tensors) {
    FERRY_ASSIGN_OR_RETURN(VerifyResult result, Verify(tensor));
    // Stored in its own dtype, a tensor must come back bit for bit; converted, value for value.
    if (!result.exact && (!tensor.converted() || result.differing != 0)) {
      if (!tensor.converted()) {
        verify_progress.Finish();
        return absl::DataLossError(fmt::format(
            "verify: tensor '{}' of {} read back differently from the file ({} elements "
            "differ, max error {:g})",
            Printable(tensor.entry.name), Printable(tensor.file), result.differing,
            result.max_error));
      }
      lossy.push_back(fmt::format("{} ({} -> {}): {} of {} elements differ, max error {:g}",
                                  Printable(tensor.entry.name), DTypeName(tensor.file_dtype()),
                                  tensor.DeviceDTypeText(), result.differing,
                                  tensor.entry.source->view().num_elements(), result.max_error));
    }
    checked += tensor.bytes;
    verify_progress.Update(checked);
  }
  verify_progress.Finish();
  return OkStatus();
}

int RunPut(const PutOptions& options) {
  constexpr std::string_view kCommand = "put";
  // Every output path is checked before the put starts (not found wrong after it).
  if (!options.json_path.empty()) {
    if (Status writable = CheckOutputPath(options.json_path, "--json", options.files);
        !writable.ok()) {
      return ReportError(kCommand, writable);
    }
  }
  // --mesh all[:BACKEND]: every device of every process of the job, under mpiexec or not.
  if (const std::string mesh_text = options.mesh.value_or("");
      mesh_text == "all" || mesh_text.rfind("all:", 0) == 0) {
    DistributedPutOptions job;
    job.files = options.files;
    if (mesh_text.size() > 4) job.backend = mesh_text.substr(4);
    job.shard_dim = options.shard_dim;
    job.device_dtype = options.device_dtype;
    job.device_dtype_all = options.device_dtype_all;
    job.semantics = options.semantics;
    job.verify = options.verify;
    job.json_path = options.json_path;
    job.drop_page_cache = options.drop_page_cache;
    job.only = options.only;
    job.exclude = options.exclude;
    job.wide = options.wide;
    job.strict = options.strict;
    if (options.vs_memcpy) {
      return ReportError(
          kCommand, InvalidArgumentError("--vs-memcpy times one process's copy of the files: it "
                                         "is not available with --mesh all"));
    }
    return RunPutOverAllDevices(job);
  }
  if (options.drop_page_cache) {
    return ReportError(
        kCommand, InvalidArgumentError("--drop-page-cache measures a job's reads: it needs --mesh "
                                       "all"));
  }
  auto semantics = ParseSemantics(options.semantics);
  if (!semantics.ok()) return ReportError(kCommand, semantics.status());
  std::optional<DType> requested;
  if (!options.device_dtype.empty()) {
    auto dtype = DTypeFromName(options.device_dtype);
    if (!dtype.ok()) return ReportError(kCommand, dtype.status());
    requested = *dtype;
  }
  DeviceSet device_set;
  auto target = ResolveTarget(options, device_set);
  if (!target.ok()) return ReportError(kCommand, target.status());

  // The timed job starts here: opening and mapping the files is part of loading them.
  const auto start = std::chrono::steady_clock::now();
  std::vector<TensorFile> files;
  std::vector<PutTensor> tensors;
  if (Status opened = OpenFiles(options, requested, *target, files, tensors); !opened.ok()) {
    return ReportError(kCommand, opened);
  }
  PutSummary summary;
  for (const PutTensor& tensor : tensors) summary.total_bytes += tensor.bytes;
  if (requested.has_value() &&
      std::none_of(tensors.begin(), tensors.end(),
                   [](const PutTensor& tensor) { return tensor.requested_dtype.has_value(); })) {
    std::vector<DType> held;
    for (const PutTensor& tensor : tensors) held.push_back(tensor.file_dtype());
    if (Status noted = ReportRequestThatAppliesToNothing(*requested, held, options.strict);
        !noted.ok()) {
      return ReportError(kCommand, noted);
    }
  }

  ProgressBar progress("put", summary.total_bytes);
  Status moved = PutAll(files, *target, options, *semantics, tensors, progress);
  progress.Finish();
  if (!moved.ok()) return ReportError(kCommand, moved);
  summary.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  DescribeTransfers(tensors);
  if (options.vs_memcpy) summary.memcpy_seconds = TimeMemcpyOf(files, tensors);

  if (options.verify) {
    if (Status verified = VerifyAll(tensors, summary.total_bytes, summary.lossy); !verified.ok()) {
      return ReportError(kCommand, verified);
    }
    summary.verified = true;
  }

  // With --json -, stdout carries the JSON alone and the report goes to stderr.
  const bool json_to_stdout = options.json_path == "-";
  std::FILE* report_stream = json_to_stdout ? stderr : stdout;
  fmt::print(report_stream, "{}",
             FormatReport(tensors, *target, options, summary, OutputWidth(fileno(report_stream))));
  if (!options.json_path.empty()) {
    const Status written =
        WriteJson(SummaryJson(options, tensors, *target, summary), options.json_path);
    if (!written.ok()) return ReportError(kCommand, written);
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
  auto* mesh =
      command->add_option("--mesh", options->mesh,
                          "Comma-separated devices to shard over (a 1-d mesh), e.g. host:0,host:1; "
                          "or all (all:BACKEND): every device of every process, in process "
                          "order, under mpiexec (docs/distributed.md)");
  device->excludes(mesh);
  command
      ->add_option("--shard-dim", options->shard_dim,
                   "With --mesh: the tensor dim split over the mesh (tensors of lower rank are "
                   "replicated)")
      ->capture_default_str()
      ->check(CLI::Range(0, std::numeric_limits<int>::max()))
      ->needs(mesh);
  command->add_option("--device-dtype", options->device_dtype,
                      "Store the tensors of this dtype's kind as this dtype (e.g. bfloat16: every "
                      "floating-point tensor; integer and bool tensors keep theirs)");
  command->add_flag("--strict", options->strict,
                    "A --device-dtype that applies to no tensor is an error (else a note)");
  command->add_flag("--device-dtype-all", options->device_dtype_all,
                    "Apply --device-dtype to every tensor, whatever its kind");
  command
      ->add_option("--semantics", options->semantics,
                   "copy | async | zero_copy (the host device may then alias the mapped file)")
      ->capture_default_str();
  command->add_flag("--verify", options->verify,
                    "Read every tensor back and compare it with the file itself (a conversion "
                    "that changed values is reported as lossy, with its largest error)");
  command->add_flag("--vs-memcpy", options->vs_memcpy,
                    "After the put, time a single-thread memcpy of the same bytes from the file "
                    "and print vs_memcpy (the memcpy's time over the put's); it adds that "
                    "memcpy to the run");
  command->add_option("--json", options->json_path,
                      "Also write the results as JSON to this file (-: to stdout, the table then "
                      "to stderr)");
  // One pattern per flag (repeat the flag for more): a flag that took several values would also
  // take the file names after it.
  command
      ->add_option("--only", options->only,
                   "Put only the tensors whose names match this glob pattern (* ? [abc] [!abc], "
                   "as Python's fnmatch; * crosses dots); repeatable. A pattern that matches no "
                   "tensor of the files is an error. Only these tensors' bytes are read")
      ->allow_extra_args(false);
  command
      ->add_option("--exclude", options->exclude,
                   "Leave out the tensors whose names match this glob pattern (after --only); "
                   "repeatable. Matching nothing is fine; excluding every tensor is an error")
      ->allow_extra_args(false);
  command->add_flag("--wide", options->wide,
                    "Whole tensor names in the table, however long its lines (by default names "
                    "are shortened to fit the terminal, each kept distinct)");
  command->add_flag("--drop-page-cache", options->drop_page_cache,
                    "With --mesh all: drop the files from the page cache first (posix_fadvise), "
                    "so that the bytes read and made resident are measured from a cold cache");
  return [options] { return RunPut(*options); };
}

}  // namespace ferry::cli
