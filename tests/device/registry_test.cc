#include "ferry/device/registry.h"

#include <cstdlib>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(RegistryTest, HostBackendIsRegistered) {
  EXPECT_THAT(RegisteredBackends(), ::testing::Contains("host"));
  auto client = CreateClient("host");
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->backend(), "host");
  ASSERT_EQ((*client)->devices().size(), 1u);
  EXPECT_EQ((*client)->devices()[0]->name(), "host:0");
}

TEST(RegistryTest, UnknownBackendIsNotFoundAndListsRegisteredOnes) {
  auto client = CreateClient("tpu");
  EXPECT_EQ(client.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(client.status().message()), ::testing::HasSubstr("host"));
}

TEST(RegistryTest, HostDeviceCountComesFromOptionOrEnvironment) {
  auto four = CreateClient("host", ClientOptions{.num_devices = 4});
  ASSERT_TRUE(four.ok());
  EXPECT_EQ((*four)->devices().size(), 4u);
  EXPECT_EQ((*four)->devices()[3]->name(), "host:3");
  EXPECT_EQ((*four)->devices()[3]->index(), 3);

  setenv("FERRY_HOST_DEVICES", "3", 1);
  auto three = CreateClient("host");
  setenv("FERRY_HOST_DEVICES", "lots", 1);
  auto bad = CreateClient("host");
  unsetenv("FERRY_HOST_DEVICES");
  ASSERT_TRUE(three.ok());
  EXPECT_EQ((*three)->devices().size(), 3u);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(RegistryTest, NegativeLimitsAreInvalidArgumentUpFront) {
  // Before: accepted, and every later put failed ("0 of -1 bytes in use").
  for (const char* backend : {"host", "opencl", "pjrt"}) {
    DeviceCapabilities memory = DeviceCapabilities::All();
    memory.memory_limit_bytes = -1;
    StatusOr<std::unique_ptr<Client>> client =
        CreateClient(backend, ClientOptions{.capabilities = memory});
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << backend;
    EXPECT_THAT(std::string(client.status().message()),
                testing::HasSubstr("memory_limit_bytes is -1"));
    DeviceCapabilities largest = DeviceCapabilities::All();
    largest.max_buffer_bytes = -5;
    client = CreateClient(backend, ClientOptions{.capabilities = largest});
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << backend;
  }
}

TEST(RegistryTest, ZeroDevicesIsInvalidArgument) {
  EXPECT_EQ(CreateClient("host", ClientOptions{.num_devices = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ferry
