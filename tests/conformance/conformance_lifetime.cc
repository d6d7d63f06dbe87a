// Lifetimes across the device API and the runtime on top of it: no memory is freed, and no
// `on_done` runs, while a transfer still uses it; a buffer (or a runtime `Data` handle) that
// outlives its client fails every call cleanly instead of reaching into the dead client. Each
// case was a use-after-free once (issue 14); under AddressSanitizer a regression is a report,
// and in every build the test also checks what it can see without one.
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "conformance_suite.h"
#include "ferry/runtime/transfer.h"

namespace ferry::conformance {
namespace {

class ConformanceLifetime : public ConformanceTest {};

// Forwards to a backend's buffer, but starts each ToHost only `delay` later, on a thread of its
// own: a read that is certainly still running when the caller moves on.
class SlowToHostBuffer final : public Buffer {
 public:
  SlowToHostBuffer(std::unique_ptr<Buffer> inner, std::chrono::milliseconds delay)
      : inner_(std::move(inner)), delay_(delay) {}
  ~SlowToHostBuffer() override {
    for (std::thread& read : reads_) read.join();
  }

  Device* device() const override { return inner_->device(); }
  DType device_dtype() const override { return inner_->device_dtype(); }
  const Dims& dims() const override { return inner_->dims(); }
  int64_t size_bytes() const override { return inner_->size_bytes(); }
  Future<> Ready() const override { return inner_->Ready(); }
  Future<> ToHost(const MutableHostView& dst) override {
    Promise<> done;
    reads_.emplace_back([this, dst, done]() mutable {
      std::this_thread::sleep_for(delay_);
      done.Set(inner_->ToHost(dst).Await());
    });
    return done.future();
  }

 private:
  std::unique_ptr<Buffer> inner_;
  const std::chrono::milliseconds delay_;
  std::vector<std::thread> reads_;  // ToHost is called from one thread in these tests
};

// TransferFromDevice returns an error found after it has started reads (a null handle later in
// the batch) only once those reads are over: they write into the host tensors it frees on return.
TEST_P(ConformanceLifetime, TransferFromDeviceReturnsAnErrorOnlyAfterTheReadsItStarted) {
  const Dims dims = {256, 1024};  // 1 MiB of f32
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, dims);
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      client().BufferFromHostBuffer(HostView::Dense(source.data(), DType::kF32, dims), DType::kF32,
                                    device(), HostBufferSemantics::kImmutableOnlyDuringCall,
                                    nullptr, "slow_read"));
  CT_ASSERT_READY_OK(buffer->Ready());
  auto slow = std::make_unique<SlowToHostBuffer>(std::move(buffer), std::chrono::milliseconds(200));
  std::vector<DataPtr> batch = {std::make_shared<Data>(std::move(slow), DType::kF32, "slow_read"),
                                nullptr};

  const auto start = std::chrono::steady_clock::now();
  StatusOr<std::vector<HostTensor>> read = TransferFromDevice(batch);
  const auto waited = std::chrono::steady_clock::now() - start;
  ASSERT_FALSE(read.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(read.status())) << read.status();
  EXPECT_NE(read.status().message().find("handle 1 is null"), std::string::npos) << read.status();
  // The started read could only have finished after its 200 ms delay: returning sooner means it
  // went on writing into a freed tensor.
  EXPECT_GE(waited, std::chrono::milliseconds(200))
      << "TransferFromDevice returned while a read it started was still running";
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceLifetime);

}  // namespace
}  // namespace ferry::conformance
