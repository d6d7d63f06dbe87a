#include "tools/ferry/put_distributed_report.h"

#include <algorithm>
#include <limits>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/tensor_table.h"
#include "tools/ferry/text_layout.h"

namespace ferry::cli {
namespace {

// Bytes in at most 10 characters ("1008.2 MiB"), "?" where a rank could not tell.
std::string ShortBytes(int64_t bytes) {
  if (bytes < 0) return "?";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024 && unit < 4) {
    value /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", value, units[unit]);
}

}  // namespace

// The job's report for `width` columns, laid out like the one-process put (RenderTensorTable,
// WrapToString): the tensors (names shortened apart, or whole on lines of their own; a file
// column when there are several files; where each tensor went), a row per rank (numbers stay
// whole: nine columns fit 80), then the devices by their names in the job, the totals and the
// verify verdicts (a line for every tensor that does not match), each on lines of their own.
std::string FormatJobReport(const std::vector<JobTensor>& tensors,
                            const std::vector<Verdict>& verdicts, const JobSummary& job,
                            const DistributedPutOptions& options, int width) {
  using Align = TextTable::Align;
  const bool several_files = options.files.size() > 1;
  std::vector<TextTable::Column> columns;
  if (several_files) columns.push_back({"file", Align::kRight, -1});
  columns.push_back({"shape", Align::kLeft, 0, 9});
  columns.push_back({"dtype", Align::kLeft, -1});
  columns.push_back({"placement", Align::kLeft, -1});
  columns.push_back({"size", Align::kRight, -1});
  const auto dtypes = [](const JobTensor& tensor) {
    return fmt::format("{} -> {}", DTypeName(tensor.file_dtype), DTypeName(tensor.device_dtype));
  };
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> rows;
  for (const JobTensor& tensor : tensors) {
    names.push_back(Printable(tensor.entry.name));
    std::vector<std::string> row;
    if (several_files) row.push_back(fmt::format("{}", tensor.file_number));
    row.push_back(fmt::format("[{}]", fmt::join(tensor.dims, ",")));
    row.push_back(DTypeCell(DTypeName(tensor.file_dtype), DTypeName(tensor.device_dtype)));
    row.push_back(tensor.split ? "sharded" : "replicated");
    row.push_back(FormatBytes(static_cast<double>(TensorBytes(tensor))));
    rows.push_back(std::move(row));
  }
  std::string out = RenderPutTable(names, columns, rows, width, options.wide, options.files);
  const int text_width = options.wide ? std::numeric_limits<int>::max() : width;
  const auto add = [&](const std::string& text) { out += WrapToString(text, text_width) + "\n"; };
  add(
      fmt::format("sharded: dim {} split over the {} devices of the mesh, each rank reading only "
                  "its own shards; replicated: whole on every device (tensors of rank {} or less)",
                  job.shard_dim, job.devices, job.shard_dim));
  out += "\n";

  TextTable ranks({{"rank", Align::kRight, -1},
                   {"dev", Align::kRight, -1},
                   {"shards", Align::kRight, -1},
                   {"read", Align::kRight, -1},
                   {"alone", Align::kRight, -1},
                   {"anon peak", Align::kRight, -1},
                   {"file peak", Align::kRight, -1},
                   {"time s", Align::kRight, -1},
                   {"GB/s", Align::kRight, -1}});
  for (const nlohmann::json& rank : job.ranks) {
    const double seconds = rank["seconds"].get<double>();
    const int64_t shard_bytes = rank["shard_bytes"].get<int64_t>();
    ranks.AddRow({fmt::format("{}", rank["rank"].get<int>()),
                  fmt::format("{}", rank["devices"].get<int64_t>()), ShortBytes(shard_bytes),
                  ShortBytes(rank["storage_read_bytes"].get<int64_t>()),
                  ShortBytes(rank["isolated_read_bytes"].get<int64_t>()),
                  ShortBytes(rank["peak_anonymous_bytes"].get<int64_t>()),
                  ShortBytes(rank["peak_file_backed_bytes"].get<int64_t>()),
                  fmt::format("{:.3f}", seconds),
                  fmt::format("{:.2f}", seconds > 0 ? shard_bytes / seconds / 1e9 : 0.0)});
  }
  out += ranks.Render(text_width);
  add("read: from storage during the put (a page shared by ranks counts once, for whoever read it "
      "first); alone: what the rank reads with no other rank running (--drop-page-cache); anon "
      "peak, file peak: its resident memory at its largest during the put, anonymous (heap, "
      "device buffers) and file-backed (mapped pages of the file, read by it or by another rank, "
      "and of the libraries)");
  add(fmt::format("devices: {}", fmt::join(job.device_names, ", ")));
  add(fmt::format("total: {} tensor{}, {} on {} device{} of {} process{}", tensors.size(),
                  tensors.size() == 1 ? "" : "s", FormatBytes(static_cast<double>(job.total_bytes)),
                  job.devices, job.devices == 1 ? "" : "s", job.processes,
                  job.processes == 1 ? "" : "es"));
  add(fmt::format("in {:.3f} s = {:.2f} GB/s aggregate; file pages resident after the run: {}",
                  job.seconds, job.aggregate_gbps(),
                  FormatBytes(static_cast<double>(job.resident_after))));
  if (!job.verify) return out;
  const auto count = [&](Verdict verdict) {
    return std::count(verdicts.begin(), verdicts.end(), verdict);
  };
  if (count(Verdict::kMismatch) > 0) {
    add(fmt::format("verify FAILED: {} of {} tensors' global checksums differ from the file",
                    count(Verdict::kMismatch), tensors.size()));
  } else if (count(Verdict::kLossy) > 0) {
    add(
        fmt::format("verified: {} of {} tensors' global checksums match the file; {} differ by the "
                    "requested conversion",
                    count(Verdict::kMatch), tensors.size(), count(Verdict::kLossy)));
  } else {
    add("verified: every tensor's global checksum matches the file");
  }
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (verdicts[t] == Verdict::kLossy) {
      add(fmt::format("differs (lossy conversion): {} ({})", Printable(tensors[t].entry.name),
                      dtypes(tensors[t])));
    } else if (verdicts[t] == Verdict::kMismatch) {
      add(fmt::format("MISMATCH: {} ({})", Printable(tensors[t].entry.name), dtypes(tensors[t])));
    }
  }
  return out;
}

nlohmann::json JobJson(const std::vector<JobTensor>& tensors, const std::vector<Verdict>& verdicts,
                       const JobSummary& job, const DistributedPutOptions& options,
                       bool verified_exact) {
  nlohmann::json json = {{"files", options.files},
                         {"processes", job.processes},
                         {"devices", job.devices},
                         {"device_names", job.device_names},
                         {"shard_dim", options.shard_dim},
                         {"total_bytes", job.total_bytes},
                         {"seconds", job.seconds},
                         {"aggregate_gbps", job.aggregate_gbps()},
                         {"resident_bytes_after", job.resident_after},
                         {"dropped_page_cache", options.drop_page_cache},
                         {"verified", options.verify},
                         {"verified_exact", options.verify && verified_exact},
                         {"ranks", job.ranks},
                         {"tensors", nlohmann::json::array()}};
  for (size_t t = 0; t < tensors.size(); ++t) {
    const JobTensor& tensor = tensors[t];
    nlohmann::json entry = {{"name", tensor.entry.name},
                            {"file", tensor.file},
                            {"shape", std::vector<int64_t>(tensor.dims.begin(), tensor.dims.end())},
                            {"file_dtype", DTypeName(tensor.file_dtype)},
                            {"device_dtype", DTypeName(tensor.device_dtype)},
                            {"placement", tensor.split ? "sharded" : "replicated"},
                            {"bytes", TensorBytes(tensor)}};
    if (tensor.split) entry["shard_dim"] = options.shard_dim;
    if (options.verify) {
      entry["verified"] = verdicts[t] == Verdict::kMatch   ? "match"
                          : verdicts[t] == Verdict::kLossy ? "lossy"
                                                           : "mismatch";
    }
    json["tensors"].push_back(std::move(entry));
  }
  return json;
}

}  // namespace ferry::cli
