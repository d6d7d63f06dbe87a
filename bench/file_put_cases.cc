#include "file_put_cases.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/io/sample_checkpoint.h"
#include "ferry/io/tensor_file.h"
#include "fmt/format.h"

namespace ferry::bench {
namespace {

// The loaders bench/loader_peers.py times, in its order.
constexpr const char* kSafetensorsLoaders[] = {"safetensors_numpy", "safetensors_pt"};
constexpr const char* kTorchLoader = "torch_load";

// Threads that fault the mapped file in before the transfers start (TensorFile::Prefetch), as
// `ferry put` does. Even with the file in the page cache every 4 KiB page of a fresh mapping costs
// a minor fault; taking them from every core at once, ahead of the copies, keeps them out of the
// copy loops.
int PrefetchThreads() { return std::max(1, static_cast<int>(std::thread::hardware_concurrency())); }

class TemporaryFile {
 public:
  explicit TemporaryFile(std::string path) : path_(std::move(path)) {}
  ~TemporaryFile() { std::remove(path_.c_str()); }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string TemporaryPath(std::string_view tag) {
  const char* directory = std::getenv("TMPDIR");
  return fmt::format("{}/ferry-bench-{}-{}.safetensors",
                     directory != nullptr && *directory != '\0' ? directory : "/tmp", getpid(),
                     tag);
}

// Writes the file's dirty pages to disk, so that write-back does not run during the timed runs
// (the pages stay in the page cache).
Status SyncFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return InternalError(fmt::format("open {}: {}", path, std::strerror(errno)));
  const int result = fsync(fd);
  const int error = errno;
  close(fd);
  if (result != 0) return InternalError(fmt::format("fsync {}: {}", path, std::strerror(error)));
  return OkStatus();
}

// One load: open (map and validate), prefetch, every tensor put in its own dtype, wait; the file
// is unmapped before Run returns (the copy semantics have read every source by then).
class FilePutPath final : public DeviceHandlesPath {
 public:
  FilePutPath(std::string path, Device* device) : path_(std::move(path)), device_(device) {}

  Status Run() override {
    FERRY_ASSIGN_OR_RETURN(TensorFile file, TensorFile::Open(path_));
    file.Prefetch(PrefetchThreads());
    std::vector<std::shared_ptr<const TensorSource>> sources;
    TransferToDeviceOptions options;
    options.semantics = kBenchSemantics;
    for (const TensorFileEntry& entry : file.tensors()) {
      sources.push_back(entry.source);
      options.device_dtypes.push_back(entry.source->view().dtype);
    }
    FERRY_ASSIGN_OR_RETURN(handles_, TransferToDevice(sources, device_, options));
    return AwaitReady(handles_);
  }

 private:
  const std::string path_;
  Device* const device_;
};

std::string FormatRatio(const Json& ratio) {
  return ratio.is_null() ? "n/a" : fmt::format("{:.2f}x", ratio.get<double>());
}

// Runs bench/loader_peers.py on `path` and adds to `row`: `loaders` (its rows), for each loader
// vs_<loader> (the loader's median time over ferry's, or null), vs_safetensors (the smaller of
// the two safetensors ratios) and vs_torch_load, and `loaders_null_reasons` for every null ratio.
void AddLoaderComparisons(const CaseContext& context, const std::string& path, int64_t bytes,
                          Json& row, std::string& notes) {
  const char* loaders[] = {kSafetensorsLoaders[0], kSafetensorsLoaders[1], kTorchLoader};
  Json reasons = Json::object();
  for (const char* loader : loaders) row[fmt::format("vs_{}", loader)] = nullptr;
  row["vs_safetensors"] = nullptr;
  if (context.python.empty()) {
    for (const char* loader : loaders) reasons[loader] = "not run: pass --python PY";
    row["loaders_null_reasons"] = std::move(reasons);
    AddNote(notes, "real loaders not run (--python)");
    return;
  }
  StatusOr<Json> results =
      RunPythonScript(context.python, "loader_peers.py",
                      fmt::format("--file '{}' --repeats {}", path, context.repeats));
  if (!results.ok()) {
    const std::string reason(results.status().message());
    for (const char* loader : loaders) reasons[loader] = reason;
    row["loaders_null_reasons"] = std::move(reasons);
    AddNote(notes, "real loaders FAILED: " + reason);
    return;
  }
  const double seconds = row["seconds_median"].get<double>();
  for (const Json& result : *results) {
    const std::string loader = result.value("loader", "");
    const std::string key = "vs_" + loader;
    if (!row.contains(key)) continue;
    if (!result["error"].is_null()) {
      reasons[loader] = result["error"];
    } else if (result["bytes"].get<int64_t>() != bytes) {
      reasons[loader] = fmt::format("it loaded {} bytes; the file holds {}",
                                    result["bytes"].get<int64_t>(), bytes);
    } else {
      row[key] = result["seconds_median"].get<double>() / seconds;
    }
  }
  for (const char* loader : kSafetensorsLoaders) {
    const Json& ratio = row[fmt::format("vs_{}", loader)];
    if (!ratio.is_null() && (row["vs_safetensors"].is_null() || ratio < row["vs_safetensors"])) {
      row["vs_safetensors"] = ratio;
    }
  }
  for (const char* loader : loaders) {
    if (row[fmt::format("vs_{}", loader)].is_null() && !reasons.contains(loader)) {
      reasons[loader] = "loader_peers.py reported no result";
    }
  }
  row["loaders"] = *std::move(results);
  row["loaders_null_reasons"] = reasons;
  AddNote(notes,
          fmt::format("vs safetensors np {} pt {}; vs torch.load {}",
                      FormatRatio(row["vs_safetensors_numpy"]),
                      FormatRatio(row["vs_safetensors_pt"]), FormatRatio(row["vs_torch_load"])));
}

// One open of a safetensors file of many tiny tensors: TensorFile::Open alone (read the header,
// parse it, validate every entry and the layout, map the file); nothing is put on a device. The
// results, for the check, are each tensor's bytes as the parse located them.
class FileParsePath final : public Path {
 public:
  explicit FileParsePath(std::string path) : path_(std::move(path)) {}

  Status Run() override {
    FERRY_ASSIGN_OR_RETURN(TensorFile file, TensorFile::Open(path_));
    file_ = std::move(file);
    return OkStatus();
  }
  StatusOr<std::vector<HostTensor>> TakeResultsOnHost() override {
    if (!file_.has_value()) return InternalError("no file was opened");
    std::vector<HostTensor> results;
    for (const TensorFileEntry& entry : file_->tensors()) {
      const HostView& view = entry.source->view();
      FERRY_ASSIGN_OR_RETURN(HostTensor copy, HostTensor::Allocate(view.dtype, view.dims));
      std::memcpy(copy.data(), view.data, static_cast<size_t>(view.dense_size_bytes()));
      results.push_back(std::move(copy));
    }
    return results;
  }
  void Release() override { file_.reset(); }

 private:
  const std::string path_;
  std::optional<TensorFile> file_;
};

// A safetensors file of `count` one-element f32 tensors, named so that the header's (sorted) order
// is the reverse of the data order, as a hostile or merely huge header might be.
Status WriteManyTensorFile(const std::string& path, int64_t count) {
  std::string header = "{";
  std::string data(static_cast<size_t>(count) * 4, '\0');
  for (int64_t i = 0; i < count; ++i) {
    const int64_t slot = count - 1 - i;
    fmt::format_to(std::back_inserter(header),
                   R"({}"layer.{:07}.weight":{{"dtype":"F32","shape":[1],"data_offsets":[{},{}]}})",
                   i == 0 ? "" : ",", i, slot * 4, slot * 4 + 4);
    const float value = static_cast<float>(slot);
    std::memcpy(data.data() + slot * 4, &value, 4);
  }
  header += "}";
  header.resize((header.size() + 7) / 8 * 8, ' ');
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) return InternalError(fmt::format("open {}: {}", path, std::strerror(errno)));
  const uint64_t header_size = header.size();
  const bool written = std::fwrite(&header_size, 8, 1, file) == 1 &&
                       std::fwrite(header.data(), 1, header.size(), file) == header.size() &&
                       std::fwrite(data.data(), 1, data.size(), file) == data.size();
  if (std::fclose(file) != 0 || !written) {
    return InternalError(fmt::format("write {}: {}", path, std::strerror(errno)));
  }
  return SyncFile(path);
}

// Runs `loader_peers.py --parse-only` on `path` and adds vs_safetensors_open (the safetensors
// package's open of the same file over ferry's time) to `row`.
void AddParseComparison(const CaseContext& context, const std::string& path, int64_t tensors,
                        Json& row, std::string& notes) {
  row["vs_safetensors_open"] = nullptr;
  if (context.python.empty()) {
    AddNote(notes, "safetensors not run (--python)");
    return;
  }
  StatusOr<Json> results =
      RunPythonScript(context.python, "loader_peers.py",
                      fmt::format("--file '{}' --repeats {} --parse-only", path, context.repeats));
  if (!results.ok() || results->empty() || !(*results)[0]["error"].is_null() ||
      (*results)[0]["tensors"].get<int64_t>() != tensors) {
    AddNote(notes, "safetensors FAILED: " +
                       (results.ok() ? results->dump() : results.status().ToString()));
    return;
  }
  const double peer_seconds = (*results)[0]["seconds_median"].get<double>();
  row["vs_safetensors_open"] = peer_seconds / row["seconds_median"].get<double>();
  row["loaders"] = *std::move(results);
  AddNote(notes, fmt::format("safetensors safe_open {:.3f} s: {:.2f}x ferry's time", peer_seconds,
                             row["vs_safetensors_open"].get<double>()));
}

}  // namespace

StatusOr<PreparedCase> PrepareFileParseManyTensors(const CaseContext& context) {
  const int64_t count = ScaledCount(200'000, context.scale, 1000);
  auto file = std::make_shared<TemporaryFile>(TemporaryPath("many"));
  FERRY_RETURN_IF_ERROR(WriteManyTensorFile(file->path(), count));
  FERRY_ASSIGN_OR_RETURN(TensorFile opened, TensorFile::Open(file->path()));
  PreparedCase prepared;
  for (const TensorFileEntry& entry : opened.tensors()) {
    prepared.bytes += entry.source->view().dense_size_bytes();
    prepared.unconverted_sources.push_back(entry.source);
  }
  prepared.tensors = count;
  prepared.ferry = std::make_unique<FileParsePath>(file->path());
  prepared.no_staged_note = "no staged path: a parse, compared with the safetensors package's";
  prepared.details["file_format"] = "safetensors";
  prepared.details["file_bytes"] = opened.file_size();
  prepared.details["header_bytes"] = opened.file_size() - prepared.bytes - 8;
  prepared.after_timing = [context, file, count](Json& row, std::string& notes) {
    AddParseComparison(context, file->path(), count, row, notes);
  };
  prepared.keep_alive = std::move(file);
  return prepared;
}

StatusOr<PreparedCase> PrepareFilePutSafetensors(const CaseContext& context, DType float_dtype) {
  if (!context.device->capabilities().Holds(float_dtype)) {
    return Skipped(
        fmt::format("{} does not hold {}", context.device->name(), DTypeName(float_dtype)));
  }
  const int64_t target_bytes = ScaledCount(1024 * kMiB, context.scale, kMiB);
  FERRY_ASSIGN_OR_RETURN(const std::vector<SampleTensor> plan,
                         PlanSampleCheckpoint(target_bytes, /*hidden=*/0, float_dtype));
  auto file = std::make_shared<TemporaryFile>(TemporaryPath(DTypeName(float_dtype)));
  FERRY_RETURN_IF_ERROR(
      WriteSampleSafetensors(file->path(), plan, {{"format", "pt"}, {"generator", "ferry-bench"}}));
  FERRY_RETURN_IF_ERROR(SyncFile(file->path()));

  // The verification's view of the file; reading it all once also warms the page cache.
  FERRY_ASSIGN_OR_RETURN(TensorFile opened, TensorFile::Open(file->path()));
  opened.Prefetch(PrefetchThreads());
  PreparedCase prepared;
  std::map<std::string, int64_t> dtype_counts;
  for (const TensorFileEntry& entry : opened.tensors()) {
    prepared.bytes += entry.source->view().dense_size_bytes();
    ++dtype_counts[std::string(DTypeName(entry.source->view().dtype))];
    prepared.unconverted_sources.push_back(entry.source);
  }
  prepared.tensors = static_cast<int64_t>(opened.tensors().size());
  prepared.ferry = std::make_unique<FilePutPath>(file->path(), context.device);
  prepared.no_staged_note = "no staged path: compared with the real loaders instead";
  prepared.details["file_format"] = "safetensors";
  prepared.details["file_bytes"] = opened.file_size();
  prepared.details["file_dtypes"] = dtype_counts;
  prepared.details["device_dtype"] = "as stored";
  prepared.details["semantics"] = std::string(HostBufferSemanticsName(kBenchSemantics));
  prepared.details["prefetch_threads"] = PrefetchThreads();
  const int64_t bytes = prepared.bytes;
  prepared.after_timing = [context, file, bytes](Json& row, std::string& notes) {
    AddLoaderComparisons(context, file->path(), bytes, row, notes);
  };
  prepared.keep_alive = std::move(file);
  return prepared;
}

}  // namespace ferry::bench
