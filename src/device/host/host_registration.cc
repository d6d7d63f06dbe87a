// Registers the host backend as "host".
#include "ferry/device/registry.h"
#include "src/device/host/host_client.h"

namespace ferry {

void RegisterHostBackend() { RegisterBackend("host", &host::HostClient::Create); }

}  // namespace ferry
