// `ferry put FILE... --mesh all[:BACKEND]`: every device of every process of the job (one process
// without mpiexec), in process order, as a 1-d mesh. Under `mpiexec -n N` each process maps the
// files and sends its own devices only the byte ranges their shards cover; rank 0 prints one table
// for the whole job (per-rank bytes, time, GB/s). See docs/distributed.md.
#pragma once

#include <string>
#include <vector>

namespace ferry::cli {

struct DistributedPutOptions {
  std::vector<std::string> files;
  std::string backend = "host";
  int shard_dim = 0;
  std::string device_dtype;
  bool device_dtype_all = false;
  std::string semantics = "async";
  bool verify = false;
  std::string json_path;
  // Drop the files from the page cache first (posix_fadvise DONTNEED), so that the bytes the job
  // made resident (mincore) are the bytes it read.
  bool drop_page_cache = false;
  // --only / --exclude: glob patterns of the tensors to put and to leave out (TensorSelector).
  std::vector<std::string> only;
  std::vector<std::string> exclude;
  bool wide = false;    // --wide: whole tensor names in the report
  bool strict = false;  // --strict: a --device-dtype that applies to no tensor is an error
};

int RunPutOverAllDevices(const DistributedPutOptions& options);

}  // namespace ferry::cli
