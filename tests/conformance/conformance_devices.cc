// Devices: a client presents its devices with stable indices and names, and every buffer lands
// on (and is accounted to) the device it was put on.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "conformance_suite.h"

namespace ferry::conformance {
namespace {

class ConformanceDevices : public ConformanceTest {};

// The default client names its backend and its devices "<backend>:<index>".
TEST_P(ConformanceDevices, ClientReportsItsBackendAndDevices) {
  EXPECT_EQ(client().backend(), backend().name);
  for (size_t i = 0; i < client().devices().size(); ++i) {
    Device* each = client().devices()[i];
    ASSERT_NE(each, nullptr);
    EXPECT_EQ(each->index(), static_cast<int>(i));
    EXPECT_EQ(each->name(), absl::StrFormat("%s:%d", backend().name, i));
    EXPECT_EQ(each->client(), &client());
    EXPECT_EQ(each->bytes_in_use(), 0);
    EXPECT_FALSE(each->capabilities().HeldDTypes().empty());
  }
}

// num_devices = 4: four devices with indices 0..3, names "<backend>:i", each holding its own
// buffers.
TEST_P(ConformanceDevices, FourDevicesEachHoldTheirOwnBuffers) {
  FERRY_CONFORMANCE_REQUIRE(honours_num_devices_option);
  ClientOptions options;
  options.num_devices = 4;
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> four, MakeClient(options));
  ASSERT_EQ(four->devices().size(), 4u);
  for (int i = 0; i < 4; ++i) {
    Device* each = four->devices()[i];
    EXPECT_EQ(each->index(), i);
    EXPECT_EQ(each->name(), absl::StrFormat("%s:%d", backend().name, i));
    EXPECT_EQ(each->client(), four.get());
    for (int j = 0; j < i; ++j) EXPECT_NE(each, four->devices()[j]);
  }

  const std::vector<int64_t> dims = {33, 31};
  std::vector<HostBytes> sources;
  std::vector<std::unique_ptr<Buffer>> buffers;
  for (int i = 0; i < 4; ++i) {
    // Device i gets i + 1 buffers, so that per-device accounting is visible.
    for (int k = 0; k <= i; ++k) {
      sources.push_back(RandomDenseTensor(rng(), DType::kS32, dims));
      CT_ASSERT_OK_AND_ASSIGN(
          std::unique_ptr<Buffer> buffer,
          four->BufferFromHostBuffer(
              HostView::Dense(sources.back().data(), DType::kS32, dims), DType::kS16,
              four->devices()[i], HostBufferSemantics::kImmutableUntilTransferCompletes, nullptr));
      EXPECT_EQ(buffer->device(), four->devices()[i]);
      EXPECT_EQ(buffer->device()->index(), i);
      buffers.push_back(std::move(buffer));
    }
  }
  const int64_t buffer_bytes = 33 * 31 * 2;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(four->devices()[i]->bytes_in_use(), (i + 1) * buffer_bytes) << "device " << i;
  }
  for (size_t b = 0; b < buffers.size(); ++b) {
    SCOPED_TRACE(absl::StrFormat("buffer %d on %s", b, buffers[b]->device()->name()));
    CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> actual, ReadBack(*buffers[b]));
    EXPECT_TRUE(BytesEqual(
        ReferenceDeviceBytes(HostView::Dense(sources[b].data(), DType::kS32, dims), DType::kS16),
        actual));
  }
  // Freeing the buffers of device 2 changes only device 2's accounting.
  for (auto& buffer : buffers) {
    if (buffer->device()->index() == 2) buffer.reset();
  }
  EXPECT_EQ(four->devices()[2]->bytes_in_use(), 0);
  EXPECT_EQ(four->devices()[3]->bytes_in_use(), 4 * buffer_bytes);
}

// A capability profile passed in the options bounds what the devices report: they hold no dtype
// that was not requested (a backend may hold fewer: those its hardware lacks), and their memory
// limit is at most the requested one.
TEST_P(ConformanceDevices, DevicesReportTheRequestedCapabilities) {
  FERRY_CONFORMANCE_REQUIRE(honours_capabilities_option);
  ClientOptions options;
  options.capabilities = DeviceCapabilities::No64BitFloats();
  options.capabilities->memory_limit_bytes = 1 << 20;
  CT_ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> profiled, MakeClient(options));
  for (Device* each : profiled->devices()) {
    const std::bitset<kNumDTypes>& held = each->capabilities().dtypes;
    EXPECT_TRUE((held & ~options.capabilities->dtypes).none())
        << "holds dtypes that were not requested";
    EXPECT_FALSE(each->capabilities().Holds(DType::kF64));
    EXPECT_FALSE(each->capabilities().Holds(DType::kC128));
    EXPECT_TRUE(each->capabilities().Holds(DType::kF32));
    EXPECT_TRUE(each->capabilities().Holds(DType::kS32));
    if (backend().honours_memory_limit_option) {
      ASSERT_TRUE(each->capabilities().memory_limit_bytes.has_value());
      EXPECT_LE(*each->capabilities().memory_limit_bytes, 1 << 20);
    }
  }
}

FERRY_INSTANTIATE_CONFORMANCE_SUITE(ConformanceDevices);

// Native handles (native_handles.h): a backend hands out its runtime objects and its buffers'
// addresses, or says Unimplemented; an address in host memory holds exactly the buffer's bytes.
TEST_P(ConformanceDevices, NativeHandlesAndAddressesAreWhatTheySayOrUnimplemented) {
  StatusOr<NativeDeviceHandles> handles = device()->NativeHandles();
  if (handles.ok()) {
    EXPECT_EQ(handles->backend, backend().name);
    EXPECT_FALSE(handles->library.empty());
    EXPECT_NE(handles->client, nullptr);
    EXPECT_NE(handles->device, nullptr);
  } else {
    EXPECT_EQ(handles.status().code(), absl::StatusCode::kUnimplemented) << handles.status();
  }
  const Dims dims = {37, 5};
  HostBytes source = RandomDenseTensor(rng(), DType::kF32, dims);
  CT_ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<Buffer> buffer,
      client().BufferFromHostBuffer(HostView::Dense(source.data(), DType::kF32, dims), DType::kF32,
                                    device(), HostBufferSemantics::kImmutableOnlyDuringCall,
                                    nullptr, "native"));
  CT_ASSERT_OK_AND_ASSIGN(std::vector<std::byte> expected, ReadBack(*buffer));
  StatusOr<NativeBufferHandle> object = buffer->NativeHandle();
  if (object.ok()) {
    EXPECT_NE(object->object, nullptr);
  } else {
    EXPECT_EQ(object.status().code(), absl::StatusCode::kUnimplemented) << object.status();
  }
  StatusOr<BufferAddress> address = buffer->DataAddress();
  if (address.ok()) {
    ASSERT_NE(address->data, nullptr);
    if (address->space == AddressSpace::kHost) {
      EXPECT_EQ(address->device_ordinal, 0);
      EXPECT_TRUE(BytesEqual(
          expected,
          absl::MakeConstSpan(static_cast<const std::byte*>(address->data), expected.size())));
    }
  } else {
    EXPECT_EQ(address.status().code(), absl::StatusCode::kUnimplemented) << address.status();
  }
  // Where the host reads the buffer's memory, DataAddress says where it is.
  if (StatusOr<HostView> view = buffer->HostAccessibleView(); view.ok()) {
    ASSERT_TRUE(address.ok()) << address.status();
    EXPECT_EQ(address->space, AddressSpace::kHost);
    EXPECT_EQ(address->data, view->data);
  }
  // Once the client is gone, nothing reaches its runtime through the buffer.
  DestroyClient();
  if (object.ok()) {
    EXPECT_EQ(buffer->NativeHandle().status().code(), absl::StatusCode::kFailedPrecondition);
  }
  if (address.ok()) {
    EXPECT_EQ(buffer->DataAddress().status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

}  // namespace
}  // namespace ferry::conformance
