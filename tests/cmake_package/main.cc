// A program outside ferry's tree: puts a tensor on the host device, reads it back converted, and
// prints the version it was built against. Exits 0 when every value came back.
#include <cstdio>
#include <cstring>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/tensor_source.h"
#include "ferry/runtime/transfer.h"
#include "ferry/version.h"

int main() {
  int unused_on_purpose;  // see CMakeLists.txt: ferry's warning flags must not apply here
  auto client = ferry::CreateClient("host");
  if (!client.ok()) {
    std::fprintf(stderr, "consumer: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const std::vector<float> values = {1.5f, -2.0f, 3.25f, 4.0f, 5.5f, -6.75f};
  auto tensor = ferry::HostTensor::Allocate(ferry::DType::kF32, {2, 3});
  if (!tensor.ok()) return 1;
  std::memcpy(tensor->data(), values.data(), values.size() * sizeof(float));
  auto source = ferry::TensorSource::FromHostTensor(*std::move(tensor), "values");
  ferry::TransferToDeviceOptions options;
  options.device_dtypes = {ferry::DType::kF64};  // converted on the way
  auto data = ferry::TransferToDevice({source}, (*client)->devices()[0], options);
  if (!data.ok()) {
    std::fprintf(stderr, "consumer: %s\n", data.status().ToString().c_str());
    return 1;
  }
  auto back = ferry::TransferFromDevice({(*data)[0]});
  if (!back.ok()) {
    std::fprintf(stderr, "consumer: %s\n", back.status().ToString().c_str());
    return 1;
  }
  const auto* read = reinterpret_cast<const float*>((*back)[0].data());
  for (size_t i = 0; i < values.size(); ++i) {
    if (read[i] != values[i]) {
      std::fprintf(stderr, "consumer: element %zu is %g, not %g\n", i, read[i], values[i]);
      return 1;
    }
  }
  std::printf("consumer: ferry %s: 6 values through float64 and back\n", ferry::kVersion);
  return 0;
}
