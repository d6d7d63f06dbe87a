// The README's C++ example: put a transposed float64 view on a device as bfloat16, read it back.
#include <cstdio>
#include <vector>

#include "ferry/core/host_tensor.h"
#include "ferry/device/registry.h"
#include "ferry/runtime/transfer.h"

int main() {
  // A host client with one device (the embedded default backend).
  auto client = ferry::CreateClient("host");
  if (!client.ok()) return std::fprintf(stderr, "%s\n", client.status().ToString().c_str()), 1;
  ferry::Device* device = (*client)->devices()[0];

  // The caller's own memory: a 3x4 float64 matrix, seen through a transpose (4x3, strides swapped).
  std::vector<double> matrix(12);
  for (int i = 0; i < 12; ++i) matrix[i] = 0.5 * i;
  auto keep_alive = std::make_shared<std::vector<double>>(std::move(matrix));
  ferry::HostView transposed(keep_alive->data(), ferry::DType::kF64, /*dims=*/{4, 3},
                             /*byte_strides=*/{8, 4 * 8});
  auto source =
      ferry::TensorSource::Borrow(transposed, keep_alive->data(), 12 * 8, keep_alive, "weights.T");
  if (!source.ok()) return std::fprintf(stderr, "%s\n", source.status().ToString().c_str()), 1;

  // Store it as bfloat16 on the device: converted once, fused with the strided read.
  ferry::TransferToDeviceOptions options;
  options.device_dtypes = {ferry::DType::kBF16};
  auto data = ferry::TransferToDevice({*source}, device, options);
  if (!data.ok()) return std::fprintf(stderr, "%s\n", data.status().ToString().c_str()), 1;

  // Read back in the source's own dtype (float64).
  auto tensors = ferry::TransferFromDevice(*data);
  if (!tensors.ok()) return std::fprintf(stderr, "%s\n", tensors.status().ToString().c_str()), 1;
  const auto* values = reinterpret_cast<const double*>((*tensors)[0].data());
  std::printf("%s on %s as %s: first row %g %g %g\n", (*data)[0]->name().c_str(),
              device->name().c_str(),
              std::string(ferry::DTypeName((*data)[0]->device_dtype())).c_str(), values[0],
              values[1], values[2]);
  // matrix^T row 0 is matrix column 0: 0, 2, 4 (exact in bfloat16).
  return values[0] == 0.0 && values[1] == 2.0 && values[2] == 4.0 ? 0 : 1;
}
