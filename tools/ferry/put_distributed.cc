#include "tools/ferry/put_distributed.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <set>

#include "ferry/core/copy_convert.h"
#include "ferry/distributed/global_devices.h"
#include "ferry/distributed/process_group.h"
#include "ferry/io/tensor_file.h"
#include "ferry/runtime/dtype_policy.h"
#include "ferry/runtime/file_load.h"
#include "ferry/runtime/sharding.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "nlohmann/json.hpp"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/process_usage.h"
#include "tools/ferry/put_distributed_report.h"
#include "tools/ferry/text_layout.h"

namespace ferry::cli {
namespace {

constexpr std::string_view kCommand = "put";

uint64_t Mix(uint64_t x) {  // splitmix64's finaliser
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A checksum of one shard that adds up across shards: the sum over its elements of a hash of the
// element's global position and its bytes. `dense` holds the shard, dense, in native byte order.
uint64_t ShardChecksum(const HostTensor& dense, const ShardIndex& index, const Dims& global_dims) {
  const int64_t rank = static_cast<int64_t>(global_dims.size());
  const int64_t item = GetDTypeInfo(dense.dtype()).size_bytes;
  int64_t count = 1;
  for (const DimRange& range : index) count *= range.size();
  std::vector<int64_t> global_strides(static_cast<size_t>(rank), 1);
  for (int64_t d = rank - 2; d >= 0; --d) {
    global_strides[d] = global_strides[d + 1] * global_dims[d + 1];
  }
  std::vector<int64_t> position(static_cast<size_t>(rank), 0);
  const auto* bytes = reinterpret_cast<const unsigned char*>(dense.data());
  uint64_t sum = 0;
  for (int64_t i = 0; i < count; ++i) {
    int64_t global = 0;
    for (int64_t d = 0; d < rank; ++d) global += (index[d].begin + position[d]) * global_strides[d];
    uint64_t words[2] = {0, 0};
    std::memcpy(words, bytes + i * item, static_cast<size_t>(std::min<int64_t>(item, 16)));
    sum += Mix(static_cast<uint64_t>(global) ^ Mix(words[0] + 0x9e3779b97f4a7c15ULL) ^
               (Mix(words[1]) << 1));
    for (int64_t d = rank - 1; d >= 0; --d) {  // the next element, row-major
      if (++position[d] < index[d].size()) break;
      position[d] = 0;
    }
  }
  return sum;
}

// Split along `shard_dim` over the mesh axis "all", or replicated (a tensor of lower rank).
std::vector<std::vector<std::string>> SpecFor(const JobTensor& tensor, int shard_dim,
                                              int64_t rank) {
  std::vector<std::vector<std::string>> spec(static_cast<size_t>(rank));
  if (tensor.split) spec[static_cast<size_t>(shard_dim)] = {"all"};
  return spec;
}

void AdviseShardReads(const JobTensor& tensor, const Mesh& mesh, int shard_dim) {
  const HostView& view = tensor.entry.source->view();
  auto sharding = Sharding::Create(mesh, SpecFor(tensor, shard_dim, view.rank()));
  if (sharding.ok()) AdviseExactShardReads(view, *sharding);  // else reported by the transfer
}

// Starts every tensor's sharded transfer (this process's shards only, straight from the mapping)
// and waits for them.
Status SendShards(std::vector<JobTensor>& tensors, const Mesh& mesh, int shard_dim,
                  HostBufferSemantics semantics) {
  // Read exactly the pages of this process's shards: the kernel's read-around past a shard's edge
  // would read other ranks' shards too (docs/distributed.md, "What each process reads").
  for (const JobTensor& tensor : tensors) {
    if (tensor.entry.zero_copy && tensor.split) AdviseShardReads(tensor, mesh, shard_dim);
  }
  TransferToDeviceOptions transfer_options;
  transfer_options.semantics = semantics;
  for (JobTensor& tensor : tensors) {
    FERRY_ASSIGN_OR_RETURN(
        Sharding sharding,
        Sharding::Create(mesh,
                         SpecFor(tensor, shard_dim, static_cast<int64_t>(tensor.dims.size()))));
    transfer_options.device_dtypes = {tensor.device_dtype};
    FERRY_ASSIGN_OR_RETURN(tensor.sharded,
                           TransferShardsToDevice(tensor.entry.source, sharding, transfer_options));
  }
  for (const JobTensor& tensor : tensors) {
    FERRY_RETURN_IF_ERROR(AwaitReady(tensor.sharded->addressable_shards()));
  }
  return OkStatus();
}

// Sends the shards, then checks that no file was truncated under its mapping while they were read
// from it: such pages read as zeros, not as the file (MappedFile::CheckIntact).
Status PutShards(std::vector<JobTensor>& tensors, const std::vector<TensorFile>& files,
                 const Mesh& mesh, int shard_dim, HostBufferSemantics semantics) {
  FERRY_RETURN_IF_ERROR(SendShards(tensors, mesh, shard_dim, semantics));
  for (const TensorFile& file : files) FERRY_RETURN_IF_ERROR(file.file()->CheckIntact());
  return OkStatus();
}

// The shards this process owns for the checksum: of every distinct shard index, the replica at the
// lowest mesh position, when that device is this process's.
std::vector<size_t> OwnedShards(const ShardedData& data) {
  std::vector<size_t> owned;
  for (size_t i = 0; i < data.shards().size(); ++i) {
    bool first = true;
    for (size_t j = 0; j < i && first; ++j) first = data.indices()[j] != data.indices()[i];
    if (first && data.shards()[i] != nullptr) owned.push_back(i);
  }
  return owned;
}

// Bytes of the distinct shards this process's devices hold.
int64_t LocalShardBytes(const ShardedData& data, int64_t item_bytes) {
  std::vector<ShardIndex> seen;
  int64_t bytes = 0;
  for (size_t i = 0; i < data.shards().size(); ++i) {
    if (data.shards()[i] == nullptr) continue;
    if (std::find(seen.begin(), seen.end(), data.indices()[i]) != seen.end()) continue;
    seen.push_back(data.indices()[i]);
    int64_t elements = 1;
    for (const DimRange& range : data.indices()[i]) elements *= range.size();
    bytes += elements * item_bytes;
  }
  return bytes;
}

// Per tensor: {checksum of the file's bytes, checksum of the device data read back} over the
// shards this process owns; summed over the ranks they cover every element once.
StatusOr<std::vector<uint64_t>> LocalChecksums(const std::vector<JobTensor>& tensors) {
  std::vector<uint64_t> sums;
  for (const JobTensor& tensor : tensors) {
    const HostView& view = tensor.entry.source->view();
    uint64_t file_sum = 0;
    uint64_t device_sum = 0;
    const std::vector<size_t> owned = OwnedShards(*tensor.sharded);
    std::vector<DataPtr> handles;
    for (size_t i : owned) handles.push_back(tensor.sharded->shards()[i]);
    FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> back, TransferFromDevice(handles));
    for (size_t k = 0; k < owned.size(); ++k) {
      const ShardIndex& index = tensor.sharded->indices()[owned[k]];
      const HostView file_part = SubView(view, index);
      FERRY_ASSIGN_OR_RETURN(HostTensor expected, HostTensor::Allocate(view.dtype, file_part.dims));
      FERRY_RETURN_IF_ERROR(CopyConvert(file_part, expected.mutable_view()));
      file_sum += ShardChecksum(expected, index, view.dims);
      device_sum += ShardChecksum(back[k], index, view.dims);
    }
    sums.push_back(file_sum);
    sums.push_back(device_sum);
  }
  return sums;
}

// What a rank can get wrong on its own (a flag's value, a backend that does not start here): every
// rank finds it before anything moves, so that the ranks can agree on it.
struct RankSetup {
  HostBufferSemantics semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  std::optional<DType> requested;  // --device-dtype
  std::vector<Device*> local_devices;
};

// `device_set` owns the client of --mesh all's backend.
StatusOr<RankSetup> SetUpRank(const DistributedPutOptions& options, DeviceSet& device_set) {
  RankSetup setup;
  FERRY_ASSIGN_OR_RETURN(setup.semantics, ParseSemantics(options.semantics));
  if (!options.device_dtype.empty()) {
    FERRY_ASSIGN_OR_RETURN(setup.requested, DTypeFromName(options.device_dtype));
  }
  FERRY_ASSIGN_OR_RETURN(Client * client, device_set.GetClient(options.backend));
  const auto devices = client->devices();
  setup.local_devices.assign(devices.begin(), devices.end());
  return setup;
}

// The options every rank must share, one field a line (AgreeOnValue names the first that differs).
std::string CommandLineText(const DistributedPutOptions& options) {
  std::string text;
  for (size_t i = 0; i < options.files.size(); ++i) {
    text += fmt::format("file {}: {}\n", i + 1, Printable(options.files[i]));
  }
  text += fmt::format(
      "backend: {}\n--shard-dim: {}\n--device-dtype: {}\n--device-dtype-all: {}\n"
      "--semantics: {}\n--verify: {}\n--only: {}\n--exclude: {}\n--strict: {}\n"
      "--drop-page-cache: {}",
      options.backend, options.shard_dim, options.device_dtype.empty() ? "-" : options.device_dtype,
      options.device_dtype_all, options.semantics, options.verify, fmt::join(options.only, " "),
      fmt::join(options.exclude, " "), options.strict, options.drop_page_cache);
  return text;
}

// A tensor of the job as the file holds it, with the dtype the devices will hold it in (`file` and
// `file_number` are the caller's to set).
StatusOr<JobTensor> DescribeTensor(const TensorFileEntry& entry, std::optional<DType> requested,
                                   const DistributedPutOptions& options,
                                   const DeviceCapabilities& capabilities) {
  const HostView& view = entry.source->view();
  if (requested.has_value() && !options.device_dtype_all &&
      !RequestAppliesTo(*requested, view.dtype)) {
    requested.reset();
  }
  JobTensor tensor;
  tensor.entry = entry;
  tensor.dims = view.dims;
  tensor.file_dtype = view.dtype;
  FERRY_ASSIGN_OR_RETURN(tensor.device_dtype, ChooseDeviceDType(view.dtype, requested, capabilities,
                                                                entry.source->name()));
  tensor.split = options.shard_dim < view.rank();
  return tensor;
}

// Opens (maps) every file and appends to `tensors` the tensors --only and --exclude select; an
// error when a file cannot be opened, a tensor has no dtype the devices hold, or a pattern matched
// nothing.
Status OpenJobFiles(const DistributedPutOptions& options, std::optional<DType> requested,
                    const DeviceCapabilities& capabilities, std::vector<TensorFile>& files,
                    std::vector<JobTensor>& tensors) {
  TensorSelector selector({}, options.only, options.exclude);
  TensorFileOptions open_options;
  if (!selector.empty()) open_options.selector = &selector;
  for (const std::string& path : options.files) {
    FERRY_ASSIGN_OR_RETURN(TensorFile file, TensorFile::Open(path, open_options));
    for (const TensorFileEntry& entry : file.tensors()) {
      FERRY_ASSIGN_OR_RETURN(JobTensor tensor,
                             DescribeTensor(entry, requested, options, capabilities));
      tensor.file = path;
      tensor.file_number = files.size() + 1;
      tensors.push_back(std::move(tensor));
    }
    files.push_back(std::move(file));
  }
  return selector.CheckEverythingMatched(FilesText(options.files));
}

// --device-dtype that converts no tensor: a note on stderr (from rank 0 only), or with --strict an
// error, as in a one-process put.
Status NoteRequestThatAppliesToNothing(const DistributedPutOptions& options,
                                       std::optional<DType> requested,
                                       const std::vector<JobTensor>& tensors, bool print) {
  if (!requested.has_value() || options.device_dtype_all ||
      std::any_of(tensors.begin(), tensors.end(),
                  [&](const JobTensor& t) { return RequestAppliesTo(*requested, t.file_dtype); })) {
    return OkStatus();
  }
  std::vector<DType> held;
  for (const JobTensor& tensor : tensors) held.push_back(tensor.file_dtype);
  return ReportRequestThatAppliesToNothing(*requested, held, options.strict, print);
}

// A line per tensor, "name: dtype [dims]": the ranks agree on it, so that they put the same
// tensors whatever files each of them opened.
std::string TensorLayout(const std::vector<JobTensor>& tensors) {
  std::string layout;
  for (const JobTensor& tensor : tensors) {
    layout += fmt::format("{}: {} [{}]\n", Printable(tensor.entry.name),
                          DTypeName(tensor.file_dtype), fmt::join(tensor.dims, ","));
  }
  return layout;
}

// This rank's numbers in the job's report: its row of the table, its entry in the JSON.
struct RankNumbers {
  size_t devices = 0;
  int64_t shard_bytes = 0;
  int64_t storage_read_bytes = -1;
  int64_t isolated_read_bytes = -1;  // --drop-page-cache only
  int64_t peak_rss_bytes = -1;
  ResidentMemory peak_memory;
  int64_t anonymous_before_bytes = -1;
  int64_t anonymous_rss_bytes = -1;
  int64_t mapped_file_bytes = 0;
  double seconds = 0;
};

nlohmann::json RankJson(int rank, const RankNumbers& numbers) {
  return {{"rank", rank},
          {"devices", numbers.devices},
          {"shard_bytes", numbers.shard_bytes},
          {"storage_read_bytes", numbers.storage_read_bytes},
          {"isolated_read_bytes", numbers.isolated_read_bytes},
          {"peak_rss_bytes", numbers.peak_rss_bytes},
          {"peak_anonymous_bytes", numbers.peak_memory.anonymous},
          {"peak_file_backed_bytes", numbers.peak_memory.file},
          {"anonymous_before_bytes", numbers.anonymous_before_bytes},
          {"anonymous_rss_bytes", numbers.anonymous_rss_bytes},
          {"mapped_file_bytes", numbers.mapped_file_bytes},
          {"seconds", numbers.seconds}};
}

// Measures this rank's put: its storage reads and memory from construction, made before the start
// barrier (and after --drop-page-cache dropped the files), its time from StartClock, after it.
class PutMeter {
 public:
  void StartClock() { start_ = std::chrono::steady_clock::now(); }

  // Sets `numbers`' time, reads and memory; `paths` are the files, for their mapped bytes.
  void Stop(const std::vector<std::string>& paths, RankNumbers& numbers) {
    numbers.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    numbers.storage_read_bytes = read_before_ < 0 ? -1 : StorageReadBytes() - read_before_;
    numbers.peak_memory = memory_sampler_.Stop();
    numbers.peak_rss_bytes = PeakRssBytes();
    numbers.anonymous_before_bytes = anonymous_before_;
    numbers.anonymous_rss_bytes = CurrentResidentMemory().anonymous;
    numbers.mapped_file_bytes = MappedFileBytes(paths);
  }

 private:
  const int64_t read_before_ = StorageReadBytes();
  const int64_t anonymous_before_ = CurrentResidentMemory().anonymous;
  ResidentMemorySampler memory_sampler_;
  std::chrono::steady_clock::time_point start_;
};

int64_t RankShardBytes(const std::vector<JobTensor>& tensors) {
  int64_t bytes = 0;
  for (const JobTensor& tensor : tensors) {
    if (tensor.sharded == nullptr) continue;  // its put failed
    bytes += LocalShardBytes(*tensor.sharded, GetDTypeInfo(tensor.file_dtype).size_bytes);
  }
  return bytes;
}

int64_t TotalTensorBytes(const std::vector<JobTensor>& tensors) {
  int64_t bytes = 0;
  for (const JobTensor& tensor : tensors) bytes += TensorBytes(tensor);
  return bytes;
}

// What --verify found: a verdict per tensor, and whether every tensor the devices hold at the
// file's dtype matched (a converted tensor may differ without being wrong).
struct Verification {
  std::vector<Verdict> verdicts;
  bool exact = true;
};

// Per tensor, the file's checksum against the devices', each summed over the ranks.
StatusOr<Verification> VerifyOverRanks(distributed::ProcessGroup& group,
                                       const std::vector<JobTensor>& tensors) {
  auto sums = LocalChecksums(tensors);
  FERRY_RETURN_IF_ERROR(distributed::AgreeOnStatus(group, sums.status(), "verifying"));
  FERRY_ASSIGN_OR_RETURN(const std::vector<uint64_t> total,
                         distributed::AllReduceSum(group, *sums, "summing the checksums"));
  Verification verification;
  verification.verdicts.assign(tensors.size(), Verdict::kUnchecked);
  for (size_t t = 0; t < tensors.size(); ++t) {
    const bool match = total[2 * t] == total[2 * t + 1];
    const bool converted = tensors[t].device_dtype != tensors[t].file_dtype;
    verification.verdicts[t] = match       ? Verdict::kMatch
                               : converted ? Verdict::kLossy
                                           : Verdict::kMismatch;
    if (!match && !converted) verification.exact = false;
  }
  return verification;
}

void DropPageCaches(const std::vector<std::string>& paths) {
  for (const std::string& path : paths) DropPageCache(path);
}

// What the files have in the page cache, whoever read it.
int64_t PageCacheBytesOfFiles(const std::vector<std::string>& paths) {
  int64_t bytes = 0;
  for (const std::string& path : paths) bytes += PageCacheBytes(path).value_or(0);
  return bytes;
}

// Lets go of the tensors' mappings and device data (dims and dtypes stay, for the report).
void ReleaseTensors(std::vector<JobTensor>& tensors) {
  for (JobTensor& tensor : tensors) {
    tensor.entry.source.reset();
    tensor.sharded.reset();
  }
}

// One rank's turn of the isolated-read measurement: maps the files again and sends its shards
// again, onto the tensors' described dims and dtypes.
Status SendShardsAgain(const DistributedPutOptions& options, const Mesh& mesh,
                       HostBufferSemantics semantics, std::vector<JobTensor>& tensors) {
  // The same selection as the timed put (OpenJobFiles), so the entries line up with `tensors`.
  TensorSelector selector({}, options.only, options.exclude);
  TensorFileOptions open_options;
  if (!selector.empty()) open_options.selector = &selector;
  std::vector<TensorFile> files;
  for (const std::string& path : options.files) {
    FERRY_ASSIGN_OR_RETURN(TensorFile file, TensorFile::Open(path, open_options));
    files.push_back(std::move(file));
  }
  size_t next = 0;
  for (const TensorFile& file : files) {
    for (const TensorFileEntry& entry : file.tensors()) {
      if (next == tensors.size()) break;
      tensors[next++].entry = entry;
    }
  }
  size_t reopened = 0;
  for (const TensorFile& file : files) reopened += file.tensors().size();
  if (reopened != tensors.size()) {
    return FailedPreconditionError(
        fmt::format("the files changed during the put: {} tensors when measuring the reads, {} "
                    "before",
                    reopened, tensors.size()));
  }
  return SendShards(tensors, mesh, options.shard_dim, semantics);
}

// --drop-page-cache: the bytes this rank reads on its own. The page cache is shared on one
// machine, so concurrent ranks' reads (and the kernel's read-around past a shard's edge) land on
// whoever faults first. Rank by rank: every rank lets go of its mappings (mapped pages cannot be
// dropped), the cache is dropped, that rank alone maps the files and sends its shards again, and
// the files' resident bytes (mincore) are what it read. Untimed. Releases `files` and `tensors`'
// mappings and device data.
StatusOr<int64_t> MeasureIsolatedReads(distributed::ProcessGroup& group,
                                       const DistributedPutOptions& options, const Mesh& mesh,
                                       HostBufferSemantics semantics,
                                       std::vector<TensorFile>& files,
                                       std::vector<JobTensor>& tensors) {
  files.clear();
  ReleaseTensors(tensors);
  Status local;
  int64_t isolated_read = -1;
  // Every rank takes part in every turn, a failed one too: the ranks make the same calls in the
  // same order, and agree on the outcome after the last turn.
  for (int turn = 0; turn < group.size(); ++turn) {
    DropPageCaches(options.files);
    FERRY_RETURN_IF_ERROR(group.Barrier("measuring reads"));
    if (turn == group.rank()) {
      local = SendShardsAgain(options, mesh, semantics, tensors);
      isolated_read = PageCacheBytesOfFiles(options.files);
      ReleaseTensors(tensors);
    }
    FERRY_RETURN_IF_ERROR(group.Barrier("measuring reads"));
  }
  FERRY_RETURN_IF_ERROR(distributed::AgreeOnStatus(group, local, "measuring each rank's reads"));
  return isolated_read;
}

// The job as rank 0 reports it; `ranks` holds every rank's RankJson, in rank order.
StatusOr<JobSummary> SummarizeJob(const DistributedPutOptions& options,
                                  const distributed::GlobalDevices& global, int processes,
                                  const std::vector<std::string>& ranks) {
  JobSummary job;
  job.verify = options.verify;
  job.shard_dim = options.shard_dim;
  job.devices = global.devices().size();
  job.processes = processes;
  for (const Device* device : global.devices()) job.device_names.push_back(global.NameOf(device));
  job.ranks = nlohmann::json::array();
  for (size_t rank = 0; rank < ranks.size(); ++rank) {
    nlohmann::json numbers =
        nlohmann::json::parse(ranks[rank], nullptr, /*allow_exceptions=*/false);
    if (!numbers.is_object() || !numbers.contains("seconds") || !numbers["seconds"].is_number()) {
      return InternalError(fmt::format(
          "rank {} sent no readable result ({} bytes): the ranks' calls went out of step", rank,
          ranks[rank].size()));
    }
    job.seconds = std::max(job.seconds, numbers["seconds"].get<double>());
    job.ranks.push_back(std::move(numbers));
  }
  return job;
}

// The table on stdout, and the JSON with --json (with --json -, the JSON alone on stdout and the
// table on stderr, as a one-process put does). "verified_exact" is true only when every tensor
// came back exactly: a lossy conversion, which --verify accepts, is not exact.
Status PrintJobReport(const std::vector<JobTensor>& tensors, const Verification& verification,
                      const JobSummary& job, const DistributedPutOptions& options) {
  std::FILE* report_stream = options.json_path == "-" ? stderr : stdout;
  fmt::print(report_stream, "{}",
             FormatJobReport(tensors, verification.verdicts, job, options,
                             OutputWidth(fileno(report_stream))));
  std::fflush(report_stream);
  if (options.json_path.empty()) return OkStatus();
  const bool every_tensor_exact =
      verification.exact &&
      std::none_of(verification.verdicts.begin(), verification.verdicts.end(),
                   [](Verdict verdict) { return verdict == Verdict::kLossy; });
  return WriteJson(JobJson(tensors, verification.verdicts, job, options, every_tensor_exact),
                   options.json_path);
}

// The job on this rank. Every error it returns is the same on every rank: what one rank finds on
// its own is agreed on (AgreeOnStatus) before the next collective call.
Status PutOverAllDevices(distributed::ProcessGroup& group, const DistributedPutOptions& options) {
  DeviceSet device_set;
  const StatusOr<RankSetup> setup = SetUpRank(options, device_set);
  FERRY_RETURN_IF_ERROR(distributed::AgreeOnStatus(group, setup.status(), "starting the devices"));
  FERRY_RETURN_IF_ERROR(
      distributed::AgreeOnValue(group, CommandLineText(options), "the command line"));
  FERRY_ASSIGN_OR_RETURN(
      const std::shared_ptr<const distributed::GlobalDevices> global,
      distributed::GlobalDevices::Gather(group, options.backend, setup->local_devices));
  const std::vector<Device*>& mesh_devices = global->devices();
  FERRY_ASSIGN_OR_RETURN(
      const Mesh mesh,
      Mesh::Create(mesh_devices, {static_cast<int64_t>(mesh_devices.size())}, {"all"}));

  if (options.drop_page_cache) DropPageCaches(options.files);
  RankNumbers numbers;
  numbers.devices = setup->local_devices.size();
  PutMeter meter;
  FERRY_RETURN_IF_ERROR(group.Barrier("the start"));
  meter.StartClock();
  std::vector<TensorFile> files;
  std::vector<JobTensor> tensors;
  const Status opened =
      OpenJobFiles(options, setup->requested, mesh_devices.front()->capabilities(), files, tensors);
  FERRY_RETURN_IF_ERROR(distributed::AgreeOnStatus(group, opened, "opening the files"));
  // Every rank holds the same tensors and options (agreed above): each finds the same answer.
  FERRY_RETURN_IF_ERROR(
      NoteRequestThatAppliesToNothing(options, setup->requested, tensors, group.rank() == 0));
  FERRY_RETURN_IF_ERROR(
      distributed::AgreeOnValue(group, TensorLayout(tensors), "the files' tensors"));
  const Status put = PutShards(tensors, files, mesh, options.shard_dim, setup->semantics);
  meter.Stop(options.files, numbers);
  numbers.shard_bytes = RankShardBytes(tensors);
  FERRY_RETURN_IF_ERROR(distributed::AgreeOnStatus(group, put, "putting the tensors"));

  Verification verification;
  verification.verdicts.assign(tensors.size(), Verdict::kUnchecked);
  if (options.verify) {
    FERRY_ASSIGN_OR_RETURN(verification, VerifyOverRanks(group, tensors));
  }
  // The union of what every rank read (or found in the cache).
  FERRY_RETURN_IF_ERROR(group.Barrier("the end of the reads"));
  const int64_t resident_after = PageCacheBytesOfFiles(options.files);
  if (options.drop_page_cache) {
    FERRY_ASSIGN_OR_RETURN(
        numbers.isolated_read_bytes,
        MeasureIsolatedReads(group, options, mesh, setup->semantics, files, tensors));
  }

  // One report for the job, printed by rank 0 from every rank's numbers.
  FERRY_ASSIGN_OR_RETURN(
      const std::vector<std::string> ranks,
      group.AllGather(RankJson(group.rank(), numbers).dump(), "gathering the results"));
  if (group.rank() == 0) {
    FERRY_ASSIGN_OR_RETURN(JobSummary job, SummarizeJob(options, *global, group.size(), ranks));
    job.total_bytes = TotalTensorBytes(tensors);
    job.resident_after = resident_after;
    FERRY_RETURN_IF_ERROR(PrintJobReport(tensors, verification, job, options));
  }
  if (options.verify && !verification.exact) {
    return absl::DataLossError(
        "verify: a tensor's global checksum differs from the file's (see the report)");
  }
  return OkStatus();
}

}  // namespace

int RunPutOverAllDevices(const DistributedPutOptions& options) {
  auto initialized = distributed::Initialize();
  if (!initialized.ok()) return ReportError(kCommand, initialized.status());
  // MPI is finalized on every way out (not after a peer was lost: that would wait for it).
  struct Finalizer {
    ~Finalizer() { distributed::Finalize(); }
  } finalizer;
  const Status status = PutOverAllDevices(**initialized, options);
  if (!status.ok()) return ReportError(kCommand, status);
  return kExitOk;
}

}  // namespace ferry::cli
