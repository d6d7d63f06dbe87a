// The conformance registry, the base fixture and the helpers every conformance test shares.
#include "conformance_suite.h"

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "ferry/core/convert.h"
#include "tests/required_backends.h"

namespace ferry::conformance {
namespace {

// Function-local statics: the registration files' static initialisers may run before this
// file's, so the registry is built on first use.
std::mutex& RegistryMutex() {
  static std::mutex mutex;
  return mutex;
}

std::vector<ConformanceBackend>& Registry() {
  static auto* registry = new std::vector<ConformanceBackend>();
  return *registry;
}

// One seed per process run, printed by every test: FERRY_CONFORMANCE_SEED=<n> replays it.
uint64_t RunSeed() {
  static const uint64_t seed = [] {
    if (const char* text = std::getenv("FERRY_CONFORMANCE_SEED"); text != nullptr && *text) {
      return static_cast<uint64_t>(std::strtoull(text, nullptr, 10));
    }
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) ^ device();
  }();
  return seed;
}

// The worker count every conformance client uses unless a test asks otherwise: more than one,
// so that completion order is not trivially sequential, and few, for the shared 2-core machines.
constexpr int kWorkerThreads = 2;

}  // namespace

bool RegisterConformanceBackend(ConformanceBackend backend) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  Registry().push_back(std::move(backend));
  return true;
}

std::vector<ConformanceBackend> RegisteredConformanceBackends() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  return Registry();
}

void PrintTo(const ConformanceBackend& backend, std::ostream* os) { *os << backend.name; }

std::string ConformanceBackendTestName(const testing::TestParamInfo<ConformanceBackend>& info) {
  return info.param.variant.empty() ? info.param.name : info.param.name + "_" + info.param.variant;
}

void ConformanceTest::SetUp() {
  seed_ = RunSeed();
  rng_.seed(seed_);
  const std::string seed_text = absl::StrFormat("FERRY_CONFORMANCE_SEED=%d", seed_);
  std::cout << "[     SEED ] " << seed_text << "\n";
  RecordProperty("seed", std::to_string(seed_));
  seed_trace_.emplace(__FILE__, __LINE__, seed_text);

  const testing::TestInfo* info = testing::UnitTest::GetInstance()->current_test_info();
  // "Conformance/Suite" + "Test/backend" -> "Suite.Test".
  std::string suite = info->test_suite_name();
  suite = suite.substr(suite.find('/') + 1);
  std::string test = info->name();
  test = test.substr(0, test.rfind('/'));
  if (auto skip = backend().skipped_tests.find(suite + "." + test);
      skip != backend().skipped_tests.end()) {
    GTEST_SKIP() << "backend '" << backend().name << "' skips this test: " << skip->second;
  }

  if (!backend().skip_all.empty()) {
    GTEST_SKIP() << "backend '" << backend().name
                 << "' skips the suite here: " << backend().skip_all;
  }
  StatusOr<std::unique_ptr<Client>> client = MakeClient(ClientOptions{});
  if (absl::IsUnavailable(client.status())) {
    FERRY_SKIP_OR_FAIL_UNAVAILABLE(
        "backend '" + backend().name +
        "' is unavailable on this machine: " + std::string(client.status().message()));
  }
  ASSERT_TRUE(client.ok()) << client.status();
  ASSERT_NE(*client, nullptr);
  ASSERT_FALSE((*client)->devices().empty()) << "a client must own at least one device";
  client_ = std::move(client).value();
}

void ConformanceTest::TearDown() {
  client_.reset();
  seed_trace_.reset();
}

StatusOr<std::unique_ptr<Client>> ConformanceTest::MakeClient(ClientOptions options) const {
  if (!options.num_worker_threads.has_value()) options.num_worker_threads = kWorkerThreads;
  return backend().make_client(options);
}

bool ConformanceTest::Holds(std::initializer_list<DType> dtypes, const Device* target) {
  if (target == nullptr) target = device();
  for (DType dtype : dtypes) {
    if (target->capabilities().Holds(dtype)) continue;
    std::cout << "[     INFO ] " << target->name() << " does not hold " << DTypeName(dtype)
              << ": that case is skipped\n";
    return false;
  }
  return true;
}

std::optional<Status> AwaitFor(const Future<>& future, std::chrono::milliseconds timeout) {
  struct Waiter {
    std::mutex mutex;
    std::condition_variable ready;
    bool done = false;
  };
  auto waiter = std::make_shared<Waiter>();
  future.OnReady([waiter](const Status&) {
    std::lock_guard<std::mutex> lock(waiter->mutex);
    waiter->done = true;
    waiter->ready.notify_all();
  });
  std::unique_lock<std::mutex> lock(waiter->mutex);
  if (!waiter->ready.wait_for(lock, timeout, [&] { return waiter->done; })) return std::nullopt;
  return future.Await();
}

HostBytes::HostBytes(int64_t size, int64_t misalignment) : size_(size) {
  storage_.resize(static_cast<size_t>(size + misalignment + 64));
  auto address = reinterpret_cast<uintptr_t>(storage_.data());
  uintptr_t aligned = (address + 63) & ~uintptr_t{63};
  data_ = storage_.data() + (aligned - address) + misalignment;
}

void FillRandom(std::mt19937_64& rng, DType dtype, absl::Span<std::byte> bytes) {
  if (dtype == DType::kBool) {
    for (std::byte& byte : bytes) byte = static_cast<std::byte>(rng() & 1);
    return;
  }
  size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(bytes.data() + i, &word, 8);
  }
  const uint64_t word = rng();
  std::memcpy(bytes.data() + i, &word, bytes.size() - i);
}

namespace {

// Bit patterns worth a bit-exact check, per float dtype (little-endian element bytes).
std::vector<uint64_t> SpecialPatterns(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return {0x7d01, 0xfd55, 0x7e01, 0xfe00, 0x7c00, 0xfc00, 0x8000, 0x0001};
    case DType::kBF16:
      return {0x7f81, 0xff81, 0x7fc1, 0xffc0, 0x7f80, 0xff80, 0x8000, 0x0001};
    case DType::kF32:
    case DType::kC64:
      return {0x7f800001, 0xff812345, 0x7fc00001, 0xffc00000,
              0x7f800000, 0xff800000, 0x80000000, 0x00000001};
    case DType::kF64:
    case DType::kC128:
      return {0x7ff0000000000001, 0xfff0123456789abc, 0x7ff8000000000001, 0xfff8000000000000,
              0x7ff0000000000000, 0xfff0000000000000, 0x8000000000000000, 0x0000000000000001};
    case DType::kF8E4M3FN:
      return {0x7f, 0xff, 0x80, 0x01};
    case DType::kF8E5M2:
      return {0x7d, 0xfe, 0x7c, 0xfc, 0x80, 0x01};
    default:
      return {};
  }
}

}  // namespace

HostBytes RandomDenseTensor(std::mt19937_64& rng, DType dtype, absl::Span<const int64_t> dims,
                            int64_t misalignment) {
  const int64_t element_size = DTypeSize(dtype);
  HostBytes bytes(NumElements(dims) * element_size, misalignment);
  FillRandom(rng, dtype, bytes.span());
  // Complex dtypes get the patterns in their real and imaginary parts alike.
  const bool is_complex = GetDTypeInfo(dtype).kind == DTypeKind::kComplex;
  const int64_t part_size = is_complex ? element_size / 2 : element_size;
  int64_t offset = 0;
  for (uint64_t pattern : SpecialPatterns(dtype)) {
    if (offset + part_size > bytes.size()) break;
    std::memcpy(bytes.data() + offset, &pattern, static_cast<size_t>(part_size));
    offset += part_size;
  }
  return bytes;
}

StatusOr<std::vector<std::byte>> ReadBack(Buffer& buffer) {
  std::vector<std::byte> bytes(
      static_cast<size_t>(NumElements(buffer.dims()) * DTypeSize(buffer.device_dtype())));
  const MutableHostView dst =
      MutableHostView::Dense(bytes.data(), buffer.device_dtype(), buffer.dims());
  const std::optional<Status> status = AwaitFor(buffer.ToHost(dst));
  if (!status.has_value()) return InternalError("ToHost did not complete in time");
  FERRY_RETURN_IF_ERROR(*status);
  return bytes;
}

testing::AssertionResult BytesEqual(absl::Span<const std::byte> expected,
                                    absl::Span<const std::byte> actual) {
  if (expected.size() != actual.size()) {
    return testing::AssertionFailure()
           << "sizes differ: expected " << expected.size() << " bytes, got " << actual.size();
  }
  for (size_t i = 0; i < expected.size(); ++i) {
    if (expected[i] == actual[i]) continue;
    size_t mismatches = 0;
    for (size_t j = i; j < expected.size(); ++j) mismatches += expected[j] != actual[j];
    std::ostringstream detail;
    const size_t end = std::min(expected.size(), i + 16);
    detail << "first difference at byte " << i << " of " << expected.size() << " (" << mismatches
           << " bytes differ)\n  expected:";
    for (size_t j = i; j < end; ++j) detail << absl::StrFormat(" %02x", int(expected[j]));
    detail << "\n  actual:  ";
    for (size_t j = i; j < end; ++j) detail << absl::StrFormat(" %02x", int(actual[j]));
    return testing::AssertionFailure() << detail.str();
  }
  return testing::AssertionSuccess();
}

void OnDoneRecord::CallReturned(std::optional<Future<>> ready_future) {
  std::lock_guard<std::mutex> lock(mutex);
  call_returned = true;
  if (ready_future.has_value()) ready = std::move(ready_future);
  changed.notify_all();
}

int OnDoneRecord::Calls() {
  std::lock_guard<std::mutex> lock(mutex);
  return calls;
}

int OnDoneRecord::WaitForCalls(int count, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex);
  changed.wait_for(lock, timeout, [&] { return calls >= count && returned.load(); });
  return calls;
}

OnDoneWithHostBuffer MakeRecordingOnDone(std::shared_ptr<OnDoneRecord> record,
                                         OnDoneOptions options) {
  return [record = std::move(record), options = std::move(options)]() mutable {
    {
      std::unique_lock<std::mutex> lock(record->mutex);
      ++record->calls;
      record->thread = std::this_thread::get_id();
      record->ran_before_call_returned = !record->call_returned;
      if (options.wait_for_ready) {
        // Bounded: a backend that wrongly runs on_done inside the call would otherwise hang.
        record->waited_for_ready_in_vain = !record->changed.wait_for(
            lock, std::chrono::seconds(10), [&] { return record->ready.has_value(); });
      }
      if (record->ready.has_value()) {
        record->ready_was_complete_during_on_done = record->ready->IsReady();
      }
      if (!options.poison.empty()) {
        std::memset(options.poison.data(), 0xa5, options.poison.size());
      }
    }
    // A Ready() that completes before on_done returns shows up in this window.
    if (options.wait_for_ready) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(record->mutex);
    record->returned = true;
    record->changed.notify_all();
  };
}

void ForEachIndex(absl::Span<const int64_t> dims,
                  const std::function<void(absl::Span<const int64_t>)>& fn) {
  for (int64_t dim : dims) {
    if (dim == 0) return;
  }
  std::vector<int64_t> index(dims.size(), 0);
  while (true) {
    fn(index);
    int64_t axis = static_cast<int64_t>(dims.size()) - 1;
    for (; axis >= 0; --axis) {
      if (++index[axis] < dims[axis]) break;
      index[axis] = 0;
    }
    if (axis < 0) return;
  }
}

int64_t ByteOffset(absl::Span<const int64_t> index, absl::Span<const int64_t> byte_strides) {
  int64_t offset = 0;
  for (size_t i = 0; i < index.size(); ++i) offset += index[i] * byte_strides[i];
  return offset;
}

int64_t NumElements(absl::Span<const int64_t> dims) {
  int64_t count = 1;
  for (int64_t dim : dims) count *= dim;
  return count;
}

ConvertKernel ReferenceKernel(DType from, DType to) {
  StatusOr<ConvertKernel> kernel = GetConvertKernel(from, to);
  if (kernel.ok()) return *kernel;
  ADD_FAILURE() << "no reference kernel " << DTypeName(from) << " -> " << DTypeName(to) << ": "
                << kernel.status();
  return [](const std::byte*, int64_t, std::byte*, int64_t, int64_t) {};
}

void ConvertOneElement(DType from, const std::byte* src, DType to, std::byte* dst) {
  ReferenceKernel(from, to)(src, 0, dst, 0, 1);
}

std::vector<std::byte> ReferenceDeviceBytes(const HostView& src, DType device_dtype) {
  const int64_t device_size = DTypeSize(device_dtype);
  std::vector<std::byte> bytes(static_cast<size_t>(NumElements(src.dims) * device_size));
  const ConvertKernel kernel = ReferenceKernel(src.dtype, device_dtype);
  int64_t i = 0;
  ForEachIndex(src.dims, [&](absl::Span<const int64_t> index) {
    kernel(static_cast<const std::byte*>(src.data) + ByteOffset(index, src.byte_strides), 0,
           bytes.data() + device_size * i++, 0, 1);
  });
  return bytes;
}

}  // namespace ferry::conformance
