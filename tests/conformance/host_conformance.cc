// Runs the device-API conformance suite on the host backend, which has every optional behaviour.
#include "conformance_suite.h"

namespace {

[[maybe_unused]] const bool kHostRegistered = ferry::conformance::RegisterConformanceBackend({
    .name = "host",
    .make_client =
        [](const ferry::ClientOptions& options) { return ferry::CreateClient("host", options); },
    .can_alias_host_memory = true,
    .honours_num_devices_option = true,
    .honours_memory_limit_option = true,
    .honours_capabilities_option = true,
    .skipped_tests = {},
});

}  // namespace
