// Registers the opencl backend as "opencl". Registration never fails: on a machine without
// OpenCL the factory returns Unavailable with the reason.
#include "ferry/device/registry.h"
#include "src/device/opencl/opencl_client.h"

namespace ferry {

void RegisterOpenClBackend() { RegisterBackend("opencl", &opencl::OpenClClient::Create); }

}  // namespace ferry
