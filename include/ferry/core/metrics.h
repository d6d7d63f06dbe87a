// Metrics: process-wide counters and value metrics, in the manner of torch_xla's metrics.
//
// Counters count events (`DirectTransfers`); value metrics keep every sample's running total and a
// bounded window of recent samples for percentiles (`TransferToDeviceTime`, in seconds;
// `OutboundData`, in bytes); gauges hold a level that goes up and down (`HostMemoryCacheBytes`).
// Both are created on first use by name and live for the whole process; the pointers returned are
// never invalidated. All operations are thread-safe; counters are lock-free.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "ferry/core/mutex.h"

namespace ferry {

namespace internal {
struct MetricsForkLock;  // metrics.cc: takes every metric's lock around fork()
}  // namespace internal

class Counter {
 public:
  void Add(int64_t delta = 1) { value_.fetch_add(delta, std::memory_order_relaxed); }
  int64_t Value() const { return value_.load(std::memory_order_relaxed); }
  void Reset() { value_.store(0, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> value_{0};
};

enum class MetricUnit { kSeconds, kBytes, kCount };

class Metric {
 public:
  explicit Metric(MetricUnit unit) : unit_(unit) {}

  void AddSample(double value);
  int64_t TotalSamples() const;
  double Accumulator() const;
  // Percentiles (0..100) over the most recent kWindow samples; 0 when there are none.
  std::vector<double> Percentiles(const std::vector<double>& percents) const;
  MetricUnit unit() const { return unit_; }
  void Reset();

  static constexpr size_t kWindow = 1024;

 private:
  friend struct internal::MetricsForkLock;
  const MetricUnit unit_;
  mutable Mutex mutex_;
  int64_t total_samples_ ABSL_GUARDED_BY(mutex_) = 0;
  double accumulator_ ABSL_GUARDED_BY(mutex_) = 0;
  std::deque<double> window_ ABSL_GUARDED_BY(mutex_);
};

// A level that goes up and down (bytes a cache holds, its limit): set by its owner, read by the
// report. ResetMetrics leaves gauges alone: they say how things are, not what happened.
class Gauge {
 public:
  explicit Gauge(MetricUnit unit) : unit_(unit) {}
  void Set(int64_t value) { value_.store(value, std::memory_order_relaxed); }
  void Add(int64_t delta) { value_.fetch_add(delta, std::memory_order_relaxed); }
  int64_t Value() const { return value_.load(std::memory_order_relaxed); }
  MetricUnit unit() const { return unit_; }

 private:
  const MetricUnit unit_;
  std::atomic<int64_t> value_{0};
};

// Returns the process-wide metric, counter or gauge named `name`, creating it on first use.
Counter* GetCounter(std::string_view name);
Metric* GetMetric(std::string_view name, MetricUnit unit);
Gauge* GetGauge(std::string_view name, MetricUnit unit);

// The report, for every metric with samples: `Metric: NAME`, `TotalSamples`, `Accumulator`,
// `ValueRate`, `Percentiles` (1%, 5%, 10%, 20%, 50%, 80%, 90%, 95%, 99%); then for every non-zero
// counter `Counter: NAME` and `Value`; then for every gauge, zero or not, `Gauge: NAME` and
// `Value` (in its unit).
std::string MetricsReport();
// name -> value: counters and gauges by name; metrics as `NAME.count` and `NAME.sum`.
std::map<std::string, double> MetricsSnapshot();
// Zeroes every counter and metric (tests and benchmarks); gauges keep their levels.
void ResetMetrics();

// Adds the seconds between construction and destruction to `metric`.
class ScopedTimer {
 public:
  explicit ScopedTimer(Metric* metric)
      : metric_(metric), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    metric_->AddSample(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count());
  }
  ScopedTimer(const ScopedTimer&) = delete;
  ScopedTimer& operator=(const ScopedTimer&) = delete;

 private:
  Metric* metric_;
  std::chrono::steady_clock::time_point start_;
};

// The metrics DESIGN.md names, as accessors (each a cached GetCounter/GetMetric).
namespace metrics {
Metric* TransferToDeviceTime();    // seconds per TransferToDevice call
Metric* TransferFromDeviceTime();  // seconds per TransferFromDevice call
Metric* OutboundData();            // bytes read from host sources, per transfer
Metric* InboundData();             // bytes written to host destinations, per read
Counter* CreateDataHandles();
Counter* DestroyDataHandles();
Counter* DirectTransfers();          // same dtype, no conversion
Counter* ConvertedTransfers();       // source dtype != device dtype (or device -> other host dtype)
Counter* SourceDowncasts();          // the dtype policy picked a narrower device dtype
Counter* ZeroCopyAliases();          // kImmutableZeroCopy buffers that alias their source
Counter* ZeroCopyFallbacks();        // kImmutableZeroCopy requests that had to copy instead
Counter* StagingBytes();             // bytes that went through a staging buffer
Counter* ReplicaDeviceCopies();      // sharded replicas copied device to device, not uploaded again
Counter* FileBytesReadInPlace();     // file bytes read straight into device memory (file_read.h)
Counter* HostBytesPrefaulted();      // host bytes faulted in ahead of ferry's writes (prefault.h)
Gauge* HostMemoryCacheBytes();       // bytes of freed host memory the cache holds for reuse
Gauge* HostMemoryCacheLimitBytes();  // the most it may hold (FERRY_HOST_MEMORY_CACHE_BYTES)
// Freed device memory kept for reuse by the backends that cache it (opencl: each device's cache,
// a quarter of its global memory at most 2 GiB), summed over every live device of every client.
Gauge* DeviceMemoryCacheBytes();
Gauge* DeviceMemoryCacheLimitBytes();  // the most those caches may hold together
}  // namespace metrics

}  // namespace ferry
