// ferry-bench: how fast ferry moves tensors, next to memcpy and the old staged path.
//
// Every case (transfer_cases.cc, file_put_cases.cc) is timed in the same process: ferry's runs
// back to back (with --peers, bench/peers.py's torch, jax and numpy timed once after each of
// them, peer_session.h), then the others in turn (bench/README.md says why):
//   ferry   the library path (TransferToDevice + AwaitReady, or TransferFromDevice);
//   memcpy  one std::memcpy, on one thread, of as many bytes as the case reads, into a
//           pre-touched destination (the yardstick of DESIGN.md's performance model), and the
//           same split over every core (vs_copy_peak);
//   staged  the old path, written out in transfer_paths.cc: a full-size contiguous temporary,
//           freshly allocated, filled row by row by the portable kernel on one thread, then a
//           dense same-dtype transfer;
//   floor   for the converting cases that halve their bytes, the floor pass of floor_pass.h;
//   plugin  on a pjrt device, the PJRT plugin's own path to the same result (pjrt_paths.h), timed
//           in turn with memcpy and staged (vs_raw_pjrt).
// See bench/README.md for the cases and the columns.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "CLI/CLI.hpp"
#include "bench_case.h"
#include "device_queues.h"
#include "ferry/core/dtype.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/host_view.h"
#include "ferry/device/client.h"
#include "ferry/device/device.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/transfer.h"
#include "floor_pass.h"
#include "fmt/format.h"
#include "heap_accounting.h"
#include "nlohmann/json.hpp"
#include "peer_session.h"
#include "pjrt_paths.h"
#include "tools/ferry/text_layout.h"
#include "transfer_cases.h"
#include "transfer_paths.h"

namespace ferry::bench {
namespace {

using Clock = std::chrono::steady_clock;

// --- utilities ---------------------------------------------------------------------------------

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  if (n == 0) return 0;
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
}

std::string FormatBytes(double bytes) {
  if (bytes >= 1024.0 * kMiB) return fmt::format("{:.2f}GiB", bytes / (1024.0 * kMiB));
  if (bytes >= kMiB) return fmt::format("{:.1f}MiB", bytes / kMiB);
  if (bytes >= 1024) return fmt::format("{:.1f}KiB", bytes / 1024);
  return fmt::format("{:.0f}B", bytes);
}

std::string FormatSeconds(double seconds) {
  if (seconds >= 1) return fmt::format("{:.3f}s", seconds);
  if (seconds >= 1e-3) return fmt::format("{:.2f}ms", seconds * 1e3);
  return fmt::format("{:.1f}us", seconds * 1e6);
}

// The width the table and the text around it fit (ferry's own layout: the terminal's, or 80 into
// a pipe or a file, or $COLUMNS).
int OutputWidth() {
  static const int width = cli::OutputWidth(STDOUT_FILENO);
  return width;
}

// A row of the table: the case and its numbers in 79 columns (the columns' titles are
// kTableHeader's). What does not fit, the heap peaks and the notes, follows on lines of its own.
constexpr std::string_view kRowFormat = "{:<25} {:>9} {:>8} {:>6} {:>9} {:>7} {:>9}";

// `notes` ("a; b; c") on lines indented by two, each line at most OutputWidth() wide and broken
// between notes where it can (a note longer than a line wraps on its own). Each line ends in '\n';
// nothing for no notes.
std::string NoteLines(std::string_view notes) {
  constexpr int kIndent = 2;
  const int room = OutputWidth() - kIndent;
  std::vector<std::string> lines;
  std::string line;
  size_t position = 0;
  while (position < notes.size()) {
    size_t end = notes.find("; ", position);
    if (end == std::string_view::npos) end = notes.size();
    const std::string_view note = notes.substr(position, end - position);
    position = std::min(notes.size(), end + 2);
    if (note.empty()) continue;
    if (!line.empty() && static_cast<int>(line.size() + 2 + note.size()) > room) {
      lines.push_back(line + ";");
      line.clear();
    }
    if (!line.empty()) line += "; ";
    line += note;
  }
  if (!line.empty()) lines.push_back(line);
  std::string out;
  for (const std::string& each : lines) {
    for (const std::string& piece : cli::WrapText(each, room, kIndent)) {
      out += std::string(kIndent, ' ') + piece + "\n";
    }
  }
  return out;
}

// `text` wrapped to OutputWidth(), continuation lines indented by two, ending in '\n'.
std::string Wrapped(std::string_view text) { return cli::WrapToString(text, OutputWidth()) + "\n"; }

// "<name padded to the case column> <text>", the text wrapped beside the case column.
std::string CaseLine(std::string_view name, std::string_view text) {
  constexpr int kCaseColumn = 26;
  std::string out;
  const std::vector<std::string> lines =
      cli::WrapText(text, std::max(20, OutputWidth() - kCaseColumn), 0);
  for (size_t i = 0; i < lines.size(); ++i) {
    out += fmt::format("{:<{}}{}\n", i == 0 ? name : std::string_view(), kCaseColumn, lines[i]);
  }
  return out;
}

// How busy the CPUs were with other processes' work since construction: all the CPU time of the
// machine (/proc/stat) less this process's own (getrusage), as a percent of all cores' time.
class OtherCpuMeter {
 public:
  // `helper`: a process of ours whose CPU time is not "other" either (the peers' server), or -1.
  explicit OtherCpuMeter(pid_t helper = -1) : helper_(helper), start_(Read(helper)) {}

  std::optional<double> OtherBusyPercent() const {
    const std::optional<Reading> now = Read(helper_);
    if (!start_ || !now) return std::nullopt;
    const double ticks_per_second = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double all_seconds =
        static_cast<double>(now->all_ticks - start_->all_ticks) / ticks_per_second;
    const double busy_seconds =
        static_cast<double>(now->busy_ticks - start_->busy_ticks) / ticks_per_second;
    const double other_seconds = busy_seconds - (now->own_seconds - start_->own_seconds);
    if (all_seconds <= 0) return std::nullopt;
    return std::clamp(100.0 * other_seconds / all_seconds, 0.0, 100.0);
  }

 private:
  struct Reading {
    int64_t busy_ticks;
    int64_t all_ticks;
    double own_seconds;
  };

  // The user and system time of process `pid` in clock ticks (fields 14 and 15 of
  // /proc/PID/stat, counted after the parenthesised command name); 0 when it cannot be read.
  static int64_t ProcessTicks(pid_t pid) {
    std::ifstream stat(fmt::format("/proc/{}/stat", pid));
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t name_end = text.rfind(')');
    if (name_end == std::string::npos) return 0;
    std::istringstream fields(text.substr(name_end + 1));
    std::string field;
    int64_t ticks = 0;
    for (int index = 3; index <= 15 && fields >> field; ++index) {
      if (index >= 14) ticks += std::strtoll(field.c_str(), nullptr, 10);
    }
    return ticks;
  }

  static std::optional<Reading> Read(pid_t helper) {
    std::ifstream stat("/proc/stat");
    std::string cpu;
    int64_t user, nice, system, idle, iowait, irq, softirq;
    if (!(stat >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq) ||
        cpu != "cpu") {
      return std::nullopt;
    }
    rusage usage{};
    if (getrusage(RUSAGE_SELF, &usage) != 0) return std::nullopt;
    auto seconds = [](const timeval& time) {
      return static_cast<double>(time.tv_sec) + static_cast<double>(time.tv_usec) * 1e-6;
    };
    const int64_t busy = user + nice + system + irq + softirq;
    const double helper_seconds = helper > 0 ? static_cast<double>(ProcessTicks(helper)) /
                                                   static_cast<double>(sysconf(_SC_CLK_TCK))
                                             : 0.0;
    return Reading{busy, busy + idle + iowait,
                   seconds(usage.ru_utime) + seconds(usage.ru_stime) + helper_seconds};
  }

  pid_t helper_;
  std::optional<Reading> start_;
};

// --- measuring ---------------------------------------------------------------------------------

struct Sample {
  double seconds = 0;
  int64_t peak_extra_bytes = 0;
  // The part of peak_extra_bytes still allocated when the run returned: heap growth beyond the
  // devices' own count of their buffers and the returned tensors. On the host device that is
  // mostly malloc_usable_size() slack of its 2 MiB-aligned buffers (glibc maps each large aligned
  // block with up to 2 MiB of untouched padding, about 1.9 MiB per buffer of 2 MiB or more).
  int64_t retained_extra_bytes = 0;
};

int64_t DeviceBytesInUse(absl::Span<Device* const> devices) {
  int64_t bytes = 0;
  for (Device* device : devices) bytes += device->bytes_in_use();
  return bytes;
}

// Waits until the devices have given back the memory of released buffers, so that runs do not
// pile up device memory.
void WaitForDeviceBytes(absl::Span<Device* const> devices, int64_t device_bytes_before) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (DeviceBytesInUse(devices) > device_bytes_before && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// One run, timed, and with `account_heap` its heap accounted (counting every malloc and free,
// which the plain timed runs must not pay for): the heap peak is taken relative to the heap at the
// start; the memory the run rightly leaves behind (new device buffers, returned host tensors) is
// not extra.
StatusOr<Sample> MeasureOnce(Path& path, absl::Span<Device* const> device, bool account_heap) {
  const int64_t device_before = DeviceBytesInUse(device);
  if (account_heap) StartHeapAccounting();
  const auto start = Clock::now();
  Status status = path.Run();
  const auto stop = Clock::now();
  Sample sample;
  sample.seconds = std::chrono::duration<double>(stop - start).count();
  if (account_heap) {
    StopHeapAccounting();
    const int64_t device_added =
        DeviceBytesInUse(device) - device_before + path.ResultUncountedDeviceBytes();
    sample.peak_extra_bytes =
        std::max<int64_t>(0, PeakHeapBytes() - device_added - path.ResultHostBytes());
    sample.retained_extra_bytes = std::clamp<int64_t>(
        LiveHeapBytes() - device_added - path.ResultHostBytes(), 0, sample.peak_extra_bytes);
  }
  path.Release();
  WaitForDeviceBytes(device, device_before);
  if (!status.ok()) return status;
  return sample;
}

double MeasureMemcpy(std::byte* destination, const std::byte* source, int64_t bytes) {
  const auto start = Clock::now();
  std::memcpy(destination, source, static_cast<size_t>(bytes));
  asm volatile("" : : "r"(destination) : "memory");  // the copy may not be optimised away
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The fastest copy this machine can do: the same memcpy split into one contiguous part per core,
// each part on its own thread (the yardstick of vs_copy_peak; thread start-up is timed too, a few
// tens of microseconds against the tens of milliseconds of a case).
double MeasureParallelMemcpy(std::byte* destination, const std::byte* source, int64_t bytes) {
  const int64_t parts = std::max(1u, std::thread::hardware_concurrency());
  const int64_t part_bytes = (bytes + parts - 1) / parts;
  const auto start = Clock::now();
  std::vector<std::thread> threads;
  for (int64_t begin = part_bytes; begin < bytes; begin += part_bytes) {
    threads.emplace_back([=] {
      std::memcpy(destination + begin, source + begin,
                  static_cast<size_t>(std::min(part_bytes, bytes - begin)));
    });
  }
  std::memcpy(destination, source, static_cast<size_t>(std::min(part_bytes, bytes)));
  for (std::thread& thread : threads) thread.join();
  asm volatile("" : : "r"(destination) : "memory");
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The same copy into a destination allocated just before (timed with its page faults, as a
// transfer's fresh device buffer is); the destination is freed after the clock stops.
double MeasureMemcpyToFreshMemory(const std::byte* source, int64_t bytes) {
  const auto start = Clock::now();
  auto destination = std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(bytes));
  std::memcpy(destination.get(), source, static_cast<size_t>(bytes));
  asm volatile("" : : "r"(destination.get()) : "memory");
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Compares elements of `got` (dense) with `source` read through its byte strides: the first and
// last elements and a spread of others.
Status SpotCheck(const TensorSource& source, const HostTensor& got) {
  const HostView& view = source.view();
  const int64_t count = view.num_elements();
  const int64_t element_size = view.element_size();
  auto matches = [&](int64_t linear) {
    int64_t offset = 0;
    int64_t rest = linear;
    for (int64_t dim = view.rank() - 1; dim >= 0; --dim) {
      offset += (rest % view.dims[dim]) * view.byte_strides[dim];
      rest /= view.dims[dim];
    }
    const auto* want = static_cast<const std::byte*>(view.data) + offset;
    return std::memcmp(got.data() + linear * element_size, want, element_size) == 0;
  };
  const int64_t step = std::max<int64_t>(1, count / 4099);
  for (int64_t linear = 0; linear < count; linear += step) {
    if (!matches(linear) || !matches(count - 1 - linear)) {
      return InternalError(
          fmt::format("tensor '{}': the device data differs from the source near element {}",
                      source.name(), linear));
    }
  }
  return OkStatus();
}

// Runs a case without a staged path (raw_clwrite) once, untimed, and checks its result against
// its dense sources byte for byte.
Status WarmUpAndVerifyAgainstSources(PreparedCase& prepared, absl::Span<Device* const> device) {
  const int64_t device_before = DeviceBytesInUse(device);
  FERRY_RETURN_IF_ERROR(prepared.ferry->Run());
  FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> got, prepared.ferry->TakeResultsOnHost());
  prepared.ferry->Release();
  WaitForDeviceBytes(device, device_before);
  if (got.size() != prepared.unconverted_sources.size()) {
    return InternalError("the run made a different number of tensors than it has sources");
  }
  for (size_t i = 0; i < got.size(); ++i) {
    const HostView& want = prepared.unconverted_sources[i]->view();
    if (!want.IsRowMajorDense() || got[i].size_bytes() != want.dense_size_bytes() ||
        std::memcmp(got[i].data(), want.data, static_cast<size_t>(got[i].size_bytes())) != 0) {
      return InternalError(fmt::format("tensor {}: the device data differs from the source", i));
    }
  }
  return OkStatus();
}

// Runs both paths once, untimed, and checks that the ferry path made the same bytes as the
// staged path (the portable kernel, row by row): a wrong fast result is no result.
Status WarmUpAndVerify(PreparedCase& prepared, absl::Span<Device* const> device) {
  if (prepared.staged == nullptr) return WarmUpAndVerifyAgainstSources(prepared, device);
  const int64_t device_before = DeviceBytesInUse(device);
  FERRY_RETURN_IF_ERROR(prepared.ferry->Run());
  FERRY_RETURN_IF_ERROR(prepared.staged->Run());
  FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> got, prepared.ferry->TakeResultsOnHost());
  FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> want, prepared.staged->TakeResultsOnHost());
  prepared.ferry->Release();
  prepared.staged->Release();
  WaitForDeviceBytes(device, device_before);
  if (got.size() != want.size()) return InternalError("ferry and staged made different counts");
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].dtype() != want[i].dtype() || got[i].dims() != want[i].dims() ||
        std::memcmp(got[i].data(), want[i].data(), static_cast<size_t>(got[i].size_bytes())) != 0) {
      return InternalError(
          fmt::format("tensor {}: ferry's result differs from the staged path's", i));
    }
    if (!prepared.unconverted_sources.empty()) {
      FERRY_RETURN_IF_ERROR(SpotCheck(*prepared.unconverted_sources[i], got[i]));
    }
  }
  // The plugin's own path must make the same bytes too, or its time compares with nothing.
  if (prepared.raw_pjrt != nullptr) {
    FERRY_RETURN_IF_ERROR(prepared.raw_pjrt->Run());
    FERRY_ASSIGN_OR_RETURN(std::vector<HostTensor> plugin, prepared.raw_pjrt->TakeResultsOnHost());
    prepared.raw_pjrt->Release();
    if (plugin.size() != want.size()) return InternalError("the plugin made a different count");
    for (size_t i = 0; i < plugin.size(); ++i) {
      if (plugin[i].dtype() != want[i].dtype() || plugin[i].dims() != want[i].dims() ||
          std::memcmp(plugin[i].data(), want[i].data(),
                      static_cast<size_t>(plugin[i].size_bytes())) != 0) {
        return InternalError(fmt::format(
            "tensor {}: the plugin's own path made other bytes than the staged path", i));
      }
    }
  }
  return OkStatus();
}

struct CaseResult {
  Json json;
  std::string row;
  bool skipped = false;
  Json peers_versions;                       // from the peers' row, when they ran
  std::optional<std::string> peers_failure;  // why the peers have no times
};

// The yardsticks' own buffers, each written once so that no page fault is timed: memcpy's source
// and destination, and, for a case with a floor pass, the floor pass's (huge pages like the
// case's source and device memory).
struct YardstickBuffers {
  std::unique_ptr<std::byte[]> memcpy_source;
  std::unique_ptr<std::byte[]> memcpy_destination;
  std::optional<HostTensor> floor_source;
  std::optional<HostTensor> floor_destination;
};

StatusOr<YardstickBuffers> AllocateYardstickBuffers(const PreparedCase& prepared) {
  YardstickBuffers buffers;
  buffers.memcpy_source =
      std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(prepared.bytes));
  buffers.memcpy_destination =
      std::make_unique_for_overwrite<std::byte[]>(static_cast<size_t>(prepared.bytes));
  std::memset(buffers.memcpy_source.get(), 0x5a, static_cast<size_t>(prepared.bytes));
  std::memset(buffers.memcpy_destination.get(), 0xa5, static_cast<size_t>(prepared.bytes));
  MeasureMemcpy(buffers.memcpy_destination.get(), buffers.memcpy_source.get(),
                prepared.bytes);  // warm-up
  if (prepared.halving_floor_bytes > 0) {
    FERRY_ASSIGN_OR_RETURN(buffers.floor_source,
                           HostTensor::Allocate(DType::kU8, {2 * prepared.halving_floor_bytes}));
    FERRY_ASSIGN_OR_RETURN(buffers.floor_destination,
                           HostTensor::Allocate(DType::kU8, {prepared.halving_floor_bytes}));
    std::memset(buffers.floor_source->data(), 0x5a,
                static_cast<size_t>(buffers.floor_source->size_bytes()));
    std::memset(buffers.floor_destination->data(), 0xa5,
                static_cast<size_t>(buffers.floor_destination->size_bytes()));
  }
  return buffers;
}

// What the runs of one case measured: seconds per timed run of each path and yardstick, and the
// heap peaks of the accounted runs.
struct CaseTimes {
  std::vector<double> ferry, memcpy, memcpy_fresh, copy_peak, staged, floor, raw_pjrt;
  int64_t ferry_peak = 0;
  int64_t ferry_retained = 0;
  int64_t staged_peak = 0;
};

// Ferry, its floor pass and its peers take turns, so that a drift of the machine's memory
// bandwidth (it has phases minutes long here) reaches them alike. A peer failure is kept in
// `peers_failure` (the peers then stop), not returned.
Status TimeFerryTurns(PreparedCase& prepared, YardstickBuffers& buffers, int repeats,
                      PeerSession* peers, CaseTimes& times,
                      std::optional<std::string>& peers_failure) {
  for (int run = 0; run < repeats; ++run) {
    FERRY_ASSIGN_OR_RETURN(Sample ferry,
                           MeasureOnce(*prepared.ferry, prepared.devices, /*account_heap=*/false));
    times.ferry.push_back(ferry.seconds);
    if (buffers.floor_source.has_value()) {
      if (const std::optional<double> floor =
              MeasureHalvingFloor(static_cast<const std::byte*>(buffers.floor_source->data()),
                                  static_cast<std::byte*>(buffers.floor_destination->data()),
                                  prepared.halving_floor_bytes)) {
        times.floor.push_back(*floor);
      }
    }
    if (peers != nullptr && !peers_failure.has_value()) {
      if (Status status = peers->RunOnce(); !status.ok()) peers_failure = status.ToString();
    }
  }
  return OkStatus();
}

// The peers' row for the case after their timed runs (null without peers): their times, or,
// when they failed, a row without times that says why. Keeps their versions in `result`.
std::optional<Json> FinishPeers(PeerSession* peers, const CaseDefinition& definition,
                                CaseResult& result) {
  std::optional<Json> peer_row;
  if (peers != nullptr && !result.peers_failure.has_value()) {
    StatusOr<Json> row = peers->Finish();
    if (row.ok()) {
      peer_row = std::move(*row);
      if (peer_row->contains("versions")) result.peers_versions = (*peer_row)["versions"];
    } else {
      result.peers_failure = row.status().ToString();
    }
  }
  if (result.peers_failure.has_value()) {
    peer_row = PeerRowWithoutTimes(definition.name, *result.peers_failure);
  }
  return peer_row;
}

// The yardsticks (memcpy three ways, the staged path, the plugin's own path) take turns too.
Status TimeYardstickTurns(PreparedCase& prepared, const YardstickBuffers& buffers, int repeats,
                          CaseTimes& times) {
  std::byte* const destination = buffers.memcpy_destination.get();
  const std::byte* const source = buffers.memcpy_source.get();
  for (int run = 0; run < repeats; ++run) {
    times.memcpy.push_back(MeasureMemcpy(destination, source, prepared.bytes));
    times.memcpy_fresh.push_back(MeasureMemcpyToFreshMemory(source, prepared.bytes));
    times.copy_peak.push_back(MeasureParallelMemcpy(destination, source, prepared.bytes));
    if (prepared.staged != nullptr) {
      FERRY_ASSIGN_OR_RETURN(Sample staged, MeasureOnce(*prepared.staged, prepared.devices,
                                                        /*account_heap=*/false));
      times.staged.push_back(staged.seconds);
    }
    if (prepared.raw_pjrt != nullptr) {
      FERRY_ASSIGN_OR_RETURN(Sample plugin, MeasureOnce(*prepared.raw_pjrt, prepared.devices,
                                                        /*account_heap=*/false));
      times.raw_pjrt.push_back(plugin.seconds);
    }
  }
  return OkStatus();
}

// The peaks come from one more run of each path with the host memory cache emptied first: a
// block the cache hands out adds nothing to the heap, so a timed run (cache warm) would hide
// what the transfer itself allocates. Freed blocks cached during the run still count as live,
// which can only overstate the peak.
Status AccountHeapPeaks(PreparedCase& prepared, CaseTimes& times) {
  ReleaseCachedHostMemory();
  FERRY_ASSIGN_OR_RETURN(Sample ferry_accounted,
                         MeasureOnce(*prepared.ferry, prepared.devices, /*account_heap=*/true));
  times.ferry_peak = ferry_accounted.peak_extra_bytes;
  times.ferry_retained = ferry_accounted.retained_extra_bytes;
  if (prepared.staged != nullptr) {
    ReleaseCachedHostMemory();
    FERRY_ASSIGN_OR_RETURN(Sample staged_accounted,
                           MeasureOnce(*prepared.staged, prepared.devices, /*account_heap=*/true));
    times.staged_peak = staged_accounted.peak_extra_bytes;
  }
  return OkStatus();
}

// The medians and bests a case's row is made of.
struct CaseSummary {
  double seconds = 0;  // ferry's median
  double gbps = 0;
  double memcpy_median = 0;
  double copy_peak = 0;  // the best (not the median) all-core copy: the machine's copy ceiling
  bool has_staged = false;
  double staged_median = 0;
  // The best floor pass: no transfer of these bytes can be faster here, so neither can the staged
  // path's time over it be beaten by any fused path: vs_staged's ceiling in this run.
  std::optional<double> floor;
};

CaseSummary Summarize(const PreparedCase& prepared, const CaseTimes& times) {
  CaseSummary summary;
  summary.seconds = Median(times.ferry);
  summary.gbps = static_cast<double>(prepared.bytes) / summary.seconds / 1e9;
  summary.memcpy_median = Median(times.memcpy);
  summary.copy_peak = *std::min_element(times.copy_peak.begin(), times.copy_peak.end());
  summary.has_staged = prepared.staged != nullptr;
  summary.staged_median = Median(times.staged);
  if (!times.floor.empty()) {
    summary.floor = *std::min_element(times.floor.begin(), times.floor.end());
  }
  return summary;
}

// The case's measured numbers against the yardsticks, as JSON (the first part of its row).
Json CaseJson(const CaseDefinition& definition, const PreparedCase& prepared,
              const CaseTimes& times, const CaseSummary& summary) {
  const double seconds = summary.seconds;
  Json json;
  json["case"] = definition.name;
  json["description"] = definition.description;
  json["bytes"] = prepared.bytes;
  json["seconds_median"] = seconds;
  json["gbps"] = summary.gbps;
  json["vs_memcpy"] = summary.memcpy_median / seconds;
  json["vs_copy_peak"] = summary.copy_peak / seconds;
  json["copy_peak_seconds"] = summary.copy_peak;
  json["vs_staged"] = summary.has_staged ? Json(summary.staged_median / seconds) : Json(nullptr);
  json["peak_extra_bytes"] = HeapAccountingEnabled() ? Json(times.ferry_peak) : Json(nullptr);
  json["peak_extra_retained_bytes"] =
      HeapAccountingEnabled() ? Json(times.ferry_retained) : Json(nullptr);
  json["staged_peak_extra_bytes"] =
      HeapAccountingEnabled() && summary.has_staged ? Json(times.staged_peak) : Json(nullptr);
  json["memcpy_seconds_median"] = summary.memcpy_median;
  json["vs_memcpy_fresh"] = Median(times.memcpy_fresh) / seconds;
  json["memcpy_fresh_seconds_median"] = Median(times.memcpy_fresh);
  json["staged_seconds_median"] = summary.has_staged ? Json(summary.staged_median) : Json(nullptr);
  if (summary.floor.has_value()) {
    json["floor_seconds"] = *summary.floor;
    json["vs_floor"] = *summary.floor / seconds;
    if (summary.has_staged) json["vs_staged_bound"] = summary.staged_median / *summary.floor;
  }
  json["tensors"] = prepared.tensors;
  return json;
}

// The comparisons that only some cases have (rates, the raw runtimes, the floor pass, the peers,
// the machine's other load): each adds its fields to `json` and returns its notes.
std::string AddComparisons(const PreparedCase& prepared, const CaseTimes& times,
                           const CaseSummary& summary,
                           std::optional<double> raw_clwrite_seconds_per_byte,
                           const std::optional<Json>& peer_row, const OtherCpuMeter& other_cpu,
                           Json& json) {
  const double seconds = summary.seconds;
  std::string notes;
  auto add_note = [&notes](const std::string& note) { AddNote(notes, note); };
  if (prepared.tensors > 1 && prepared.devices.size() == 1) {
    const double tensors_per_second = static_cast<double>(prepared.tensors) / seconds;
    json["tensors_per_second"] = tensors_per_second;
    add_note(fmt::format("{:.0f} tensors/s", tensors_per_second));
  }
  if (prepared.compare_to_raw_clwrite && raw_clwrite_seconds_per_byte.has_value()) {
    // raw_clwrite's time for as many bytes as this case reads, over this case's time.
    const double vs_raw =
        *raw_clwrite_seconds_per_byte * static_cast<double>(prepared.bytes) / seconds;
    json["vs_raw_clwrite"] = vs_raw;
    add_note(fmt::format("vs raw clWrite {:.2f}x", vs_raw));
  }
  if (prepared.raw_pjrt != nullptr) {
    // The plugin's own path to the same result, timed in the same turns as memcpy and staged.
    const double raw_pjrt_median = Median(times.raw_pjrt);
    json["vs_raw_pjrt"] = raw_pjrt_median / seconds;
    json["raw_pjrt_seconds_median"] = raw_pjrt_median;
    json["raw_pjrt_seconds_all"] = times.raw_pjrt;
    json["raw_pjrt_method"] = prepared.raw_pjrt_method;
    add_note(fmt::format("vs raw pjrt {:.2f}x ({})", raw_pjrt_median / seconds,
                         FormatSeconds(raw_pjrt_median)));
  }
  if (summary.floor.has_value()) {
    const double floor = *summary.floor;
    std::string note =
        fmt::format("floor pass {} (ferry {:.2f}x of it)", FormatSeconds(floor), floor / seconds);
    if (summary.has_staged) {
      note += fmt::format(": vs staged {:.2f}x at most", summary.staged_median / floor);
    }
    add_note(note);
  }
  if (peer_row.has_value()) AddPeerComparison(*peer_row, seconds, json, notes);
  if (!summary.has_staged) add_note(prepared.no_staged_note);
  if (HeapAccountingEnabled() && times.ferry_retained > 4 * kMiB) {
    add_note(fmt::format("peak extra: {} still allocated after the run (allocator slack)",
                         FormatBytes(static_cast<double>(times.ferry_retained))));
  }
  if (const std::optional<double> busy = other_cpu.OtherBusyPercent()) {
    json["other_cpu_percent"] = *busy;
    if (*busy > 10) add_note(fmt::format("other processes used {:.0f}% of the CPUs", *busy));
  }
  return notes;
}

// The case's line of the table.
std::string CaseRow(const CaseDefinition& definition, const PreparedCase& prepared,
                    const CaseTimes& times, const CaseSummary& summary, const std::string& notes) {
  const double seconds = summary.seconds;
  const std::string vs_staged = summary.has_staged
                                    ? fmt::format("{:.2f}x", summary.staged_median / seconds)
                                    : std::string("-");
  std::string staged_peak_text = "-";
  if (summary.has_staged) {
    staged_peak_text =
        HeapAccountingEnabled() ? FormatBytes(static_cast<double>(times.staged_peak)) : "n/a";
  }
  std::string all_notes = fmt::format(
      "peak extra {}, staged peak {}",
      HeapAccountingEnabled() ? FormatBytes(static_cast<double>(times.ferry_peak)) : "n/a",
      staged_peak_text);
  AddNote(all_notes, notes);
  std::string row = fmt::format(fmt::runtime(kRowFormat), definition.name,
                                FormatBytes(static_cast<double>(prepared.bytes)),
                                FormatSeconds(seconds), fmt::format("{:.2f}", summary.gbps),
                                fmt::format("{:.2f}x", summary.memcpy_median / seconds),
                                fmt::format("{:.2f}x", summary.copy_peak / seconds), vs_staged);
  return row + "\n" + NoteLines(all_notes);
}

CaseResult SkippedCase(const CaseDefinition& definition, const std::string& reason) {
  CaseResult skipped;
  skipped.skipped = true;
  skipped.json["case"] = definition.name;
  skipped.json["skipped"] = reason;
  skipped.row = CaseLine(definition.name, "skipped: " + reason);
  return skipped;
}

// Prepares, checks and times one case, and makes its JSON and its line of the table.
// `raw_clwrite_seconds_per_byte`: raw_clwrite's median time per byte when it ran earlier in this
// run, for the vs_raw_clwrite ratio; `peers` (--peers, for a case bench/peers.py knows, else
// null): timed once after each of ferry's runs.
StatusOr<CaseResult> RunCase(const CaseDefinition& definition, const CaseContext& context,
                             int repeats, std::optional<double> raw_clwrite_seconds_per_byte,
                             PeerSession* peers) {
  FERRY_ASSIGN_OR_RETURN(PreparedCase prepared, definition.prepare(context));
  if (prepared.skip_reason.has_value()) return SkippedCase(definition, *prepared.skip_reason);
  if (prepared.devices.empty()) prepared.devices = {context.device};
  FERRY_RETURN_IF_ERROR(WarmUpAndVerify(prepared, prepared.devices));
  CaseResult result;
  if (peers != nullptr) {
    if (Status status = peers->Prepare(definition.name); !status.ok()) {
      result.peers_failure = status.ToString();
    }
  }
  const OtherCpuMeter other_cpu(peers != nullptr ? peers->pid() : -1);

  FERRY_ASSIGN_OR_RETURN(YardstickBuffers buffers, AllocateYardstickBuffers(prepared));
  CaseTimes times;
  FERRY_RETURN_IF_ERROR(
      TimeFerryTurns(prepared, buffers, repeats, peers, times, result.peers_failure));
  const std::optional<Json> peer_row = FinishPeers(peers, definition, result);
  FERRY_RETURN_IF_ERROR(TimeYardstickTurns(prepared, buffers, repeats, times));
  FERRY_RETURN_IF_ERROR(AccountHeapPeaks(prepared, times));

  const CaseSummary summary = Summarize(prepared, times);
  result.json = CaseJson(definition, prepared, times, summary);
  Json& json = result.json;
  std::string notes = AddComparisons(prepared, times, summary, raw_clwrite_seconds_per_byte,
                                     peer_row, other_cpu, json);
  json["repeats"] = repeats;
  json["seconds_all"] = times.ferry;
  json["memcpy_seconds_all"] = times.memcpy;
  json["staged_seconds_all"] = times.staged;
  for (auto& [key, value] : prepared.details.items()) json[key] = value;
  if (prepared.after_timing) {
    buffers = {};  // the yardsticks' memory is not needed by what runs next
    prepared.after_timing(json, notes);
  }
  result.row = CaseRow(definition, prepared, times, summary, notes);
  return result;
}

// --- machine -----------------------------------------------------------------------------------

Json DescribeMachine() {
  Json machine;
  std::string cpu_model = "unknown";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos)
        cpu_model = line.substr(line.find_first_not_of(' ', colon + 1));
      break;
    }
  }
  machine["cpu_model"] = cpu_model;
  machine["cores"] = std::thread::hardware_concurrency();
  double load[3] = {0, 0, 0};
  if (getloadavg(load, 3) == 3) machine["load_average"] = {load[0], load[1], load[2]};
  // Before any case runs: the load average lags by a minute.
  OtherCpuMeter meter;
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  if (const auto busy = meter.OtherBusyPercent()) machine["cpu_busy_percent_before"] = *busy;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemTotal:", 0) == 0) {
      machine["memory_bytes"] = std::stoll(line.substr(9)) * 1024;  // "MemTotal: N kB"
      break;
    }
  }
  return machine;
}

// --- main --------------------------------------------------------------------------------------

}  // namespace

StatusOr<Json> RunPythonScript(const std::string& python, const std::string& script,
                               const std::string& arguments) {
  const std::string command =
      fmt::format("'{}' '{}/bench/{}' {}", python, FERRY_SOURCE_DIR, script, arguments);
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return InternalError(fmt::format("cannot run {}", command));
  std::string output;
  char buffer[4096];
  while (size_t n = fread(buffer, 1, sizeof(buffer), pipe)) output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return InternalError(fmt::format("{} exited with status {}", command, status));
  }
  Json parsed = Json::parse(output, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded() || !parsed.contains("results")) {
    return InternalError(fmt::format("{} printed no JSON results", command));
  }
  return parsed["results"];
}

namespace {

// Runs bench/py_bench.py with `python` and returns its result rows.
StatusOr<Json> RunPythonCases(const std::string& python, double scale, int repeats,
                              const std::string& device) {
  return RunPythonScript(
      python, "py_bench.py",
      fmt::format("--size {} --repeats {} --device '{}'", scale, repeats, device));
}

// A Python case's row of the table (kRowFormat; the columns it has no number for are "-"), its
// other numbers on lines of their own below.
std::string FormatPythonRow(const Json& row) {
  const std::string name = row["case"].get<std::string>();
  const double seconds = row["seconds_median"].get<double>();
  const bool small = name == "py_put_small";
  std::string line = fmt::format(
      fmt::runtime(kRowFormat), name, FormatBytes(row["bytes"].get<double>()),
      FormatSeconds(seconds), fmt::format("{:.2f}", row["gbps"].get<double>()),
      small ? std::string("-") : fmt::format("{:.2f}x", row["vs_memcpy"].get<double>()), "-", "-");
  if (small) {
    return line + "\n" +
           NoteLines(fmt::format("{:.0f} calls/s ({:.2f} us per call); batched list: {:.0f} "
                                 "tensors/s",
                                 row["calls_per_second"].get<double>(),
                                 row["seconds_per_call"].get<double>() * 1e6,
                                 row["batched_tensors_per_second"].get<double>()));
  }
  return line + "\n" +
         NoteLines(row.contains("vs_cpp_h2d_contiguous")
                       ? fmt::format("{:.2f}x the C++ h2d_contiguous case",
                                     row["vs_cpp_h2d_contiguous"].get<double>())
                       : std::string("(run h2d_contiguous too to compare with C++)"));
}

// The command line of ferry-bench.
struct BenchOptions {
  std::vector<std::string> case_names;
  double scale = 1.0;
  std::string json_path;
  std::string device_name = "host:0";
  int repeats = 7;
  std::optional<int> workers;
  bool list = false;
  bool device_queues = false;  // --device-queues
  bool peers = false;
  bool fresh_loads = false;     // --fresh-loads
  bool no_fresh_loads = false;  // --no-fresh-loads
  std::string python;

  // bench/fresh_loads.py runs with --fresh-loads, and on a whole --peers run (no --case) unless
  // --no-fresh-loads.
  bool RunsFreshLoads() const {
    return fresh_loads || (peers && case_names.empty() && !no_fresh_loads);
  }
  // bench/torch_xla_peers.py runs with --peers on a whole run, or when --torch-xla names its
  // Python.
  bool RunsTorchXla() const { return peers && (case_names.empty() || !torch_xla_python.empty()); }
  // torch_xla's interpreter (scripts/xla_env.sh's venv): with --peers, bench/torch_xla_peers.py
  // runs with it; empty: the default venv's, when it exists.
  std::string torch_xla_python;
};

void AddBenchOptions(CLI::App& app, BenchOptions& options) {
  app.add_option("--python", options.python,
                 "Also run the Python-layer cases (py_put_small, py_put_large; bench/py_bench.py) "
                 "with this interpreter, which must have the ferry package installed, and time "
                 "the real loaders (safetensors, torch.load; bench/loader_peers.py) in the file "
                 "cases");
  app.add_flag("--peers", options.peers,
               "Also time the same transfers with torch, jax and numpy (bench/peers.py, run with "
               "--python, else the source tree's .venv/bin/python) and add vs_torch, vs_jax and "
               "vs_numpy to the rows");
  auto* fresh = app.add_flag(
      "--fresh-loads", options.fresh_loads,
      "Also time checkpoint loads in fresh processes, warm and cold (bench/fresh_loads.py, with "
      "the peers' Python): ferry against safetensors, fastsafetensors, tensorizer and "
      "runai-model-streamer (scripts/python_env.sh --bench installs them) on a 1 GiB and a 2 GiB "
      "file and 20,000 small tensors, with time, GB/s and peak RSS. On with --peers and no "
      "--case");
  app.add_flag("--no-fresh-loads", options.no_fresh_loads, "--peers without the fresh loads")
      ->excludes(fresh);
  app.add_option("--torch-xla", options.torch_xla_python,
                 "With --peers: torch_xla's Python (default: scripts/xla_env.sh's venv, when it "
                 "exists, on a run without --case) for bench/torch_xla_peers.py: torch_xla 2.9 on "
                 "its CPU client, on the bare plugin and on ferry's, against ferry's devices");
  app.add_option("--case", options.case_names, "Run only these cases (repeatable, or a comma list)")
      ->delimiter(',');
  app.add_option("--size", options.scale,
                 "Multiply every case's size by this (e.g. 0.1 for a quick run)")
      ->check(CLI::PositiveNumber);
  app.add_option("--json", options.json_path, "Also write the results to this JSON file");
  app.add_option("--device", options.device_name, "Device as backend:index")->capture_default_str();
  app.add_option("--repeats", options.repeats, "Timed runs per case (the median is reported)")
      ->check(CLI::Range(5, 1000))
      ->capture_default_str();
  app.add_option("--workers", options.workers,
                 "Worker threads of the backend (default: the backend's)");
  app.add_flag("--list", options.list, "List the cases and exit");
  app.add_flag("--device-queues", options.device_queues,
               "Only this: staged puts and reads on one pjrt device alone against one on each of 4 "
               "devices at once (bench/device_queues.h; --size scales the 64 MiB per device, "
               "--repeats and --json apply)");
  // Help that fits the terminal, as the ferry command's.
  app.formatter(std::make_shared<cli::WrappingHelpFormatter>());
}

// A command line ferry-bench cannot run is InvalidArgument (exit status 2); a failure to start is
// any other code (exit status 1). The message follows "ferry-bench: ".
int ReportSetupError(const Status& status) {
  fmt::print(stderr, "{}", Wrapped(fmt::format("ferry-bench: {}", std::string(status.message()))));
  return status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

// The cases named by --case, in the order of `cases` (all of them without --case).
StatusOr<std::vector<const CaseDefinition*>> SelectCases(
    const std::vector<CaseDefinition>& cases, const std::vector<std::string>& case_names) {
  std::vector<const CaseDefinition*> selected;
  for (const CaseDefinition& definition : cases) {
    if (case_names.empty() ||
        std::find(case_names.begin(), case_names.end(), definition.name) != case_names.end()) {
      selected.push_back(&definition);
    }
  }
  for (const std::string& name : case_names) {
    if (std::none_of(cases.begin(), cases.end(),
                     [&](const CaseDefinition& d) { return name == d.name; })) {
      return InvalidArgumentError(fmt::format("unknown case '{}' (--list shows them)", name));
    }
  }
  return selected;
}

// The interpreter the peers run with: --python, else the source tree's .venv.
StatusOr<std::string> PeersPython(const std::string& python) {
  if (!python.empty()) return python;
  const std::filesystem::path venv =
      std::filesystem::path(FERRY_SOURCE_DIR) / ".venv" / "bin" / "python";
  if (!std::filesystem::exists(venv)) {
    return InvalidArgumentError(
        fmt::format("--peers needs --python PY (an interpreter with torch, jax, numpy and "
                    "ml_dtypes); there is no {}",
                    venv.string()));
  }
  return venv.string();
}

// The backend's client and the device the cases run on (--device backend:index).
struct BenchDevice {
  std::unique_ptr<Client> client;
  std::string backend;
  Device* device = nullptr;
};

StatusOr<BenchDevice> OpenBenchDevice(const std::string& device_name, std::optional<int> workers) {
  const size_t colon = device_name.find(':');
  BenchDevice opened;
  opened.backend = device_name.substr(0, colon);
  const std::string& backend = opened.backend;
  int device_index = 0;
  if (colon != std::string::npos) {
    const std::string index_text = device_name.substr(colon + 1);
    char* end = nullptr;
    const long index = std::strtol(index_text.c_str(), &end, 10);
    if (index_text.empty() || *end != '\0' || index < 0) {
      return InvalidArgumentError(fmt::format("--device '{}' is not backend:index", device_name));
    }
    device_index = static_cast<int>(index);
  }
  ClientOptions client_options;
  client_options.num_worker_threads = workers;
  // The host backend presents as many devices as asked: enough for the sharded cases' mesh. So
  // do CPU PJRT plugins (cpu_device_count); a plugin that refuses the option starts with its own
  // devices.
  if (backend == "host" || backend == "pjrt") {
    client_options.num_devices = std::max(kMeshDevices, device_index + 1);
  }
  StatusOr<std::unique_ptr<Client>> client = CreateClient(backend, client_options);
  if (!client.ok() && backend == "pjrt") {
    client_options.num_devices.reset();
    client = CreateClient(backend, client_options);
  }
  if (!client.ok()) {
    return UnavailableError(
        fmt::format("cannot start backend '{}': {}", backend, client.status().ToString()));
  }
  opened.client = std::move(*client);
  const auto devices = opened.client->devices();
  if (device_index >= static_cast<int>(devices.size())) {
    return InvalidArgumentError(fmt::format("backend '{}' has {} device(s); there is no index {}",
                                            backend, devices.size(), device_index));
  }
  opened.device = devices[device_index];
  return opened;
}

// The lines above the table: the machine, the settings, the peers, and the column titles.
void PrintPreamble(const Json& machine, const Device& device, const BenchOptions& options,
                   const std::string& peers_python) {
  fmt::print("{}", Wrapped(fmt::format(
                       "ferry-bench on {} ({} cores), device {}; size x{}, median of {} runs after "
                       "1 warm-up",
                       machine["cpu_model"].get<std::string>(), machine["cores"].get<unsigned>(),
                       device.name(), options.scale, options.repeats)));
  fmt::print("{}", Wrapped(fmt::format("h2d semantics: {} (the source is fully read when the call "
                                       "returns); GB/s = bytes read / time / 1e9",
                                       HostBufferSemanticsName(kBenchSemantics))));
  if (machine.contains("cpu_busy_percent_before") &&
      machine["cpu_busy_percent_before"].get<double>() > 10) {
    fmt::print("{}", Wrapped(fmt::format("note: the CPUs were {:.0f}% busy before the start: other "
                                         "work on this machine may skew the times",
                                         machine["cpu_busy_percent_before"].get<double>())));
  }
  if (options.peers) {
    fmt::print("{}", Wrapped(fmt::format("peers: torch, jax and numpy ({} bench/peers.py) timed "
                                         "turn by turn with ferry's runs",
                                         peers_python)));
    // On a pjrt device, jax puts onto the same plugin (jax.device_put to a registered plugin).
    const std::string jax_plugin = PjrtPluginPathOf(&device);
    if (!jax_plugin.empty()) {
      fmt::print("{}", Wrapped(fmt::format("peers: jax puts onto the plugin {}", jax_plugin)));
    }
  }
}

void PrintTableHeader() {
  fmt::print("{}\n", fmt::format(fmt::runtime(kRowFormat), "case", "bytes", "median", "GB/s",
                                 "vs memcpy", "vs peak", "vs staged"));
  fmt::print("  then: peak extra, staged peak; notes\n");
  std::fflush(stdout);
}

// The C++ cases' rows, and what the run learned along the way.
struct CaseRows {
  Json results = Json::array();
  Json fresh_loads;  // bench/fresh_loads.py's results (--fresh-loads)
  Json torch_xla;    // bench/torch_xla_peers.py's results (--peers, with torch_xla's venv)
  int failures = 0;
  Json peers_versions;  // from the last peers.py row
  bool peers_failed = false;
};

// Runs the selected cases in turn, printing each row as it is done.
CaseRows RunCases(absl::Span<const CaseDefinition* const> selected, const CaseContext& context,
                  int repeats, PeerSession* peer_session) {
  CaseRows rows;
  const Device* device = context.device;
  std::optional<double> raw_clwrite_seconds_per_byte;
  for (const CaseDefinition* definition : selected) {
    const bool with_peers = peer_session != nullptr && HasPeers(definition->name);
    StatusOr<CaseResult> result =
        RunCase(*definition, context, repeats, raw_clwrite_seconds_per_byte,
                with_peers ? peer_session : nullptr);
    if (result.ok() && result->peers_failure.has_value()) {
      rows.peers_failed = true;
      fmt::print("{}", Wrapped(fmt::format("peers FAILED: {}", *result->peers_failure)));
    }
    if (result.ok() && !result->peers_versions.is_null()) {
      rows.peers_versions = result->peers_versions;
    }
    if (!result.ok()) {
      ++rows.failures;
      fmt::print("{}", CaseLine(definition->name, "FAILED: " + result.status().ToString()));
      rows.results.push_back({{"case", definition->name}, {"error", result.status().ToString()}});
    } else {
      fmt::print("{}", result->row);
      if (!result->skipped && std::string_view(definition->name) == "raw_clwrite") {
        raw_clwrite_seconds_per_byte =
            result->json["seconds_median"].get<double>() / result->json["bytes"].get<double>();
      }
      result->json["device"] = device->name();
      rows.results.push_back(std::move(result->json));
    }
    std::fflush(stdout);
  }
  return rows;
}

// Runs the Python-layer cases (--python), printing their rows and adding them to `rows`.
void RunPythonRows(const std::string& python, const BenchOptions& options, const Device& device,
                   CaseRows& rows) {
  StatusOr<Json> python_rows =
      RunPythonCases(python, options.scale, options.repeats, device.name());
  if (!python_rows.ok()) {
    ++rows.failures;
    fmt::print("{}",
               Wrapped(fmt::format("python cases FAILED: {}", python_rows.status().ToString())));
    return;
  }
  // The Python layer against the C++ case it wraps, from this same run.
  std::optional<double> cpp_large;
  for (const Json& row : rows.results) {
    if (row.value("case", "") == "h2d_contiguous" && row.contains("seconds_median")) {
      cpp_large = row["seconds_median"].get<double>();
    }
  }
  for (Json& row : *python_rows) {
    if (row["case"] == "py_put_large" && cpp_large.has_value()) {
      row["vs_cpp_h2d_contiguous"] = *cpp_large / row["seconds_median"].get<double>();
    }
    fmt::print("{}", FormatPythonRow(row));
    row["device"] = device.name();
    rows.results.push_back(std::move(row));
  }
}

// A section of the run that a bench script measures on its own (its table on stderr as it runs):
// its results, or null after saying why it failed (counted in rows.failures).
Json RunPythonSection(const std::string& python, const std::string& script,
                      const std::string& arguments, CaseRows& rows) {
  std::fflush(stdout);
  StatusOr<Json> results = RunPythonScript(python, script, arguments);
  if (!results.ok()) {
    fmt::print(stderr, "{}",
               Wrapped(fmt::format("ferry-bench: {} failed: {}", script,
                                   std::string(results.status().message()))));
    ++rows.failures;
    return Json();
  }
  return *std::move(results);
}

// bench/fresh_loads.py with `python` (its table goes to the terminal as it runs, its rows into
// `rows.fresh_loads`), using the `ferry` command installed beside that interpreter.
void RunFreshLoads(const std::string& python, CaseRows& rows) {
  fmt::print("\n{}", Wrapped("fresh-process loads (bench/fresh_loads.py): each load a new "
                             "process, loaders interleaved; the table follows on stderr"));
  const std::string ferry = (std::filesystem::path(python).parent_path() / "ferry").string();
  rows.fresh_loads =
      RunPythonSection(python, "fresh_loads.py", fmt::format("--json - --ferry '{}'", ferry), rows);
}

// bench/torch_xla_peers.py (its table to the terminal, its results into rows.torch_xla), with
// `xla_python` or the default venv of scripts/xla_env.sh; a note when there is none.
void RunTorchXlaPeers(std::string xla_python, const std::string& python, CaseRows& rows) {
  if (xla_python.empty()) {
    const char* cache = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    const std::filesystem::path base = cache != nullptr && *cache != '\0'
                                           ? std::filesystem::path(cache)
                                           : std::filesystem::path(home ? home : "/") / ".cache";
    const std::filesystem::path venv = base / "ferry" / "venv-xla" / "bin" / "python";
    if (!std::filesystem::exists(venv)) {
      fmt::print("\n{}", Wrapped(fmt::format("torch_xla peers skipped: no {} (scripts/xla_env.sh "
                                             "makes it; or --torch-xla PY)",
                                             venv.string())));
      return;
    }
    xla_python = venv.string();
  }
  fmt::print("\n{}", Wrapped("torch_xla 2.9 against ferry (bench/torch_xla_peers.py): each "
                             "configuration a process of its own; the table follows on stderr"));
  rows.torch_xla = RunPythonSection(python, "torch_xla_peers.py",
                                    fmt::format("--json - --xla-python '{}'", xla_python), rows);
}

// Writes --json: the rows, the machine and the settings of the run.
Status WriteResultsJson(const BenchOptions& options, const std::string& peers_python,
                        const Device& device, Json machine, CaseRows& rows) {
  Json document;
  document["results"] = std::move(rows.results);
  machine["device"] = device.name();
  document["machine"] = std::move(machine);
  document["settings"] = {{"size", options.scale},
                          {"repeats", options.repeats},
                          {"warmup_runs", 1},
                          {"h2d_semantics", std::string(HostBufferSemanticsName(kBenchSemantics))},
                          {"heap_accounting", HeapAccountingEnabled() ? "malloc interposition"
                                                                      : "off (sanitizer build)"}};
  if (!rows.fresh_loads.is_null()) document["fresh_loads"] = std::move(rows.fresh_loads);
  if (!rows.torch_xla.is_null()) document["torch_xla"] = std::move(rows.torch_xla);
  if (options.peers) {
    document["settings"]["peers_python"] = peers_python;
    if (!rows.peers_versions.is_null()) {
      document["settings"]["peers_versions"] = rows.peers_versions;
    }
  }
  std::ofstream out(options.json_path);
  out << document.dump(2) << "\n";
  if (!out) return InternalError(fmt::format("cannot write {}", options.json_path));
  return OkStatus();
}

int RunBench(int argc, char** argv) {
  CLI::App app{"ferry-bench: ferry's transfers next to memcpy and the old staged path"};
  BenchOptions options;
  AddBenchOptions(app, options);
  CLI11_PARSE(app, argc, argv);

  if (options.device_queues) {
    DeviceQueuesOptions queues;
    queues.bytes_per_device = static_cast<int64_t>(queues.bytes_per_device * options.scale);
    queues.repeats = options.repeats;
    queues.json_path = options.json_path;
    return RunDeviceQueues(queues);
  }
  const std::vector<CaseDefinition> cases = AllCases();
  if (options.list) {
    // Each case's description wrapped beside its name.
    for (const CaseDefinition& definition : cases) {
      fmt::print("{}", CaseLine(definition.name, definition.description));
    }
    return 0;
  }
  StatusOr<std::vector<const CaseDefinition*>> selected = SelectCases(cases, options.case_names);
  if (!selected.ok()) return ReportSetupError(selected.status());
  std::string peers_python = options.python;
  if (options.peers || options.RunsFreshLoads()) {
    StatusOr<std::string> python = PeersPython(options.python);
    if (!python.ok()) return ReportSetupError(python.status());
    peers_python = *python;
  }
  StatusOr<BenchDevice> opened = OpenBenchDevice(options.device_name, options.workers);
  if (!opened.ok()) return ReportSetupError(opened.status());
  Device* device = opened->device;

  Json machine = DescribeMachine();
  PrintPreamble(machine, *device, options, peers_python);
  // The peers run in a process of their own (bench/peers.py --serve), started once: for each
  // case they build their own source, then are timed once after each of ferry's timed runs.
  std::unique_ptr<PeerSession> peer_session;
  if (options.peers) {
    peer_session = PeerSession::Start(peers_python, options.scale, PjrtPluginPathOf(device));
  }
  PrintTableHeader();

  CaseContext context{device, options.scale, {}, {}, options.repeats, options.python};
  const auto devices = opened->client->devices();
  if (devices.size() >= static_cast<size_t>(kMeshDevices)) {
    context.mesh_devices.assign(devices.begin(), devices.begin() + kMeshDevices);
  } else {
    context.mesh_unavailable = fmt::format("the 2x2 mesh needs {} devices; backend '{}' has {}",
                                           kMeshDevices, opened->backend, devices.size());
  }
  CaseRows rows = RunCases(*selected, context, options.repeats, peer_session.get());
  if (!options.python.empty()) RunPythonRows(options.python, options, *device, rows);
  if (options.RunsFreshLoads()) RunFreshLoads(peers_python, rows);
  if (options.RunsTorchXla()) RunTorchXlaPeers(options.torch_xla_python, peers_python, rows);

  if (!options.json_path.empty()) {
    if (Status written = WriteResultsJson(options, peers_python, *device, std::move(machine), rows);
        !written.ok()) {
      return ReportSetupError(written);
    }
  }
  if (rows.peers_failed) ++rows.failures;
  return rows.failures == 0 ? 0 : 1;
}

}  // namespace

// The entry point of ferry-bench and of `ferry bench`.
int Main(int argc, char** argv) { return RunBench(argc, argv); }
}  // namespace ferry::bench
