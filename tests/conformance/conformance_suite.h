// The device-API conformance suite: tests written once against `Client`, `Device` and `Buffer`,
// run for every backend that registers itself (in the manner of IREE's HAL CTS).
//
// Registering a backend is one small file (see host_conformance.cc):
//
//   [[maybe_unused]] const bool kRegistered = ferry::conformance::RegisterConformanceBackend({
//       .name = "opencl",
//       .make_client = [](const ferry::ClientOptions& options) {
//         return ferry::CreateClient("opencl", options);
//       },
//       .honours_memory_limit_option = true,
//       .skipped_tests = {{"<Suite>.<Test>", "why this backend cannot pass it, in words"}},
//   });
//
// Every test suite is instantiated over `RegisteredConformanceBackends()`, which gtest evaluates
// lazily (when the tests are registered, after every static initialiser has run), so the
// registration files may be linked in any order. Each test is named `<Suite>.<Test>/<backend>`.
//
// A backend whose factory returns Unavailable (no library, no device) skips every test with that
// reason; a backend that lacks an optional behaviour (a capability tag below is false) skips the
// tests that need it, saying which tag; `skipped_tests` skips single tests with a stated reason.
// A device that does not hold a dtype (DeviceCapabilities) skips the cases that need it and
// prints an INFO line saying so. Nothing passes by doing nothing.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/types/span.h"
#include "ferry/core/convert.h"
#include "ferry/core/dtype.h"
#include "ferry/core/future.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"
#include "ferry/device/buffer.h"
#include "ferry/device/client.h"
#include "ferry/device/device.h"
#include "ferry/device/registry.h"
#include "gtest/gtest.h"

namespace ferry::conformance {

// One backend under test: a factory, capability tags and per-test skips.
struct ConformanceBackend {
  // The backend's name ([A-Za-z0-9_]+); the suffix of every test name. `Client::backend()` and
  // the device names ("<name>:<index>") must use it.
  std::string name;
  // A second registration of the same backend under other options ("plugin_paths"): the test
  // names end in "<name>_<variant>"; empty for the backend's own registration.
  std::string variant = {};
  // Creates a client. Unavailable means "cannot run on this machine": every test skips, or fails
  // in CI, where every backend is required (tests/required_backends.h).
  std::function<StatusOr<std::unique_ptr<Client>>(const ClientOptions&)> make_client;

  // Capability tags: a test that needs a behaviour the backend does not have skips.
  // kImmutableZeroCopy aliases a dense, same-dtype, 64-byte-aligned source.
  bool can_alias_host_memory = false;
  // ClientOptions::num_devices is honoured (several devices on request).
  bool honours_num_devices_option = false;
  // ClientOptions::capabilities->memory_limit_bytes is enforced.
  bool honours_memory_limit_option = false;
  // ClientOptions::capabilities->dtypes is honoured.
  bool honours_capabilities_option = false;

  // "<Suite>.<Test>" (without the backend suffix) -> why the backend skips it.
  std::map<std::string, std::string> skipped_tests;
  // Non-empty: why every test of this registration skips in this build (a choice, such as a path
  // too slow under a sanitizer), as opposed to a backend that is unavailable on this machine,
  // which fails in CI (tests/required_backends.h).
  std::string skip_all = {};
};

// Adds `backend` to the suite. Call it from a static initialiser; returns true so that it can
// initialise a namespace-scope constant. Thread-safe.
bool RegisterConformanceBackend(ConformanceBackend backend);

// The registered backends, in registration order (a copy: gtest keeps its own).
std::vector<ConformanceBackend> RegisteredConformanceBackends();

// Printed by gtest for the parameter: the backend's name.
void PrintTo(const ConformanceBackend& backend, std::ostream* os);

// The test-name suffix for a backend.
std::string ConformanceBackendTestName(const testing::TestParamInfo<ConformanceBackend>& info);

// Instantiates one conformance test suite over every registered backend.
#define FERRY_INSTANTIATE_CONFORMANCE_SUITE(suite)                                \
  INSTANTIATE_TEST_SUITE_P(                                                       \
      Conformance, suite,                                                         \
      ::testing::ValuesIn(::ferry::conformance::RegisteredConformanceBackends()), \
      ::ferry::conformance::ConformanceBackendTestName)

// Skips the current test unless the backend has capability tag `tag` (a bool member).
#define FERRY_CONFORMANCE_REQUIRE(tag)                                                     \
  if (!backend().tag)                                                                      \
  GTEST_SKIP() << "backend '" << backend().name << "' does not declare `" #tag "` in its " \
               << "conformance registration"

// The base of every conformance fixture: creates the backend's default client in SetUp (or
// skips), and owns the run's random seed.
class ConformanceTest : public testing::TestWithParam<ConformanceBackend> {
 protected:
  void SetUp() override;
  void TearDown() override;

  const ConformanceBackend& backend() const { return GetParam(); }
  // The default client: one device, every option left to the backend except the worker count.
  Client& client() { return *client_; }
  Device* device(int index = 0) { return client_->devices()[index]; }

  // Another client of this backend. `num_worker_threads` defaults to the suite's (2).
  StatusOr<std::unique_ptr<Client>> MakeClient(ClientOptions options) const;
  // True when `target` (default: device 0 of the default client) holds every dtype in `dtypes`;
  // otherwise prints which case is skipped and why, and returns false.
  bool Holds(std::initializer_list<DType> dtypes, const Device* target = nullptr);
  // Destroys the default client (for tests of what happens afterwards).
  void DestroyClient() { client_.reset(); }

  // Random numbers from the printed seed (FERRY_CONFORMANCE_SEED reproduces a run).
  std::mt19937_64& rng() { return rng_; }
  uint64_t seed() const { return seed_; }

 private:
  std::unique_ptr<Client> client_;
  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  std::optional<testing::ScopedTrace> seed_trace_;
};

// ---------------------------------------------------------------------------------------------
// Helpers shared by the conformance tests.

// How long a test waits for any single future before it fails instead of hanging.
inline constexpr std::chrono::seconds kFutureTimeout{120};

// Waits up to `timeout` for `future`; nullopt when it is still not ready.
std::optional<Status> AwaitFor(const Future<>& future,
                               std::chrono::milliseconds timeout = kFutureTimeout);

// Host memory for sources and destinations: `size` bytes starting `misalignment` bytes past a
// 64-byte boundary. Movable; the pointer stays valid across moves.
class HostBytes {
 public:
  HostBytes() = default;
  explicit HostBytes(int64_t size, int64_t misalignment = 0);

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  int64_t size() const { return size_; }
  absl::Span<std::byte> span() { return absl::MakeSpan(data_, static_cast<size_t>(size_)); }
  absl::Span<const std::byte> span() const {
    return absl::MakeConstSpan(data_, static_cast<size_t>(size_));
  }
  std::vector<std::byte> ToVector() const { return {data_, data_ + size_}; }

 private:
  std::vector<std::byte> storage_;
  std::byte* data_ = nullptr;
  int64_t size_ = 0;
};

// Fills `bytes` with random values valid for `dtype`: any bit pattern (NaN payloads, signalling
// NaNs, subnormals, infinities included), except bool, which is 0 or 1 per byte.
void FillRandom(std::mt19937_64& rng, DType dtype, absl::Span<std::byte> bytes);

// A dense random tensor of `dtype` and `dims` in fresh memory (64-byte aligned plus
// `misalignment`). For the float dtypes the first elements are special patterns: signalling and
// quiet NaNs with payloads and both signs, infinities, -0, the smallest subnormal.
HostBytes RandomDenseTensor(std::mt19937_64& rng, DType dtype, absl::Span<const int64_t> dims,
                            int64_t misalignment = 0);

// Reads `buffer` back densely in its device dtype (Await with a timeout). Errors are returned.
StatusOr<std::vector<std::byte>> ReadBack(Buffer& buffer);

// Bytes compared as hex, with the first differing offset, for readable failures.
testing::AssertionResult BytesEqual(absl::Span<const std::byte> expected,
                                    absl::Span<const std::byte> actual);

// What one `on_done` callback observed; shared between the callback and the test.
struct OnDoneRecord {
  std::mutex mutex;
  std::condition_variable changed;
  int calls = 0;
  std::thread::id thread;
  // Set by the test right after BufferFromHostBuffer returned (see CallReturned).
  bool call_returned = false;
  bool ran_before_call_returned = false;
  // The buffer's Ready() future, installed by the test (see CallReturned) when it wants the
  // callback to check that Ready() was not yet complete while it ran.
  std::optional<Future<>> ready;
  bool ready_was_complete_during_on_done = false;
  bool waited_for_ready_in_vain = false;
  // Set after the callback has finished everything else, just before it returns.
  std::atomic<bool> returned{false};

  // Records that the call returned and, optionally, hands the callback the Ready() future.
  void CallReturned(std::optional<Future<>> ready_future = std::nullopt);
  int Calls();
  // Waits until the callback has been called `count` times (bounded); returns the count.
  int WaitForCalls(int count, std::chrono::milliseconds timeout = kFutureTimeout);
};

struct OnDoneOptions {
  // Bytes the callback overwrites (poisons) with a pattern: any read of the source after
  // `on_done` shows up in the device data.
  absl::Span<std::byte> poison = {};
  // Wait (bounded) for the test to install the Ready() future, then check it is not complete.
  bool wait_for_ready = false;
  // Keeps something alive exactly as long as the callback object (checks its destruction).
  std::shared_ptr<void> keep_alive = nullptr;
};

// An instrumented `on_done` that fills `record`.
OnDoneWithHostBuffer MakeRecordingOnDone(std::shared_ptr<OnDoneRecord> record,
                                         OnDoneOptions options = {});

// Calls `fn(index)` for every row-major multi-index of `dims` (once for rank 0, never when a dim
// is 0).
void ForEachIndex(absl::Span<const int64_t> dims,
                  const std::function<void(absl::Span<const int64_t>)>& fn);

// Byte offset of `index` under `byte_strides`.
int64_t ByteOffset(absl::Span<const int64_t> index, absl::Span<const int64_t> byte_strides);

// Product of `dims` (small test shapes only).
int64_t NumElements(absl::Span<const int64_t> dims);

// Converts one element with the library's kernel (GetConvertKernel, count 1). Slow: for loops over
// many elements, call ReferenceKernel once.
void ConvertOneElement(DType from, const std::byte* src, DType to, std::byte* dst);
// GetConvertKernel(from, to), or a kernel that does nothing after failing the test.
ConvertKernel ReferenceKernel(DType from, DType to);

// The naive reference: the device bytes a correct transfer of `src` as `device_dtype` produces
// (dense, row-major), computed one element at a time.
std::vector<std::byte> ReferenceDeviceBytes(const HostView& src, DType device_dtype);

}  // namespace ferry::conformance

// Test-only status assertions.
#define FERRY_CT_CONCAT_INNER_(a, b) a##b
#define FERRY_CT_CONCAT_(a, b) FERRY_CT_CONCAT_INNER_(a, b)

#define CT_ASSERT_OK(expr)                      \
  do {                                          \
    const ::absl::Status ct_status_ = (expr);   \
    ASSERT_TRUE(ct_status_.ok()) << ct_status_; \
  } while (false)

#define CT_EXPECT_OK(expr)                      \
  do {                                          \
    const ::absl::Status ct_status_ = (expr);   \
    EXPECT_TRUE(ct_status_.ok()) << ct_status_; \
  } while (false)

#define CT_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  CT_ASSERT_OK_AND_ASSIGN_IMPL_(FERRY_CT_CONCAT_(ct_statusor_, __LINE__), lhs, expr)
#define CT_ASSERT_OK_AND_ASSIGN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                                  \
  ASSERT_TRUE(statusor.ok()) << statusor.status();         \
  lhs = std::move(statusor).value()

// Awaits a Future<> (bounded) and asserts it completed OK.
#define CT_ASSERT_READY_OK(future)                                                           \
  do {                                                                                       \
    const std::optional<::absl::Status> ct_result_ = ::ferry::conformance::AwaitFor(future); \
    ASSERT_TRUE(ct_result_.has_value()) << "future did not complete in time";                \
    ASSERT_TRUE(ct_result_->ok()) << *ct_result_;                                            \
  } while (false)
