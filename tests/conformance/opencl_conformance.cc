// Runs the device-API conformance suite on the opencl backend (PoCL's CPU device in CI). Where
// OpenCL is missing (no library, no platform, no device) the factory returns Unavailable and
// every test skips with that reason.
#include "conformance_suite.h"

namespace {

[[maybe_unused]] const bool kOpenClRegistered = ferry::conformance::RegisterConformanceBackend({
    .name = "opencl",
    .make_client =
        [](const ferry::ClientOptions& options) { return ferry::CreateClient("opencl", options); },
    // Device memory is never the caller's memory: kImmutableZeroCopy always copies.
    .can_alias_host_memory = false,
    // One device per OpenCL device of the machine, whatever was asked for.
    .honours_num_devices_option = false,
    // A requested profile narrows the device's own: limits are lowered, dtypes intersected (so
    // a device without cl_khr_fp16, like PoCL's, never holds f16 even when asked to).
    .honours_memory_limit_option = true,
    .honours_capabilities_option = true,
    .skipped_tests = {},
});

}  // namespace
