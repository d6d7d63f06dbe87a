// Bad input at the device API: each is a Status of the documented code whose message names the
// tensor; a failed call never runs on_done, releases the callback, takes no device memory and
// leaves earlier buffers intact.
//
// (Strides that address bytes outside the caller's memory are the runtime's check:
// ValidateWithin needs the memory region, which the device API does not receive.)
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "conformance_suite.h"

namespace ferry::conformance {
namespace {

constexpr char kTensorName[] = "conformance.bad_tensor";
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

class ConformanceErrors : public ConformanceTest {
 protected:
  // Expects BufferFromHostBuffer(src -> device_dtype on `target`) to fail with `code` under every
  // semantics, naming the tensor, without calling on_done or keeping the callback, and without
  // taking device memory.
  void ExpectPutFails(Client& target_client, const HostView& src, DType device_dtype,
                      Device* target, absl::StatusCode code) {
    for (HostBufferSemantics semantics : {HostBufferSemantics::kImmutableOnlyDuringCall,
                                          HostBufferSemantics::kImmutableUntilTransferCompletes,
                                          HostBufferSemantics::kImmutableZeroCopy}) {
      SCOPED_TRACE(absl::StrFormat("%s -> %s, %s", src.DebugString(), DTypeName(device_dtype),
                                   HostBufferSemanticsName(semantics)));
      auto record = std::make_shared<OnDoneRecord>();
      auto keep_alive = std::make_shared<int>(0);
      std::weak_ptr<int> keep_alive_watch = keep_alive;
      const int64_t bytes_before = target->bytes_in_use();
      StatusOr<std::unique_ptr<Buffer>> buffer = target_client.BufferFromHostBuffer(
          src, device_dtype, target, semantics,
          MakeRecordingOnDone(record, {.keep_alive = std::move(keep_alive)}), kTensorName);
      ASSERT_FALSE(buffer.ok()) << "the call succeeded";
      EXPECT_EQ(buffer.status().code(), code) << buffer.status();
      EXPECT_NE(buffer.status().message().find(kTensorName), std::string_view::npos)
          << "the message does not name the tensor: " << buffer.status();
      EXPECT_EQ(record->Calls(), 0) << "on_done ran for a failed call";
      EXPECT_TRUE(keep_alive_watch.expired()) << "a failed call kept its on_done callback";
      EXPECT_EQ(target->bytes_in_use(), bytes_before);
    }
  }

  void ExpectPutFails(const HostView& src, DType device_dtype, absl::StatusCode code) {
    ExpectPutFails(client(), src, device_dtype, device(), code);
  }

  // Expects ToHost(dst) to complete with `code` and leave the destination memory untouched.
  void ExpectToHostFails(Buffer& buffer, const MutableHostView& dst, HostBytes& dst_memory,
                         absl::StatusCode code) {
    SCOPED_TRACE("ToHost into " + HostView(dst).DebugString());
    const std::vector<std::byte> before = dst_memory.ToVector();
    const std::optional<Status> status = AwaitFor(buffer.ToHost(dst));
    ASSERT_TRUE(status.has_value()) << "ToHost did not complete";
    EXPECT_EQ(status->code(), code) << *status;
    EXPECT_TRUE(BytesEqual(before, dst_memory.span())) << "a failed ToHost wrote its destination";
  }
};

// A source with a few elements of `dtype`, for the views below to point into.
HostBytes SmallSource(std::mt19937_64& rng, DType dtype) {
  return RandomDenseTensor(rng, dtype, {64});
}

TEST_P(ConformanceErrors, StridesCountDifferentFromDimsIsInvalidArgument) {
  HostBytes memory = SmallSource(rng(), DType::kF32);
  ExpectPutFails(HostView(memory.data(), DType::kF32, {4, 4}, {16}), DType::kF32,
                 absl::StatusCode::kInvalidArgument);
  ExpectPutFails(HostView(memory.data(), DType::kF32, {4}, {4, 16}), DType::kF32,
                 absl::StatusCode::kInvalidArgument);
  HostView scalar_with_a_stride = HostView::Dense(memory.data(), DType::kF32, {});
  scalar_with_a_stride.byte_strides.push_back(4);
  ExpectPutFails(scalar_with_a_stride, DType::kF32, absl::StatusCode::kInvalidArgument);
}

TEST_P(ConformanceErrors, NegativeDimIsInvalidArgument) {
  HostBytes memory = SmallSource(rng(), DType::kF32);
  ExpectPutFails(HostView(memory.data(), DType::kF32, {2, -3}, {12, 4}), DType::kF32,
                 absl::StatusCode::kInvalidArgument);
  ExpectPutFails(HostView(memory.data(), DType::kF32, {-1}, {4}), DType::kF64,
                 absl::StatusCode::kInvalidArgument);
  // A negative dim next to a zero dim is still an error, not an empty tensor.
  ExpectPutFails(HostView(memory.data(), DType::kF32, {0, -2}, {8, 4}), DType::kF32,
                 absl::StatusCode::kInvalidArgument);
}

// Element counts, device sizes and addressed extents that overflow int64 are refused before
// any byte is read (these views are broadcast or huge; none may be dereferenced).
TEST_P(ConformanceErrors, SizeOrExtentOverflowIsInvalidArgument) {
  HostBytes memory = SmallSource(rng(), DType::kU8);
  const auto invalid = absl::StatusCode::kInvalidArgument;
  // Element count overflow (broadcast: the view itself addresses one byte).
  ExpectPutFails(HostView(memory.data(), DType::kU8, {int64_t{1} << 40, int64_t{1} << 40}, {0, 0}),
                 DType::kU8, invalid);
  ExpectPutFails(
      HostView(memory.data(), DType::kU8, {3, int64_t{1} << 62, int64_t{1} << 62}, {0, 0, 0}),
      DType::kU8, invalid);
  // Device size overflow: 2^61 elements fit, 2^61 * 8 bytes of s64 do not.
  ExpectPutFails(HostView(memory.data(), DType::kU8, {int64_t{1} << 61}, {0}), DType::kS64,
                 invalid);
  ExpectPutFails(HostView(memory.data(), DType::kS64, {int64_t{1} << 61}, {0}), DType::kS64,
                 invalid);
  // Extent overflow, upwards and downwards.
  ExpectPutFails(HostView(memory.data(), DType::kU8, {3}, {kInt64Max / 2 + 1}), DType::kU8,
                 invalid);
  ExpectPutFails(HostView(memory.data(), DType::kU8, {2, 2}, {kInt64Max / 2, kInt64Max / 2 + 8}),
                 DType::kU8, invalid);
  ExpectPutFails(HostView(memory.data() + 32, DType::kU8, {2, 2},
                          {-(int64_t{1} << 62) - 8, -(int64_t{1} << 62)}),
                 DType::kU8, invalid);
}

// A device dtype the device does not hold is InvalidArgument; the source may still be of that
// dtype when the device stores another.
TEST_P(ConformanceErrors, DeviceDTypeTheDeviceCannotHoldIsInvalidArgument) {
  FERRY_CONFORMANCE_REQUIRE(honours_capabilities_option);
  ClientOptions options;
  options.capabilities = DeviceCapabilities::No64BitFloats();
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> no_f64, MakeClient(options));
  Device* target = no_f64->devices()[0];
  EXPECT_FALSE(target->capabilities().Holds(DType::kF64));
  EXPECT_FALSE(target->capabilities().Holds(DType::kC128));
  EXPECT_TRUE(target->capabilities().Holds(DType::kF32));
  HostBytes f32 = SmallSource(rng(), DType::kF32);
  HostBytes f64 = SmallSource(rng(), DType::kF64);
  HostBytes c64 = SmallSource(rng(), DType::kC64);
  const auto invalid = absl::StatusCode::kInvalidArgument;
  ExpectPutFails(*no_f64, HostView::Dense(f32.data(), DType::kF32, {64}), DType::kF64, target,
                 invalid);
  ExpectPutFails(*no_f64, HostView::Dense(f64.data(), DType::kF64, {64}), DType::kF64, target,
                 invalid);
  ExpectPutFails(*no_f64, HostView::Dense(c64.data(), DType::kC64, {64}), DType::kC128, target,
                 invalid);
  // f64 stored as f32 is what such a device is for.
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      no_f64->BufferFromHostBuffer(HostView::Dense(f64.data(), DType::kF64, {64}), DType::kF32,
                                   target, HostBufferSemantics::kImmutableOnlyDuringCall, nullptr));
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
  std::vector<std::byte> expected(64 * 4);
  for (int i = 0; i < 64; ++i) {
    ConvertOneElement(DType::kF64, f64.data() + 8 * i, DType::kF32, expected.data() + 4 * i);
  }
  EXPECT_TRUE(BytesEqual(expected, actual));
}

// The 8-bit float types are storage only: converting to or from them is Unimplemented.
TEST_P(ConformanceErrors, F8ConversionsAreUnimplemented) {
  HostBytes f8 = SmallSource(rng(), DType::kF8E4M3FN);
  HostBytes f32 = SmallSource(rng(), DType::kF32);
  const std::pair<DType, DType> kRefused[] = {
      {DType::kF8E4M3FN, DType::kF32}, {DType::kF32, DType::kF8E4M3FN},
      {DType::kF8E5M2, DType::kF16},   {DType::kF8E4M3FN, DType::kF8E5M2},
      {DType::kBF16, DType::kF8E5M2},  {DType::kF8E5M2, DType::kS8}};
  for (auto [from, to] : kRefused) {
    // A device dtype the device does not hold is refused first, for that reason.
    if (!Holds({to})) continue;
    ExpectPutFails(HostView::Dense((DTypeSize(from) == 1 ? f8 : f32).data(), from, {64}), to,
                   absl::StatusCode::kUnimplemented);
  }
}

TEST_P(ConformanceErrors, ComplexToRealIsInvalidArgument) {
  HostBytes c128 = SmallSource(rng(), DType::kC128);
  const std::pair<DType, DType> kRefused[] = {{DType::kC64, DType::kF32},
                                              {DType::kC128, DType::kF64},
                                              {DType::kC64, DType::kS32},
                                              {DType::kC128, DType::kU8},
                                              {DType::kC64, DType::kF16}};
  for (auto [from, to] : kRefused) {
    if (!Holds({to})) continue;
    ExpectPutFails(HostView::Dense(c128.data(), from, {64}), to,
                   absl::StatusCode::kInvalidArgument);
  }
}

TEST_P(ConformanceErrors, DeviceOfAnotherClientIsInvalidArgument) {
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> other, MakeClient({}));
  HostBytes memory = SmallSource(rng(), DType::kF32);
  ExpectPutFails(client(), HostView::Dense(memory.data(), DType::kF32, {64}), DType::kF32,
                 other->devices()[0], absl::StatusCode::kInvalidArgument);
}

// ToHost into a destination whose dims differ from the buffer's, whose view is malformed, or whose
// elements overlap.
TEST_P(ConformanceErrors, ToHostWithWrongDimsIsInvalidArgument) {
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, {4, 5});
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> buffer,
                          client().BufferFromHostBuffer(
                              HostView::Dense(source.data(), DType::kF32, {4, 5}), DType::kF32,
                              device(), HostBufferSemantics::kImmutableOnlyDuringCall, nullptr));
  HostBytes dst(256);
  FillRandom(rng(), DType::kU8, dst.span());
  const auto invalid = absl::StatusCode::kInvalidArgument;
  for (const std::vector<int64_t>& dims :
       std::vector<std::vector<int64_t>>{{5, 4}, {4, 5, 1}, {20}, {}, {4, 6}, {0, 5}}) {
    ExpectToHostFails(*buffer, MutableHostView::Dense(dst.data(), DType::kF32, dims), dst, invalid);
  }
  ExpectToHostFails(*buffer, MutableHostView(dst.data(), DType::kF32, {4, 5}, {20}), dst, invalid);
  ExpectToHostFails(*buffer, MutableHostView(dst.data(), DType::kF32, {4, -5}, {20, 4}), dst,
                    invalid);
  // A destination whose elements share bytes (a broadcast dim, rows overlapping) is refused too:
  // the read writes elements in parallel, so which value would land there is a race.
  for (const Dims& strides : std::vector<Dims>{{0, 4}, {20, 0}, {8, 4}, {-8, 4}, {4, 4}}) {
    ExpectToHostFails(*buffer, MutableHostView(dst.data() + 128, DType::kF32, {4, 5}, strides), dst,
                      invalid);
  }
  // Rows apart by exactly one row, in either order, are distinct: the read goes through.
  HostBytes reversed_rows(4 * 5 * 4);
  ASSERT_TRUE(
      buffer->ToHost(MutableHostView(reversed_rows.data() + 3 * 20, DType::kF32, {4, 5}, {-20, 4}))
          .Await()
          .ok());
  for (int64_t row = 0; row < 4; ++row) {
    EXPECT_EQ(std::memcmp(reversed_rows.data() + (3 - row) * 20, source.data() + row * 20, 20), 0)
        << "row " << row;
  }
  // The buffer is still whole.
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
  EXPECT_TRUE(BytesEqual(source.ToVector(), actual));
}

// ToHost into a dtype the device dtype does not convert to follows CheckConvertible's codes.
TEST_P(ConformanceErrors, ToHostIntoAnInconvertibleDTypeFails) {
  if (!Holds({DType::kF8E5M2, DType::kC64})) GTEST_SKIP() << "the device holds no f8e5m2 or c64";
  HostBytes f8 = SmallSource(rng(), DType::kF8E5M2);
  HostBytes c64 = SmallSource(rng(), DType::kC64);
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> f8_buffer,
                          client().BufferFromHostBuffer(
                              HostView::Dense(f8.data(), DType::kF8E5M2, {64}), DType::kF8E5M2,
                              device(), HostBufferSemantics::kImmutableOnlyDuringCall, nullptr));
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Buffer> c64_buffer,
                          client().BufferFromHostBuffer(
                              HostView::Dense(c64.data(), DType::kC64, {64}), DType::kC64, device(),
                              HostBufferSemantics::kImmutableOnlyDuringCall, nullptr));
  HostBytes dst(64 * 16);
  FillRandom(rng(), DType::kU8, dst.span());
  ExpectToHostFails(*f8_buffer, MutableHostView::Dense(dst.data(), DType::kF32, {64}), dst,
                    absl::StatusCode::kUnimplemented);
  ExpectToHostFails(*c64_buffer, MutableHostView::Dense(dst.data(), DType::kF32, {64}), dst,
                    absl::StatusCode::kInvalidArgument);
}

// Failed calls in between leave an earlier buffer whole.
TEST_P(ConformanceErrors, FailedCallsLeaveEarlierBuffersIntact) {
  HostBytes source = RandomDenseTensor(rng(), DType::kS64, {300});
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      client().BufferFromHostBuffer(HostView::Dense(source.data(), DType::kS64, {300}), DType::kS64,
                                    device(), HostBufferSemantics::kImmutableUntilTransferCompletes,
                                    nullptr));
  HostBytes memory = SmallSource(rng(), DType::kC64);
  ExpectPutFails(HostView(memory.data(), DType::kC64, {4, 4}, {8}), DType::kC64,
                 absl::StatusCode::kInvalidArgument);
  ExpectPutFails(HostView::Dense(memory.data(), DType::kC64, {64}), DType::kF32,
                 absl::StatusCode::kInvalidArgument);
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffer));
  EXPECT_TRUE(BytesEqual(source.ToVector(), actual));
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceErrors);

}  // namespace
}  // namespace ferry::conformance
