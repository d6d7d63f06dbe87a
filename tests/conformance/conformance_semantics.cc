// HostBufferSemantics: when, where and how often `on_done` runs, and that the source is never
// read after it.
//
// Every source here is instrumented: its `on_done` overwrites (poisons) the source bytes, so a
// byte read after `on_done` shows up as a wrong byte on the device; it records its thread and
// call count; and it holds a keep-alive whose expiry shows the callback object itself was
// released.
#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "conformance_suite.h"
#include "ferry/core/metrics.h"

namespace ferry::conformance {
namespace {

class ConformanceSemantics : public ConformanceTest {};

// How a test source is laid out.
struct SourceCase {
  std::string name;
  DType source_dtype;
  DType device_dtype;
  std::vector<int64_t> dims;  // logical dims of the view
  bool transposed = false;    // the view reverses the dims of dense memory
  int64_t misalignment = 0;   // bytes past a 64-byte boundary
};

// A source in memory, its view and the device bytes a correct transfer produces.
struct Source {
  HostBytes memory;
  HostView view;
  std::vector<std::byte> expected_device_bytes;
};

Source MakeSource(std::mt19937_64& rng, const SourceCase& source_case) {
  std::vector<int64_t> physical_dims = source_case.dims;
  if (source_case.transposed) std::reverse(physical_dims.begin(), physical_dims.end());
  Source source;
  source.memory =
      RandomDenseTensor(rng, source_case.source_dtype, physical_dims, source_case.misalignment);
  source.view = HostView::Dense(source.memory.data(), source_case.source_dtype, physical_dims);
  if (source_case.transposed) {
    std::reverse(source.view.dims.begin(), source.view.dims.end());
    std::reverse(source.view.byte_strides.begin(), source.view.byte_strides.end());
  }
  source.expected_device_bytes = ReferenceDeviceBytes(source.view, source_case.device_dtype);
  return source;
}

// What held at the moment Ready() completed. Registered while the instrumented on_done still
// waits for CallReturned (so Ready() cannot be complete yet), the observer runs inside the
// completion itself, on the completing thread: no race with what happens right after it.
struct AtReady {
  std::atomic<int> on_done_returned{-1};
  std::atomic<int> on_done_released{-1};
};

std::shared_ptr<AtReady> ObserveReady(Buffer& buffer, std::shared_ptr<OnDoneRecord> record,
                                      std::weak_ptr<int> keep_alive_watch) {
  auto at_ready = std::make_shared<AtReady>();
  buffer.Ready().OnReady([at_ready, record, keep_alive_watch](const Status&) {
    at_ready->on_done_returned = record->returned.load() ? 1 : 0;
    at_ready->on_done_released = keep_alive_watch.expired() ? 1 : 0;
  });
  return at_ready;
}

// Dense, transposed, converted and large sources: every path a backend may take.
std::vector<SourceCase> CopyingCases() {
  return {
      {"dense f32", DType::kF32, DType::kF32, {37, 29}},
      {"transposed u16", DType::kU16, DType::kU16, {31, 45}, /*transposed=*/true},
      {"converted f64->f32", DType::kF64, DType::kF32, {40, 33}},
      {"large dense s8", DType::kS8, DType::kS8, {3 << 20}},
      {"large converted f32->bf16", DType::kF32, DType::kBF16, {512, 1024}},
      // Nothing to copy: on_done still runs as the semantics say (on a runtime thread for the
      // asynchronous ones), never inside the call.
      {"empty f32", DType::kF32, DType::kF32, {0, 7}},
  };
}

// kImmutableOnlyDuringCall: on_done ran exactly once, on the calling thread, before the call
// returned; nothing is read afterwards; the callback object is released by the time Ready().
TEST_P(ConformanceSemantics, OnlyDuringCallRunsOnDoneOnceOnTheCallerBeforeReturning) {
  for (const SourceCase& source_case : CopyingCases()) {
    SCOPED_TRACE(source_case.name);
    if (!Holds({source_case.device_dtype})) continue;
    Source source = MakeSource(rng(), source_case);
    auto record = std::make_shared<OnDoneRecord>();
    auto keep_alive = std::make_shared<int>(0);
    std::weak_ptr<int> keep_alive_watch = keep_alive;
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> buffer,
        client().BufferFromHostBuffer(
            source.view, source_case.device_dtype, device(),
            HostBufferSemantics::kImmutableOnlyDuringCall,
            MakeRecordingOnDone(
                record, {.poison = source.memory.span(), .keep_alive = std::move(keep_alive)})));
    {
      std::lock_guard<std::mutex> lock(record->mutex);
      EXPECT_EQ(record->calls, 1) << "on_done must have run before the call returned";
      EXPECT_EQ(record->thread, std::this_thread::get_id()) << "on_done ran on another thread";
      EXPECT_TRUE(record->returned);
    }
    EXPECT_TRUE(keep_alive_watch.expired())
        << "the on_done callback object outlived the call that ran it";
    record->CallReturned();
    CT_ASSERT_READY_OK(buffer->Ready());
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
    EXPECT_TRUE(BytesEqual(source.expected_device_bytes, actual))
        << "the device data differs from the source (read after on_done?)";
    buffer.reset();
    EXPECT_EQ(record->Calls(), 1);
  }
}

// kImmutableUntilTransferCompletes: on_done runs exactly once on a runtime thread, after the
// last byte was read and before Ready() completes (Ready completes after on_done returned).
TEST_P(ConformanceSemantics, UntilTransferCompletesRunsOnDoneOnceOnARuntimeThreadBeforeReady) {
  for (const SourceCase& source_case : CopyingCases()) {
    SCOPED_TRACE(source_case.name);
    if (!Holds({source_case.device_dtype})) continue;
    Source source = MakeSource(rng(), source_case);
    auto record = std::make_shared<OnDoneRecord>();
    auto keep_alive = std::make_shared<int>(0);
    std::weak_ptr<int> keep_alive_watch = keep_alive;
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> buffer,
        client().BufferFromHostBuffer(
            source.view, source_case.device_dtype, device(),
            HostBufferSemantics::kImmutableUntilTransferCompletes,
            MakeRecordingOnDone(record, {.poison = source.memory.span(),
                                         .wait_for_ready = true,
                                         .keep_alive = std::move(keep_alive)})));
    std::shared_ptr<AtReady> at_ready = ObserveReady(*buffer, record, keep_alive_watch);
    // The callback waits for the Ready() future, then checks it is not complete yet.
    record->CallReturned(buffer->Ready());
    CT_ASSERT_READY_OK(buffer->Ready());
    EXPECT_EQ(at_ready->on_done_returned, 1) << "Ready() completed before on_done returned";
    EXPECT_EQ(at_ready->on_done_released, 1)
        << "Ready() completed while the on_done callback object (and the source it keeps alive) "
           "was still held";
    {
      std::lock_guard<std::mutex> lock(record->mutex);
      EXPECT_EQ(record->calls, 1);
      EXPECT_TRUE(record->returned) << "Ready() completed before on_done returned";
      EXPECT_NE(record->thread, std::this_thread::get_id())
          << "on_done must run on a runtime thread";
      EXPECT_FALSE(record->waited_for_ready_in_vain)
          << "on_done ran inside BufferFromHostBuffer (it never saw the call return)";
      EXPECT_FALSE(record->ready_was_complete_during_on_done)
          << "Ready() was already complete while on_done ran";
    }
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
    EXPECT_TRUE(BytesEqual(source.expected_device_bytes, actual))
        << "the device data differs from the source (read after on_done?)";
    buffer.reset();
    EXPECT_EQ(record->Calls(), 1);
  }
}

// kImmutableUntilTransferCompletes: once on_done has run, the backend holds the device memory
// only through the buffer: a caller woken by on_done that drops the buffer has given every byte
// back (the runtime relies on it: a failed batch releases what it started before returning).
TEST_P(ConformanceSemantics, UntilTransferCompletesHoldsNoMemoryBesideTheBufferAfterOnDone) {
  for (const SourceCase& source_case : CopyingCases()) {
    SCOPED_TRACE(source_case.name);
    if (!Holds({source_case.device_dtype})) continue;
    Source source = MakeSource(rng(), source_case);
    const int64_t bytes_before = device()->bytes_in_use();
    std::promise<void> read;
    std::future<void> source_read = read.get_future();
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> buffer,
        client().BufferFromHostBuffer(source.view, source_case.device_dtype, device(),
                                      HostBufferSemantics::kImmutableUntilTransferCompletes,
                                      [&read] { read.set_value(); }));
    ASSERT_EQ(source_read.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    buffer.reset();
    EXPECT_EQ(device()->bytes_in_use(), bytes_before)
        << "device memory still held by the finished transfer after its buffer was dropped";
  }
}

// kImmutableZeroCopy on a dense, same-dtype, 64-byte-aligned source: the buffer aliases the
// source, and on_done runs only when the buffer is destroyed.
TEST_P(ConformanceSemantics, ZeroCopyAliasKeepsOnDoneUntilTheBufferIsDestroyed) {
  FERRY_CONFORMANCE_REQUIRE(can_alias_host_memory);
  for (DType dtype : {DType::kF32, DType::kU8, DType::kC128}) {
    SCOPED_TRACE(DTypeName(dtype));
    if (!Holds({dtype})) continue;
    const std::vector<int64_t> dims = {64, 48};
    HostBytes source = RandomDenseTensor(rng(), dtype, dims);
    const std::vector<std::byte> expected = source.ToVector();
    auto record = std::make_shared<OnDoneRecord>();
    auto keep_alive = std::make_shared<int>(0);
    std::weak_ptr<int> keep_alive_watch = keep_alive;
    const int64_t aliases_before = metrics::ZeroCopyAliases()->Value();
    const int64_t fallbacks_before = metrics::ZeroCopyFallbacks()->Value();
    const int64_t bytes_before = device()->bytes_in_use();
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> buffer,
        client().BufferFromHostBuffer(
            HostView::Dense(source.data(), dtype, dims), dtype, device(),
            HostBufferSemantics::kImmutableZeroCopy,
            MakeRecordingOnDone(record, {.keep_alive = std::move(keep_alive)})));
    record->CallReturned();
    EXPECT_TRUE(buffer->is_alias());
    EXPECT_EQ(metrics::ZeroCopyAliases()->Value(), aliases_before + 1);
    EXPECT_EQ(metrics::ZeroCopyFallbacks()->Value(), fallbacks_before);
    EXPECT_EQ(device()->bytes_in_use(), bytes_before) << "aliases hold no device memory";
    CT_ASSERT_READY_OK(buffer->Ready());
    if (StatusOr<HostView> view = buffer->HostAccessibleView(); view.ok()) {
      EXPECT_EQ(view->data, source.data()) << "an alias must present the source memory";
    }
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
    EXPECT_TRUE(BytesEqual(expected, actual));
    EXPECT_EQ(record->Calls(), 0) << "on_done ran while the alias is alive";
    EXPECT_FALSE(keep_alive_watch.expired()) << "the alias released its source early";
    buffer.reset();
    EXPECT_EQ(record->Calls(), 1) << "on_done must run when the alias is destroyed";
    EXPECT_TRUE(keep_alive_watch.expired());
  }
}

// kImmutableZeroCopy where aliasing is impossible (misaligned, strided, converted; and every
// source on a backend that cannot alias) copies like kImmutableUntilTransferCompletes and counts
// a fallback.
TEST_P(ConformanceSemantics, ZeroCopyFallsBackAndCountsWhenItCannotAlias) {
  std::vector<SourceCase> cases = {
      {"misaligned by 4 bytes", DType::kF32, DType::kF32, {33, 65}, false, 4},
      {"transposed", DType::kS32, DType::kS32, {20, 70}, /*transposed=*/true},
      {"converted f32->f16", DType::kF32, DType::kF16, {128, 96}},
      {"converted f32->s32", DType::kF32, DType::kS32, {128, 96}},
  };
  if (!backend().can_alias_host_memory) {
    cases.push_back({"aligned dense (backend cannot alias)", DType::kF32, DType::kF32, {64, 64}});
  }
  for (const SourceCase& source_case : cases) {
    SCOPED_TRACE(source_case.name);
    if (!Holds({source_case.device_dtype})) continue;
    Source source = MakeSource(rng(), source_case);
    auto record = std::make_shared<OnDoneRecord>();
    auto keep_alive = std::make_shared<int>(0);
    std::weak_ptr<int> keep_alive_watch = keep_alive;
    const int64_t aliases_before = metrics::ZeroCopyAliases()->Value();
    const int64_t fallbacks_before = metrics::ZeroCopyFallbacks()->Value();
    const int64_t bytes_before = device()->bytes_in_use();
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> buffer,
        client().BufferFromHostBuffer(
            source.view, source_case.device_dtype, device(),
            HostBufferSemantics::kImmutableZeroCopy,
            MakeRecordingOnDone(record, {.poison = source.memory.span(),
                                         .wait_for_ready = true,
                                         .keep_alive = std::move(keep_alive)})));
    std::shared_ptr<AtReady> at_ready = ObserveReady(*buffer, record, keep_alive_watch);
    record->CallReturned(buffer->Ready());
    EXPECT_FALSE(buffer->is_alias());
    EXPECT_EQ(metrics::ZeroCopyFallbacks()->Value(), fallbacks_before + 1);
    EXPECT_EQ(metrics::ZeroCopyAliases()->Value(), aliases_before);
    EXPECT_EQ(device()->bytes_in_use(), bytes_before + buffer->size_bytes());
    CT_ASSERT_READY_OK(buffer->Ready());
    EXPECT_EQ(at_ready->on_done_returned, 1) << "Ready() completed before on_done returned";
    EXPECT_EQ(at_ready->on_done_released, 1)
        << "Ready() completed while the on_done callback object was still held";
    {
      std::lock_guard<std::mutex> lock(record->mutex);
      EXPECT_EQ(record->calls, 1);
      EXPECT_TRUE(record->returned) << "Ready() completed before on_done returned";
      EXPECT_NE(record->thread, std::this_thread::get_id());
      EXPECT_FALSE(record->waited_for_ready_in_vain);
      EXPECT_FALSE(record->ready_was_complete_during_on_done);
    }
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
    EXPECT_TRUE(BytesEqual(source.expected_device_bytes, actual));
    buffer.reset();
    EXPECT_EQ(record->Calls(), 1) << "a copying zero-copy buffer ran on_done again";
  }
}

// An empty on_done is allowed under every semantics.
TEST_P(ConformanceSemantics, EmptyOnDoneIsAllowedUnderEverySemantics) {
  for (HostBufferSemantics semantics : {HostBufferSemantics::kImmutableOnlyDuringCall,
                                        HostBufferSemantics::kImmutableUntilTransferCompletes,
                                        HostBufferSemantics::kImmutableZeroCopy}) {
    SCOPED_TRACE(HostBufferSemanticsName(semantics));
    const std::vector<int64_t> dims = {100, 3};
    HostBytes source = RandomDenseTensor(rng(), DType::kS64, dims);
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> buffer,
        client().BufferFromHostBuffer(HostView::Dense(source.data(), DType::kS64, dims),
                                      DType::kS64, device(), semantics, OnDoneWithHostBuffer()));
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
    EXPECT_TRUE(BytesEqual(source.ToVector(), actual));
  }
}

// A buffer destroyed right after an asynchronous put (before Ready) still runs on_done exactly
// once and releases the callback; nothing crashes when the client goes afterwards.
TEST_P(ConformanceSemantics, BufferDestroyedBeforeReadyStillRunsOnDoneOnce) {
  struct Case {
    std::string name;
    HostBufferSemantics semantics;
    SourceCase source;
  };
  const std::vector<Case> cases = {
      {"async dense",
       HostBufferSemantics::kImmutableUntilTransferCompletes,
       {"", DType::kF32, DType::kF32, {1024, 512}}},
      {"async converted",
       HostBufferSemantics::kImmutableUntilTransferCompletes,
       {"", DType::kF32, DType::kBF16, {1024, 512}}},
      {"zero-copy fallback",
       HostBufferSemantics::kImmutableZeroCopy,
       {"", DType::kF32, DType::kF32, {512, 1024}, /*transposed=*/true}},
      {"zero-copy",
       HostBufferSemantics::kImmutableZeroCopy,
       {"", DType::kF32, DType::kF32, {1024, 512}}},
  };
  std::vector<Source> sources;  // kept until the client is gone
  std::vector<std::shared_ptr<OnDoneRecord>> records;
  std::vector<std::weak_ptr<int>> keep_alive_watches;
  std::vector<std::string> names;
  for (const Case& test_case : cases) {
    SCOPED_TRACE(test_case.name);
    if (!Holds({test_case.source.device_dtype})) continue;
    names.push_back(test_case.name);
    sources.push_back(MakeSource(rng(), test_case.source));
    records.push_back(std::make_shared<OnDoneRecord>());
    auto keep_alive = std::make_shared<int>(0);
    keep_alive_watches.push_back(keep_alive);
    CT_ASSERT_OK_AND_ASSIGN(
        std::unique_ptr<Buffer> buffer,
        client().BufferFromHostBuffer(
            sources.back().view, test_case.source.device_dtype, device(), test_case.semantics,
            MakeRecordingOnDone(records.back(), {.keep_alive = std::move(keep_alive)})));
    records.back()->CallReturned();
    buffer.reset();
    EXPECT_EQ(records.back()->WaitForCalls(1), 1) << "on_done did not run after destruction";
  }
  DestroyClient();
  for (size_t i = 0; i < records.size(); ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_EQ(records[i]->Calls(), 1);
    EXPECT_TRUE(keep_alive_watches[i].expired()) << "the on_done callback was never released";
  }
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceSemantics);

}  // namespace
}  // namespace ferry::conformance
