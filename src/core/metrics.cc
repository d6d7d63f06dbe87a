#include "ferry/core/metrics.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "src/core/fork_locks.h"

namespace ferry {
namespace {

// The registry lives for the whole process and is never destroyed: runtime threads may still
// record samples while static destructors run at exit.
struct Registry {
  Mutex mutex;
  // std::map nodes never move, so the pointers handed out stay valid; std::less<> allows lookup
  // by string_view without building a string.
  std::map<std::string, std::unique_ptr<Counter>, std::less<>> counters ABSL_GUARDED_BY(mutex);
  std::map<std::string, std::unique_ptr<Metric>, std::less<>> metrics ABSL_GUARDED_BY(mutex);
  std::map<std::string, std::unique_ptr<Gauge>, std::less<>> gauges ABSL_GUARDED_BY(mutex);
  // ValueRate divides by the time since this point: registry creation, or the last ResetMetrics.
  std::chrono::steady_clock::time_point rate_epoch ABSL_GUARDED_BY(mutex) =
      std::chrono::steady_clock::now();
};

Registry& GetRegistry();

}  // namespace

namespace internal {

// Around fork(): the registry's lock, then (as MetricsReport does) every metric's own, so that no
// other thread is inside either when the child is made.
struct MetricsForkLock {
  static void Lock(void*) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Registry& registry = GetRegistry();
    registry.mutex.Lock();
    for (auto& [name, metric] : registry.metrics) metric->mutex_.Lock();
  }
  static void Unlock(void*) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Registry& registry = GetRegistry();
    for (auto& [name, metric] : registry.metrics) metric->mutex_.Unlock();
    registry.mutex.Unlock();
  }
};

}  // namespace internal

namespace {

Registry& GetRegistry() {
  static Registry* const registry = [] {
    auto* created = new Registry();
    internal::RegisterForkLock(internal::ForkLockRank::kMetricsRegistry,
                               &internal::MetricsForkLock::Lock, &internal::MetricsForkLock::Unlock,
                               nullptr);
    return created;
  }();
  return *registry;
}

constexpr double kReportPercents[] = {1, 5, 10, 20, 50, 80, 90, 95, 99};

std::string FormatSeconds(double seconds) {
  const double magnitude = std::fabs(seconds);
  if (magnitude == 0) return "0s";
  if (magnitude < 1e-6) return absl::StrFormat("%.3fns", seconds * 1e9);
  if (magnitude < 1e-3) return absl::StrFormat("%.3fus", seconds * 1e6);
  if (magnitude < 1) return absl::StrFormat("%.3fms", seconds * 1e3);
  return absl::StrFormat("%.3fs", seconds);
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kSuffixes[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  double scaled = bytes;
  size_t suffix = 0;
  while (std::fabs(scaled) >= 1024 && suffix + 1 < std::size(kSuffixes)) {
    scaled /= 1024;
    ++suffix;
  }
  if (suffix == 0) return absl::StrFormat("%.0fB", scaled);
  return absl::StrFormat("%.2f%s", scaled, kSuffixes[suffix]);
}

std::string FormatCount(double count) {
  if (count == std::trunc(count) && std::fabs(count) < 1e15) {
    return absl::StrCat(static_cast<int64_t>(count));
  }
  return absl::StrFormat("%.3f", count);
}

std::string FormatValue(double value, MetricUnit unit) {
  switch (unit) {
    case MetricUnit::kSeconds:
      return FormatSeconds(value);
    case MetricUnit::kBytes:
      return FormatBytes(value);
    case MetricUnit::kCount:
      return FormatCount(value);
  }
  return FormatCount(value);
}

}  // namespace

void Metric::AddSample(double value) {
  MutexLock lock(mutex_);
  ++total_samples_;
  accumulator_ += value;
  window_.push_back(value);
  if (window_.size() > kWindow) window_.pop_front();
}

int64_t Metric::TotalSamples() const {
  MutexLock lock(mutex_);
  return total_samples_;
}

double Metric::Accumulator() const {
  MutexLock lock(mutex_);
  return accumulator_;
}

// Linear interpolation between the two nearest ranks (numpy's default): percent p of n sorted
// samples lies at position p/100 * (n - 1).
std::vector<double> Metric::Percentiles(const std::vector<double>& percents) const {
  std::vector<double> sorted;
  {
    MutexLock lock(mutex_);
    sorted.assign(window_.begin(), window_.end());
  }
  std::vector<double> result(percents.size(), 0.0);
  if (sorted.empty()) return result;
  std::sort(sorted.begin(), sorted.end());
  const double last_index = static_cast<double>(sorted.size() - 1);
  for (size_t i = 0; i < percents.size(); ++i) {
    const double position = std::clamp(percents[i], 0.0, 100.0) / 100.0 * last_index;
    const size_t below = static_cast<size_t>(std::floor(position));
    const size_t above = std::min(below + 1, sorted.size() - 1);
    const double fraction = position - static_cast<double>(below);
    result[i] = sorted[below] + (sorted[above] - sorted[below]) * fraction;
  }
  return result;
}

void Metric::Reset() {
  MutexLock lock(mutex_);
  total_samples_ = 0;
  accumulator_ = 0;
  window_.clear();
}

// The entry named `name` of one of the registry's maps, created from `args` on first use; a name
// asked for again with other arguments (another unit) keeps the entry it was created with.
namespace {

template <typename Entry, typename... Args>
Entry* FindOrCreate(std::map<std::string, std::unique_ptr<Entry>, std::less<>>& entries,
                    std::string_view name, Args... args) {
  auto it = entries.find(name);
  if (it == entries.end()) {
    it = entries.emplace(std::string(name), std::make_unique<Entry>(args...)).first;
  }
  return it->second.get();
}

}  // namespace

Counter* GetCounter(std::string_view name) {
  Registry& registry = GetRegistry();
  MutexLock lock(registry.mutex);
  return FindOrCreate(registry.counters, name);
}

Metric* GetMetric(std::string_view name, MetricUnit unit) {
  Registry& registry = GetRegistry();
  MutexLock lock(registry.mutex);
  return FindOrCreate(registry.metrics, name, unit);
}

Gauge* GetGauge(std::string_view name, MetricUnit unit) {
  Registry& registry = GetRegistry();
  MutexLock lock(registry.mutex);
  return FindOrCreate(registry.gauges, name, unit);
}

std::string MetricsReport() {
  Registry& registry = GetRegistry();
  MutexLock lock(registry.mutex);
  const double elapsed_seconds = std::max(
      1e-9, std::chrono::duration<double>(std::chrono::steady_clock::now() - registry.rate_epoch)
                .count());
  const std::vector<double> percents(std::begin(kReportPercents), std::end(kReportPercents));
  std::string report;
  for (const auto& [name, metric] : registry.metrics) {
    const int64_t total_samples = metric->TotalSamples();
    if (total_samples == 0) continue;
    const MetricUnit unit = metric->unit();
    const double accumulator = metric->Accumulator();
    const std::vector<double> values = metric->Percentiles(percents);
    std::vector<std::string> percentiles;
    percentiles.reserve(percents.size());
    for (size_t i = 0; i < percents.size(); ++i) {
      percentiles.push_back(absl::StrCat(percents[i], "%=", FormatValue(values[i], unit)));
    }
    absl::StrAppend(&report, "Metric: ", name, "\n");
    absl::StrAppend(&report, "  TotalSamples: ", total_samples, "\n");
    absl::StrAppend(&report, "  Accumulator: ", FormatValue(accumulator, unit), "\n");
    absl::StrAppend(&report, "  ValueRate: ", FormatValue(accumulator / elapsed_seconds, unit),
                    " / second\n");
    absl::StrAppend(&report, "  Percentiles: ", absl::StrJoin(percentiles, "; "), "\n");
  }
  for (const auto& [name, counter] : registry.counters) {
    const int64_t value = counter->Value();
    if (value == 0) continue;
    absl::StrAppend(&report, "Counter: ", name, "\n");
    absl::StrAppend(&report, "  Value: ", value, "\n");
  }
  for (const auto& [name, gauge] : registry.gauges) {
    absl::StrAppend(&report, "Gauge: ", name, "\n");
    absl::StrAppend(&report,
                    "  Value: ", FormatValue(static_cast<double>(gauge->Value()), gauge->unit()),
                    "\n");
  }
  return report;
}

std::map<std::string, double> MetricsSnapshot() {
  Registry& registry = GetRegistry();
  MutexLock lock(registry.mutex);
  std::map<std::string, double> snapshot;
  for (const auto& [name, counter] : registry.counters) {
    snapshot[name] = static_cast<double>(counter->Value());
  }
  for (const auto& [name, metric] : registry.metrics) {
    snapshot[name + ".count"] = static_cast<double>(metric->TotalSamples());
    snapshot[name + ".sum"] = metric->Accumulator();
  }
  for (const auto& [name, gauge] : registry.gauges) {
    snapshot[name] = static_cast<double>(gauge->Value());
  }
  return snapshot;
}

void ResetMetrics() {
  Registry& registry = GetRegistry();
  MutexLock lock(registry.mutex);
  for (auto& [name, counter] : registry.counters) counter->Reset();
  for (auto& [name, metric] : registry.metrics) metric->Reset();
  registry.rate_epoch = std::chrono::steady_clock::now();
}

namespace metrics {

#define FERRY_DEFINE_METRIC(Name, unit)                               \
  Metric* Name() {                                                    \
    static Metric* const metric = GetMetric(#Name, MetricUnit::unit); \
    return metric;                                                    \
  }
#define FERRY_DEFINE_COUNTER(Name)                     \
  Counter* Name() {                                    \
    static Counter* const counter = GetCounter(#Name); \
    return counter;                                    \
  }

FERRY_DEFINE_METRIC(TransferToDeviceTime, kSeconds)
FERRY_DEFINE_METRIC(TransferFromDeviceTime, kSeconds)
FERRY_DEFINE_METRIC(OutboundData, kBytes)
FERRY_DEFINE_METRIC(InboundData, kBytes)
FERRY_DEFINE_COUNTER(CreateDataHandles)
FERRY_DEFINE_COUNTER(DestroyDataHandles)
FERRY_DEFINE_COUNTER(DirectTransfers)
FERRY_DEFINE_COUNTER(ConvertedTransfers)
FERRY_DEFINE_COUNTER(SourceDowncasts)
FERRY_DEFINE_COUNTER(ZeroCopyAliases)
FERRY_DEFINE_COUNTER(ZeroCopyFallbacks)
FERRY_DEFINE_COUNTER(ReplicaDeviceCopies)
FERRY_DEFINE_COUNTER(StagingBytes)
FERRY_DEFINE_COUNTER(FileBytesReadInPlace)
FERRY_DEFINE_COUNTER(HostBytesPrefaulted)

#define FERRY_DEFINE_GAUGE(Name, unit)                             \
  Gauge* Name() {                                                  \
    static Gauge* const gauge = GetGauge(#Name, MetricUnit::unit); \
    return gauge;                                                  \
  }

FERRY_DEFINE_GAUGE(HostMemoryCacheBytes, kBytes)
FERRY_DEFINE_GAUGE(HostMemoryCacheLimitBytes, kBytes)
FERRY_DEFINE_GAUGE(DeviceMemoryCacheBytes, kBytes)
FERRY_DEFINE_GAUGE(DeviceMemoryCacheLimitBytes, kBytes)

#undef FERRY_DEFINE_GAUGE
#undef FERRY_DEFINE_COUNTER
#undef FERRY_DEFINE_METRIC

}  // namespace metrics
}  // namespace ferry
