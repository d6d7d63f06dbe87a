#include "ferry/core/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ferry {
namespace {

using ::testing::DoubleEq;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The registry is process-wide: every test uses names of its own.

TEST(MetricsTest, percentiles_of_known_samples) {
  Metric metric(MetricUnit::kCount);
  EXPECT_THAT(metric.Percentiles({50}), ElementsAre(DoubleEq(0)));  // no samples yet
  // 1..101 in a shuffled order: the p-th percentile is exactly 1 + p.
  std::vector<double> samples;
  for (int i = 1; i <= 101; ++i) samples.push_back(i);
  const unsigned seed = std::random_device()();
  std::printf("seed %u\n", seed);
  std::mt19937 random(seed);
  std::shuffle(samples.begin(), samples.end(), random);
  for (double sample : samples) metric.AddSample(sample);
  EXPECT_EQ(metric.TotalSamples(), 101);
  EXPECT_DOUBLE_EQ(metric.Accumulator(), 101 * 102 / 2);
  EXPECT_THAT(metric.Percentiles({0, 1, 10, 50, 99, 100}),
              ElementsAre(DoubleEq(1), DoubleEq(2), DoubleEq(11), DoubleEq(51), DoubleEq(100),
                          DoubleEq(101)));
}

TEST(MetricsTest, percentiles_interpolate_between_ranks) {
  Metric metric(MetricUnit::kSeconds);
  metric.AddSample(4);
  metric.AddSample(2);
  EXPECT_THAT(metric.Percentiles({0, 25, 50, 100}),
              ElementsAre(DoubleEq(2), DoubleEq(2.5), DoubleEq(3), DoubleEq(4)));
  Metric single(MetricUnit::kSeconds);
  single.AddSample(0.25);
  EXPECT_THAT(single.Percentiles({1, 99}), ElementsAre(DoubleEq(0.25), DoubleEq(0.25)));
}

TEST(MetricsTest, percentiles_cover_only_the_recent_window) {
  Metric metric(MetricUnit::kCount);
  for (size_t i = 0; i < Metric::kWindow; ++i) metric.AddSample(1000);
  for (size_t i = 0; i < Metric::kWindow; ++i) metric.AddSample(1);
  EXPECT_EQ(metric.TotalSamples(), static_cast<int64_t>(2 * Metric::kWindow));
  EXPECT_DOUBLE_EQ(metric.Accumulator(), 1001.0 * Metric::kWindow);
  // The old samples have left the window: even the maximum is a recent one.
  EXPECT_THAT(metric.Percentiles({100}), ElementsAre(DoubleEq(1)));
}

TEST(MetricsTest, registry_returns_the_same_pointer_for_a_name) {
  Counter* counter = GetCounter("MetricsTest.SameCounter");
  Metric* metric = GetMetric("MetricsTest.SameMetric", MetricUnit::kBytes);
  // Create many others so a rebalancing container would move things.
  for (int i = 0; i < 200; ++i) {
    GetCounter("MetricsTest.Filler" + std::to_string(i));
    GetMetric("MetricsTest.FillerMetric" + std::to_string(i), MetricUnit::kCount);
  }
  EXPECT_EQ(GetCounter("MetricsTest.SameCounter"), counter);
  EXPECT_EQ(GetMetric("MetricsTest.SameMetric", MetricUnit::kBytes), metric);
  EXPECT_EQ(metric->unit(), MetricUnit::kBytes);
  EXPECT_NE(static_cast<void*>(GetCounter("MetricsTest.OtherCounter")),
            static_cast<void*>(counter));
}

TEST(MetricsTest, named_accessors_are_stable_and_named) {
  EXPECT_EQ(metrics::TransferToDeviceTime(),
            GetMetric("TransferToDeviceTime", MetricUnit::kSeconds));
  EXPECT_EQ(metrics::OutboundData(), GetMetric("OutboundData", MetricUnit::kBytes));
  EXPECT_EQ(metrics::OutboundData()->unit(), MetricUnit::kBytes);
  EXPECT_EQ(metrics::TransferFromDeviceTime()->unit(), MetricUnit::kSeconds);
  EXPECT_EQ(metrics::DirectTransfers(), GetCounter("DirectTransfers"));
  EXPECT_EQ(metrics::StagingBytes(), GetCounter("StagingBytes"));
  EXPECT_EQ(metrics::ZeroCopyFallbacks(), GetCounter("ZeroCopyFallbacks"));
}

TEST(MetricsTest, report_contains_the_expected_lines) {
  Metric* time = GetMetric("MetricsTest.ReportTime", MetricUnit::kSeconds);
  time->AddSample(0.5);
  time->AddSample(1.0);
  time->AddSample(1.5);
  Metric* bytes = GetMetric("MetricsTest.ReportBytes", MetricUnit::kBytes);
  bytes->AddSample(1024 * 1024);
  bytes->AddSample(512 * 1024);
  GetCounter("MetricsTest.ReportCounter")->Add(7);
  GetCounter("MetricsTest.ReportZeroCounter");                       // zero: left out
  GetMetric("MetricsTest.ReportEmptyMetric", MetricUnit::kSeconds);  // no samples: left out

  const std::string report = MetricsReport();
  EXPECT_THAT(report, HasSubstr("Metric: MetricsTest.ReportTime\n"
                                "  TotalSamples: 3\n"
                                "  Accumulator: 3.000s\n"
                                "  ValueRate: "));
  EXPECT_THAT(report, HasSubstr("  Percentiles: 1%=510.000ms; 5%=550.000ms; 10%=600.000ms; "
                                "20%=700.000ms; 50%=1.000s; 80%=1.300s; 90%=1.400s; 95%=1.450s; "
                                "99%=1.490s\n"));
  EXPECT_THAT(report, HasSubstr("Metric: MetricsTest.ReportBytes\n"
                                "  TotalSamples: 2\n"
                                "  Accumulator: 1.50MB\n"));
  EXPECT_THAT(report, HasSubstr("Counter: MetricsTest.ReportCounter\n  Value: 7\n"));
  EXPECT_THAT(report, Not(HasSubstr("MetricsTest.ReportZeroCounter")));
  EXPECT_THAT(report, Not(HasSubstr("MetricsTest.ReportEmptyMetric")));
  // Metrics come before counters.
  EXPECT_LT(report.find("Metric: MetricsTest.ReportTime"),
            report.find("Counter: MetricsTest.ReportCounter"));
}

TEST(MetricsTest, report_shows_small_times_and_byte_rates_in_readable_units) {
  Metric* time = GetMetric("MetricsTest.SmallTime", MetricUnit::kSeconds);
  time->AddSample(0.000250);
  Metric* bytes = GetMetric("MetricsTest.SmallBytes", MetricUnit::kBytes);
  bytes->AddSample(100);
  const std::string report = MetricsReport();
  EXPECT_THAT(report, HasSubstr("Metric: MetricsTest.SmallTime\n  TotalSamples: 1\n"
                                "  Accumulator: 250.000us\n"));
  EXPECT_THAT(report, HasSubstr("Metric: MetricsTest.SmallBytes\n  TotalSamples: 1\n"
                                "  Accumulator: 100B\n"));
  EXPECT_THAT(report, HasSubstr("/ second\n"));
}

TEST(MetricsTest, snapshot_has_counters_and_metric_counts_and_sums) {
  GetCounter("MetricsTest.SnapshotCounter")->Add(3);
  Metric* metric = GetMetric("MetricsTest.SnapshotMetric", MetricUnit::kBytes);
  metric->AddSample(10);
  metric->AddSample(32);
  const std::map<std::string, double> snapshot = MetricsSnapshot();
  ASSERT_TRUE(snapshot.count("MetricsTest.SnapshotCounter"));
  EXPECT_EQ(snapshot.at("MetricsTest.SnapshotCounter"), 3);
  ASSERT_TRUE(snapshot.count("MetricsTest.SnapshotMetric.count"));
  EXPECT_EQ(snapshot.at("MetricsTest.SnapshotMetric.count"), 2);
  EXPECT_EQ(snapshot.at("MetricsTest.SnapshotMetric.sum"), 42);
}

TEST(MetricsTest, reset_zeroes_everything_but_keeps_the_pointers) {
  Counter* counter = GetCounter("MetricsTest.ResetCounter");
  Metric* metric = GetMetric("MetricsTest.ResetMetric", MetricUnit::kSeconds);
  counter->Add(5);
  metric->AddSample(2);
  ResetMetrics();
  EXPECT_EQ(counter->Value(), 0);
  EXPECT_EQ(metric->TotalSamples(), 0);
  EXPECT_EQ(metric->Accumulator(), 0);
  EXPECT_THAT(metric->Percentiles({50}), ElementsAre(DoubleEq(0)));
  EXPECT_EQ(GetCounter("MetricsTest.ResetCounter"), counter);
  const std::string report = MetricsReport();
  EXPECT_THAT(report, Not(HasSubstr("MetricsTest.ResetCounter")));
  EXPECT_THAT(report, Not(HasSubstr("MetricsTest.ResetMetric")));
  const std::map<std::string, double> snapshot = MetricsSnapshot();
  EXPECT_EQ(snapshot.at("MetricsTest.ResetMetric.count"), 0);
  // Still usable after the reset.
  counter->Add();
  EXPECT_EQ(counter->Value(), 1);
}

TEST(MetricsTest, concurrent_counter_adds_sum_correctly) {
  Counter* counter = GetCounter("MetricsTest.ConcurrentCounter");
  Metric* metric = GetMetric("MetricsTest.ConcurrentMetric", MetricUnit::kCount);
  constexpr int kThreads = 8;
  constexpr int kAddsPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAddsPerThread; ++i) {
        counter->Add(t + 1);
        // Looked up by name each time too: registry lookups race with each other.
        if (i % 100 == 0) GetCounter("MetricsTest.ConcurrentCounter")->Add(0);
        if (i % 10 == 0) metric->AddSample(1);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  // sum over t of (t + 1) * kAddsPerThread
  EXPECT_EQ(counter->Value(), int64_t{kAddsPerThread} * kThreads * (kThreads + 1) / 2);
  EXPECT_EQ(metric->TotalSamples(), kThreads * kAddsPerThread / 10);
  EXPECT_DOUBLE_EQ(metric->Accumulator(), kThreads * kAddsPerThread / 10);
}

TEST(MetricsTest, scoped_timer_adds_one_sample) {
  Metric* metric = GetMetric("MetricsTest.ScopedTimer", MetricUnit::kSeconds);
  { ScopedTimer timer(metric); }
  EXPECT_EQ(metric->TotalSamples(), 1);
  EXPECT_GE(metric->Accumulator(), 0);
}

// A gauge is a level: reported whatever its value (zero too), by name in the snapshot, and left
// alone by ResetMetrics.
TEST(MetricsTest, gauges_are_reported_as_levels_and_survive_a_reset) {
  Gauge* bytes = GetGauge("MetricsTest.GaugeBytes", MetricUnit::kBytes);
  Gauge* zero = GetGauge("MetricsTest.GaugeZero", MetricUnit::kCount);
  EXPECT_EQ(GetGauge("MetricsTest.GaugeBytes", MetricUnit::kCount), bytes);  // same one
  bytes->Set(3 << 20);
  bytes->Add(-(1 << 20));
  EXPECT_EQ(bytes->Value(), 2 << 20);
  std::string report = MetricsReport();
  EXPECT_THAT(report, HasSubstr("Gauge: MetricsTest.GaugeBytes\n  Value: 2.00MB\n"));
  EXPECT_THAT(report, HasSubstr("Gauge: MetricsTest.GaugeZero\n  Value: 0\n"));
  EXPECT_EQ(MetricsSnapshot().at("MetricsTest.GaugeBytes"), 2 << 20);
  zero->Set(7);
  ResetMetrics();
  EXPECT_EQ(bytes->Value(), 2 << 20);
  EXPECT_EQ(MetricsSnapshot().at("MetricsTest.GaugeZero"), 7);
}

}  // namespace
}  // namespace ferry
