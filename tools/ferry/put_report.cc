#include "tools/ferry/put_report.h"

#include <algorithm>
#include <limits>

#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/tensor_table.h"
#include "tools/ferry/text_layout.h"

namespace ferry::cli {
namespace {

std::string ShapeString(const Dims& dims) { return fmt::format("[{}]", fmt::join(dims, ",")); }

}  // namespace

// The table of tensors and the totals, laid out for `width` columns (RenderTensorTable: names
// shortened apart, or whole on lines of their own; `wide`: whole names on long lines). The file
// column (several files) gives each file's number, listed below the table; the placement column
// (a mesh) says which tensors were split and which replicated; the dtype column gives the device
// dtype after an arrow only where it differs from the file's (converted); the path column is
// there when some tensor was aliased or byte-swapped. The totals wrap.
std::string FormatReport(const std::vector<PutTensor>& tensors, const PutTarget& target,
                         const PutOptions& options, const PutSummary& summary, int width) {
  using Align = TextTable::Align;
  const bool several_files = options.files.size() > 1;
  const bool on_mesh = target.mesh.has_value();
  // The path says more than the dtype column only where a tensor was aliased or byte-swapped
  // ("converted" has its arrow, "direct" is the rest): shown then, else left to the JSON.
  const bool show_path = std::any_of(tensors.begin(), tensors.end(), [](const PutTensor& tensor) {
    return tensor.path == "aliased" || tensor.path == "byte-swapped";
  });
  std::vector<TextTable::Column> columns;
  if (several_files) columns.push_back({"file", Align::kRight, -1});
  columns.push_back({"shape", Align::kLeft, 0, 9});
  columns.push_back({"dtype", Align::kLeft, -1});
  if (on_mesh) columns.push_back({"placement", Align::kLeft, -1});
  if (show_path) columns.push_back({"path", Align::kLeft, -1});
  columns.push_back({"size", Align::kRight, -1});
  std::vector<std::string> names;
  std::vector<std::vector<std::string>> rows;
  for (const PutTensor& tensor : tensors) {
    names.push_back(Printable(tensor.entry.name));
    std::vector<std::string> row;
    if (several_files) row.push_back(fmt::format("{}", tensor.file_number));
    row.push_back(ShapeString(tensor.entry.source->view().dims));
    row.push_back(DTypeCell(DTypeName(tensor.file_dtype()), tensor.DeviceDTypeText()));
    if (on_mesh) row.push_back(tensor.placement);
    if (show_path) row.push_back(tensor.path);
    row.push_back(FormatBytes(static_cast<double>(tensor.bytes)));
    rows.push_back(std::move(row));
  }
  std::string out = RenderPutTable(names, columns, rows, width, options.wide, options.files);
  const int text_width = options.wide ? std::numeric_limits<int>::max() : width;
  const auto add = [&](const std::string& text) { out += WrapToString(text, text_width) + "\n"; };
  std::string total = fmt::format("total: {} tensor{}, {} in {:.3f} s = {:.2f} GB/s",
                                  tensors.size(), tensors.size() == 1 ? "" : "s",
                                  FormatBytes(static_cast<double>(summary.total_bytes)),
                                  summary.seconds, summary.gbps());
  if (const auto ratio = summary.vs_memcpy()) total += fmt::format("; vs_memcpy {:.2f}", *ratio);
  add(total);
  if (on_mesh) {
    add(
        fmt::format("on: {} (a 1-d mesh: sharded = dim {} split over its {} devices, replicated "
                    "= whole on each)",
                    target.name, options.shard_dim, target.devices.size()));
  } else {
    add(fmt::format("on: {}", target.name));
  }
  if (summary.verified) {
    add(summary.lossy.empty()
            ? std::string("verified: every tensor matches the file")
            : fmt::format("verified: {} of {} tensors match the file exactly, {} differ by the "
                          "requested conversion",
                          tensors.size() - summary.lossy.size(), tensors.size(),
                          summary.lossy.size()));
  }
  for (const std::string& line : summary.lossy) add("lossy conversion: " + line);
  return out;
}

nlohmann::json SummaryJson(const PutOptions& options, const std::vector<PutTensor>& tensors,
                           const PutTarget& target, const PutSummary& summary) {
  nlohmann::json json;
  json["files"] = options.files;
  json["device"] = target.name;
  if (target.mesh.has_value()) json["shard_dim"] = options.shard_dim;
  json["total_bytes"] = summary.total_bytes;
  json["seconds"] = summary.seconds;
  json["gbps"] = summary.gbps();
  // null without --vs-memcpy
  json["memcpy_seconds"] = nullptr;
  json["vs_memcpy"] = nullptr;
  if (summary.memcpy_seconds.has_value()) {
    json["memcpy_seconds"] = *summary.memcpy_seconds;
    json["vs_memcpy"] = *summary.vs_memcpy();
  }
  json["verified"] = summary.verified;
  json["verified_exact"] = summary.verified && summary.lossy.empty();
  json["lossy"] = summary.lossy;
  for (const PutTensor& tensor : tensors) {
    const HostView& view = tensor.entry.source->view();
    nlohmann::json entry = {
        {"name", tensor.entry.name},
        {"file", tensor.file},
        {"shape", std::vector<int64_t>(view.dims.begin(), view.dims.end())},
        {"file_dtype", DTypeName(view.dtype)},
        {"device_dtype", tensor.DeviceDTypeText()},
        {"path", tensor.path},
        {"placement", tensor.placement.empty() ? "single_device" : tensor.placement},
        {"bytes", tensor.bytes}};
    if (tensor.placement == "sharded") entry["shard_dim"] = options.shard_dim;
    if (tensor.sharded) {
      std::vector<std::string> shard_dtypes;
      for (const DataPtr& shard : tensor.sharded->shards()) {
        shard_dtypes.emplace_back(DTypeName(shard->device_dtype()));
      }
      entry["shard_device_dtypes"] = shard_dtypes;
    }
    json["tensors"].push_back(std::move(entry));
  }
  return json;
}

}  // namespace ferry::cli
