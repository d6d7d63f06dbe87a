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

// Starts every tensor's sharded transfer (this process's shards only) and waits for them.
Status SendShards(std::vector<JobTensor>& tensors, const Mesh& mesh, int shard_dim,
                  HostBufferSemantics semantics) {
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

bool RequestApplies(DType requested, DType source) {
  const auto integer = [](DTypeKind kind) {
    return kind == DTypeKind::kSignedInt || kind == DTypeKind::kUnsignedInt;
  };
  const DTypeKind a = GetDTypeInfo(requested).kind;
  const DTypeKind b = GetDTypeInfo(source).kind;
  return a == b || (integer(a) && integer(b));
}

}  // namespace

int RunPutOverAllDevices(const DistributedPutOptions& options) {
  auto initialized = distributed::Initialize();
  if (!initialized.ok()) return ReportError(kCommand, initialized.status());
  distributed::ProcessGroup& group = **initialized;
  // MPI is finalized on every way out (not after a peer was lost: that would wait for it).
  struct Finalizer {
    ~Finalizer() { distributed::Finalize(); }
  } finalizer;
  const auto agree = [&](const Status& local, std::string_view step) {
    return distributed::AgreeOnStatus(group, local, step);
  };

  // Everything a rank can get wrong on its own is agreed on before anything moves.
  Status local;
  HostBufferSemantics semantics = HostBufferSemantics::kImmutableUntilTransferCompletes;
  if (options.semantics == "copy") {
    semantics = HostBufferSemantics::kImmutableOnlyDuringCall;
  } else if (options.semantics == "zero_copy") {
    semantics = HostBufferSemantics::kImmutableZeroCopy;
  } else if (options.semantics != "async") {
    local = InvalidArgumentError(
        fmt::format("--semantics must be copy, async or zero_copy, not '{}'", options.semantics));
  }
  std::optional<DType> requested;
  if (!options.device_dtype.empty()) {
    auto dtype = DTypeFromName(options.device_dtype);
    if (dtype.ok()) {
      requested = *dtype;
    } else if (local.ok()) {
      local = dtype.status();
    }
  }
  DeviceSet device_set;
  std::vector<Device*> local_devices;
  if (local.ok()) {
    auto client = device_set.GetClient(options.backend);
    if (client.ok()) {
      const auto devices = (*client)->devices();
      local_devices.assign(devices.begin(), devices.end());
    } else {
      local = client.status();
    }
  }
  if (Status agreed = agree(local, "starting the devices"); !agreed.ok()) {
    return ReportError(kCommand, agreed);
  }
  // One field a line (AgreeOnValue names the first that differs).
  std::string plan;
  for (size_t i = 0; i < options.files.size(); ++i) {
    plan += fmt::format("file {}: {}\n", i + 1, Printable(options.files[i]));
  }
  plan += fmt::format(
      "backend: {}\n--shard-dim: {}\n--device-dtype: {}\n--device-dtype-all: {}\n"
      "--semantics: {}\n--verify: {}\n--only: {}\n--exclude: {}",
      options.backend, options.shard_dim, options.device_dtype.empty() ? "-" : options.device_dtype,
      options.device_dtype_all, options.semantics, options.verify, fmt::join(options.only, " "),
      fmt::join(options.exclude, " "));
  if (Status agreed = distributed::AgreeOnValue(group, plan, "the command line"); !agreed.ok()) {
    return ReportError(kCommand, agreed);
  }
  auto global = distributed::GlobalDevices::Gather(group, options.backend, local_devices);
  if (!global.ok()) return ReportError(kCommand, global.status());
  const std::vector<Device*>& mesh_devices = (*global)->devices();
  auto mesh = Mesh::Create(mesh_devices, {static_cast<int64_t>(mesh_devices.size())}, {"all"});
  if (!mesh.ok()) return ReportError(kCommand, mesh.status());

  if (options.drop_page_cache) {
    for (const std::string& path : options.files) DropPageCache(path);
  }
  const int64_t read_before = StorageReadBytes();
  const int64_t anonymous_before = CurrentResidentMemory().anonymous;
  ResidentMemorySampler memory_sampler;
  if (Status ready = group.Barrier("the start"); !ready.ok()) return ReportError(kCommand, ready);
  const auto start = std::chrono::steady_clock::now();

  // Open (map) every file; a file that one rank cannot open stops every rank.
  std::vector<TensorFile> files;
  std::vector<JobTensor> tensors;
  // A line per tensor, "name: dtype [dims]": the same files on every rank.
  std::string layout;
  TensorSelector selector({}, options.only, options.exclude);
  TensorFileOptions open_options;
  if (!selector.empty()) open_options.selector = &selector;
  for (const std::string& path : options.files) {
    auto file = TensorFile::Open(path, open_options);
    if (!file.ok()) {
      local = file.status();
      break;
    }
    for (const TensorFileEntry& entry : file->tensors()) {
      JobTensor tensor;
      tensor.file = path;
      tensor.file_number = files.size() + 1;
      tensor.entry = entry;
      const HostView& view = entry.source->view();
      tensor.dims = view.dims;
      tensor.file_dtype = view.dtype;
      std::optional<DType> wanted = requested;
      if (wanted.has_value() && !options.device_dtype_all && !RequestApplies(*wanted, view.dtype)) {
        wanted.reset();
      }
      auto dtype = ChooseDeviceDType(view.dtype, wanted, mesh_devices.front()->capabilities(),
                                     entry.source->name());
      if (!dtype.ok()) {
        local = dtype.status();
        break;
      }
      tensor.device_dtype = *dtype;
      tensor.split = options.shard_dim < view.rank();
      layout += fmt::format("{}: {} [{}]\n", Printable(entry.name), DTypeName(view.dtype),
                            fmt::join(view.dims, ","));
      tensors.push_back(std::move(tensor));
    }
    files.push_back(*std::move(file));
    if (!local.ok()) break;
  }
  if (local.ok()) local = selector.CheckEverythingMatched(FilesText(options.files));
  if (Status agreed = agree(local, "opening the files"); !agreed.ok()) {
    return ReportError(kCommand, agreed);
  }
  if (Status agreed = distributed::AgreeOnValue(group, layout, "the files' tensors");
      !agreed.ok()) {
    return ReportError(kCommand, agreed);
  }

  // Read exactly the pages of this process's shards (AdviseExactShardReads): the kernel's
  // read-around past a shard's edge would read other ranks' shards too. Measured on this machine
  // (1 GiB sample, 2 ranks, cold cache): each rank alone read 1006 MiB for its 504 MiB of shards
  // with the kernel's read-around, 504.4 MiB with the advice (docs/distributed.md).
  for (const JobTensor& tensor : tensors) {
    if (!tensor.entry.zero_copy || !tensor.split) continue;
    AdviseShardReads(tensor, *mesh, options.shard_dim);
  }
  // Each rank sends its own devices their shards, straight from the mapping.
  local = SendShards(tensors, *mesh, options.shard_dim, semantics);
  int64_t shard_bytes = 0;
  int64_t total_bytes = 0;
  for (const JobTensor& tensor : tensors) {
    if (tensor.sharded != nullptr) {
      shard_bytes += LocalShardBytes(*tensor.sharded, GetDTypeInfo(tensor.file_dtype).size_bytes);
    }
    total_bytes += TensorBytes(tensor);
  }
  for (const JobTensor& tensor : tensors) {
    if (!local.ok() || tensor.sharded == nullptr) break;
    local = AwaitReady(tensor.sharded->addressable_shards());
  }
  for (const TensorFile& file : files) {
    if (local.ok()) local = file.file()->CheckIntact();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t read_bytes = read_before < 0 ? -1 : StorageReadBytes() - read_before;
  const ResidentMemory peak_memory = memory_sampler.Stop();
  const int64_t peak_rss = PeakRssBytes();
  const int64_t anonymous_rss = CurrentResidentMemory().anonymous;
  const int64_t mapped_bytes = MappedFileBytes(options.files);
  if (Status agreed = agree(local, "putting the tensors"); !agreed.ok()) {
    return ReportError(kCommand, agreed);
  }

  // --verify: per tensor, the file's checksum and the devices' summed over the ranks.
  std::vector<Verdict> verdicts(tensors.size(), Verdict::kUnchecked);
  bool verified_exact = true;
  if (options.verify) {
    auto sums = LocalChecksums(tensors);
    if (Status agreed = agree(sums.status(), "verifying"); !agreed.ok()) {
      return ReportError(kCommand, agreed);
    }
    auto total = distributed::AllReduceSum(group, *sums, "summing the checksums");
    if (!total.ok()) return ReportError(kCommand, total.status());
    for (size_t t = 0; t < tensors.size(); ++t) {
      const bool match = (*total)[2 * t] == (*total)[2 * t + 1];
      const bool converted = tensors[t].device_dtype != tensors[t].file_dtype;
      verdicts[t] = match ? Verdict::kMatch : converted ? Verdict::kLossy : Verdict::kMismatch;
      if (!match && !converted) verified_exact = false;
    }
  }

  // The union of what every rank read (or found in the cache).
  if (Status ready = group.Barrier("the end of the reads"); !ready.ok()) {
    return ReportError(kCommand, ready);
  }
  int64_t resident = 0;
  for (const std::string& path : options.files) resident += PageCacheBytes(path).value_or(0);

  // --drop-page-cache: what each rank reads on its own. The page cache is shared on one machine,
  // so concurrent ranks' reads (and the kernel's read-around past a shard's edge) land on whoever
  // faults first. Rank by rank: every rank lets go of its mappings (mapped pages cannot be
  // dropped), the cache is dropped, that rank alone maps the files and sends its shards again,
  // and the files' resident bytes (mincore) are what it read. Untimed.
  int64_t isolated_read = -1;
  if (options.drop_page_cache) {
    files.clear();
    for (JobTensor& tensor : tensors) {
      tensor.entry.source.reset();
      tensor.sharded.reset();
    }
    for (int turn = 0; turn < group.size() && local.ok(); ++turn) {
      for (const std::string& path : options.files) DropPageCache(path);
      if (Status ready = group.Barrier("measuring reads"); !ready.ok()) {
        return ReportError(kCommand, ready);
      }
      if (turn == group.rank()) {
        std::vector<TensorFile> again;
        for (const std::string& path : options.files) {
          auto file = TensorFile::Open(path);
          if (!file.ok()) {
            local = file.status();
            break;
          }
          again.push_back(*std::move(file));
        }
        size_t next = 0;
        for (const TensorFile& file : again) {
          for (const TensorFileEntry& entry : file.tensors()) tensors[next++].entry = entry;
        }
        for (const JobTensor& tensor : tensors) {
          if (local.ok() && tensor.entry.zero_copy && tensor.split) {
            AdviseShardReads(tensor, *mesh, options.shard_dim);
          }
        }
        if (local.ok()) local = SendShards(tensors, *mesh, options.shard_dim, semantics);
        isolated_read = 0;
        for (const std::string& path : options.files)
          isolated_read += PageCacheBytes(path).value_or(0);
        for (JobTensor& tensor : tensors) {
          tensor.entry.source.reset();
          tensor.sharded.reset();
        }
      }
      if (Status done = group.Barrier("measuring reads"); !done.ok()) {
        return ReportError(kCommand, done);
      }
    }
    if (Status agreed = agree(local, "measuring each rank's reads"); !agreed.ok()) {
      return ReportError(kCommand, agreed);
    }
  }

  // One report for the job, printed by rank 0 from every rank's numbers.
  nlohmann::json mine = {{"rank", group.rank()},
                         {"devices", local_devices.size()},
                         {"shard_bytes", shard_bytes},
                         {"storage_read_bytes", read_bytes},
                         {"isolated_read_bytes", isolated_read},
                         {"peak_rss_bytes", peak_rss},
                         {"peak_anonymous_bytes", peak_memory.anonymous},
                         {"peak_file_backed_bytes", peak_memory.file},
                         {"anonymous_before_bytes", anonymous_before},
                         {"anonymous_rss_bytes", anonymous_rss},
                         {"mapped_file_bytes", mapped_bytes},
                         {"seconds", seconds}};
  auto gathered = group.AllGather(mine.dump(), "gathering the results");
  if (!gathered.ok()) return ReportError(kCommand, gathered.status());
  if (group.rank() == 0) {
    JobSummary job;
    job.verify = options.verify;
    job.shard_dim = options.shard_dim;
    job.devices = mesh_devices.size();
    job.processes = group.size();
    for (const Device* device : mesh_devices) job.device_names.push_back((*global)->NameOf(device));
    job.total_bytes = total_bytes;
    job.resident_after = resident;
    job.ranks = nlohmann::json::array();
    for (const std::string& text : *gathered) {
      job.ranks.push_back(nlohmann::json::parse(text));
      job.seconds = std::max(job.seconds, job.ranks.back()["seconds"].get<double>());
    }
    fmt::print("{}", FormatJobReport(tensors, verdicts, job, options, OutputWidth(STDOUT_FILENO)));
    std::fflush(stdout);
    if (!options.json_path.empty()) {
      const nlohmann::json json = JobJson(tensors, verdicts, job, options, verified_exact);
      if (Status written = WriteJson(json, options.json_path); !written.ok()) {
        return ReportError(kCommand, written);
      }
    }
  }
  if (options.verify && !verified_exact) {
    return ReportError(kCommand, absl::DataLossError("verify: a tensor's global checksum differs "
                                                     "from the file's (see the report)"));
  }
  return kExitOk;
}

}  // namespace ferry::cli
