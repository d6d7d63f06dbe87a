// A one-process `ferry put`: its options, its tensors and where they went, its totals, and their
// report (the table for the terminal and the JSON). put_command.cc runs the put; put_report.cc
// lays out what it did.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ferry/io/tensor_file.h"
#include "ferry/runtime/sharding.h"
#include "ferry/runtime/transfer.h"
#include "nlohmann/json.hpp"

namespace ferry::cli {

// The command line of `ferry put` (AddPutCommand binds it to the flags; --mesh all hands it on to
// put_distributed.cc).
struct PutOptions {
  std::vector<std::string> files;
  std::string device = "host:0";
  std::optional<std::string> mesh;  // unset: one device (--device)
  int shard_dim = 0;
  std::string device_dtype;
  bool device_dtype_all = false;  // apply --device-dtype to every tensor, not only its kind
  bool strict = false;            // a --device-dtype that applies to no tensor is an error
  std::string semantics = "async";
  bool verify = false;
  bool vs_memcpy = false;  // --vs-memcpy: time a memcpy of the same bytes after the put
  std::string json_path;
  bool drop_page_cache = false;      // --mesh all: see DistributedPutOptions
  std::vector<std::string> only;     // --only: glob patterns of the tensors to put (all if none)
  std::vector<std::string> exclude;  // --exclude: glob patterns of tensors to leave out
  bool wide = false;                 // --wide: whole tensor names, lines as long as they must be
};

// One tensor of one file, and where it went.
struct PutTensor {
  std::string file;
  size_t file_number = 1;  // its file's position on the command line, from 1
  TensorFileEntry entry;
  // The device dtype asked for this tensor: --device-dtype where it applies, else nullopt (each
  // device's profile decides, shard by shard on a mesh mixing backends, as device_put does).
  std::optional<DType> requested_dtype;
  // The device dtype it is stored as. On a mesh whose devices chose differently: the first
  // shard's, and `mixed_dtypes` lists them all ("float32/float64").
  DType device_dtype = DType::kF32;
  std::string mixed_dtypes;
  std::string path;  // aliased / direct / converted / byte-swapped / read
  // Read from the file straight into its device buffer (ReadFileTensors), never mapped.
  bool read_in_place = false;
  // On a mesh: "sharded" (dim --shard-dim split over the devices) or "replicated" (whole on each
  // device: a tensor of rank --shard-dim or less); empty on one device.
  std::string placement;
  DataPtr data;            // unsharded
  ShardedDataPtr sharded;  // sharded over the mesh
  int64_t bytes = 0;       // bytes read from the file

  DType file_dtype() const { return entry.source->view().dtype; }
  // Whether any copy of it on a device holds another dtype than the file.
  bool converted() const { return device_dtype != file_dtype() || !mixed_dtypes.empty(); }
  std::string DeviceDTypeText() const {
    return mixed_dtypes.empty() ? std::string(DTypeName(device_dtype)) : mixed_dtypes;
  }
};

// Where the tensors go: one device, or a 1-d mesh (axis "x") sharding dim --shard-dim.
struct PutTarget {
  Device* device = nullptr;      // the device, or the mesh's first device
  std::vector<Device*> devices;  // every device the tensors go to
  std::optional<Mesh> mesh;
  std::string name;  // for the totals and the JSON: the device or the mesh as given
};

// The results of one `put`, for the table, the totals and the JSON.
struct PutSummary {
  int64_t total_bytes = 0;
  double seconds = 0;
  std::optional<double> memcpy_seconds;  // with --vs-memcpy
  bool verified = false;
  std::vector<std::string> lossy;  // "name (float32 -> bfloat16): N of M elements differ, max ..."

  double gbps() const { return seconds > 0 ? total_bytes / seconds / 1e9 : 0; }
  std::optional<double> vs_memcpy() const {
    if (!memcpy_seconds.has_value() || seconds <= 0) return std::nullopt;
    return *memcpy_seconds / seconds;
  }
};

// The table of tensors and the totals, laid out for `width` columns (see put_report.cc).
std::string FormatReport(const std::vector<PutTensor>& tensors, const PutTarget& target,
                         const PutOptions& options, const PutSummary& summary, int width);

// The same as JSON: every tensor with its whole name, file, shape, dtypes, placement and path.
nlohmann::json SummaryJson(const PutOptions& options, const std::vector<PutTensor>& tensors,
                           const PutTarget& target, const PutSummary& summary);

}  // namespace ferry::cli
