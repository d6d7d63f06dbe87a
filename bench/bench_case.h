// What ferry_bench.cc and the files that define cases share: a prepared case, the context cases
// are prepared in, and how the benchmark runs a Python script.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ferry/core/status.h"
#include "ferry/device/device.h"
#include "ferry/runtime/tensor_source.h"
#include "nlohmann/json.hpp"
#include "transfer_paths.h"

namespace ferry::bench {

using Json = nlohmann::ordered_json;

inline constexpr int64_t kMiB = int64_t{1} << 20;

// The sharded cases' mesh: 2x2 devices.
inline constexpr int kMeshDevices = 4;

struct PreparedCase {
  int64_t bytes = 0;    // read from the source (host memory for h2d, device memory for d2h)
  int64_t tensors = 1;  // tensors moved per run
  std::unique_ptr<Path> ferry;
  // The old path; null when a case has none (raw_clwrite, the file cases): then the result is
  // checked against `unconverted_sources` instead, and `no_staged_note` says why in the notes.
  std::unique_ptr<Path> staged;
  std::string no_staged_note = "no staged path: the runtime's own ceiling";
  // h2d without conversion: the sources, to spot-check the device data against the source read
  // through its own strides (independently of ferry's copy kernels).
  std::vector<std::shared_ptr<const TensorSource>> unconverted_sources;
  // The devices whose memory the runs use (every mesh device for the sharded cases); empty: the
  // context's device.
  std::vector<Device*> devices;
  // Set when the case cannot run on this backend: it is reported as skipped, not failed.
  std::optional<std::string> skip_reason;
  // Set by the dense h2d cases that write half the bytes they read (f32 -> bf16/f16, f64 -> f32):
  // the bytes written. The case then also times MeasureHalvingFloor (floor_pass.h) over buffers of
  // its sizes, for floor_seconds, vs_floor and vs_staged_bound.
  int64_t halving_floor_bytes = 0;
  // Whether the case gets vs_raw_clwrite when raw_clwrite ran before it (h2d dense and converts).
  bool compare_to_raw_clwrite = false;
  // On a pjrt device: the plugin's own way to the same result (pjrt_paths.h), timed in turns with
  // the memcpy and staged yardsticks, for vs_raw_pjrt; `raw_pjrt_method` says what it does. Null
  // elsewhere, and for the cases the plugin has no own path for.
  std::unique_ptr<Path> raw_pjrt;
  std::string raw_pjrt_method;
  Json details = Json::object();
  // Called once after the timed runs (and after the memcpy yardstick's buffers are freed) with
  // the case's JSON row, `seconds_median` already set, and its notes (AddNote): for comparisons
  // measured outside this process (the file cases' real loaders).
  std::function<void(Json& row, std::string& notes)> after_timing;
  // Whatever must live as long as the case (the file cases' temporary file).
  std::shared_ptr<const void> keep_alive;
};

inline PreparedCase Skipped(std::string reason) {
  PreparedCase prepared;
  prepared.skip_reason = std::move(reason);
  return prepared;
}

inline void AddNote(std::string& notes, const std::string& note) {
  notes += (notes.empty() ? "" : "; ") + note;
}

struct CaseContext {
  Device* device;
  double scale;
  // The first kMeshDevices devices of the backend, for the sharded cases; empty when it has
  // fewer, and then `mesh_unavailable` says why.
  std::vector<Device*> mesh_devices;
  std::string mesh_unavailable;
  // --repeats, and the --python interpreter (empty when not given).
  int repeats = 7;
  std::string python;
};

struct CaseDefinition {
  const char* name;
  const char* description;
  std::function<StatusOr<PreparedCase>(const CaseContext&)> prepare;
};

// `full` times `scale`, rounded down to a multiple of `multiple_of` (at least one multiple).
inline int64_t ScaledCount(int64_t full, double scale, int64_t multiple_of = 1) {
  const auto scaled = static_cast<int64_t>(std::llround(static_cast<double>(full) * scale));
  return std::max(multiple_of, scaled / multiple_of * multiple_of);
}

// Runs `python <source dir>/bench/<script> <arguments>` (arguments already quoted for the shell)
// and returns the "results" member of the JSON object it prints on stdout. Its stderr passes
// through. Internal when it cannot start, fails, or prints no such object.
StatusOr<Json> RunPythonScript(const std::string& python, const std::string& script,
                               const std::string& arguments);

}  // namespace ferry::bench
