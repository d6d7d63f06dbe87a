// `ferry put --mesh all`'s tensors and results, and rank 0's report of the job: the table for the
// terminal and the JSON. put_distributed.cc runs the job; put_distributed_report.cc lays it out.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/io/tensor_file.h"
#include "ferry/runtime/sharding.h"
#include "nlohmann/json.hpp"
#include "tools/ferry/put_distributed.h"

namespace ferry::cli {

// One tensor of the job, and where it went.
struct JobTensor {
  std::string file;
  size_t file_number = 1;  // its file's position on the command line, from 1
  TensorFileEntry entry;   // its source is released before the isolated-read measurement
  Dims dims;
  DType file_dtype = DType::kF32;
  DType device_dtype = DType::kF32;
  bool split = false;
  ShardedDataPtr sharded;
};

// Its bytes in the file.
inline int64_t TensorBytes(const JobTensor& tensor) {
  int64_t elements = 1;
  for (int64_t dim : tensor.dims) elements *= dim;
  return elements * GetDTypeInfo(tensor.file_dtype).size_bytes;
}

// What --verify found for a tensor: its global checksum against the file's.
enum class Verdict { kUnchecked, kMatch, kLossy, kMismatch };

// What rank 0 reports for the job.
struct JobSummary {
  bool verify = false;
  int shard_dim = 0;
  size_t devices = 0;
  int processes = 1;
  // Every device of the mesh by its name in the job (GlobalDevices::NameOf: "p1/host:0" with
  // several processes), in mesh order.
  std::vector<std::string> device_names;
  int64_t total_bytes = 0;
  int64_t resident_after = 0;
  double seconds = 0;  // the slowest rank's
  nlohmann::json ranks;

  double aggregate_gbps() const { return seconds > 0 ? total_bytes / seconds / 1e9 : 0; }
};

// The job's report for `width` columns (see put_distributed_report.cc).
std::string FormatJobReport(const std::vector<JobTensor>& tensors,
                            const std::vector<Verdict>& verdicts, const JobSummary& job,
                            const DistributedPutOptions& options, int width);

// The same as JSON: the job's totals, every rank's numbers, every tensor.
nlohmann::json JobJson(const std::vector<JobTensor>& tensors, const std::vector<Verdict>& verdicts,
                       const JobSummary& job, const DistributedPutOptions& options,
                       bool verified_exact);

}  // namespace ferry::cli
