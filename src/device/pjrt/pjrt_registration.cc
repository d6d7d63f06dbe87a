// Registers the pjrt backend as "pjrt". Registration never fails: without a plugin (or, in a
// build without the PJRT C API header, always) the factory returns Unavailable with the reason.
#include "ferry/device/registry.h"
#if FERRY_HAVE_PJRT
#include "src/device/pjrt/pjrt_client.h"
#endif

namespace ferry {

void RegisterPjrtBackend() {
#if FERRY_HAVE_PJRT
  RegisterBackend("pjrt", &pjrt::PjrtClient::Create);
#else
  RegisterBackend("pjrt", [](const ClientOptions&) -> StatusOr<std::unique_ptr<Client> > {
    return UnavailableError(
        "this ferry was built without the PJRT C API header (pjrt_c_api.h, from the xla-cpu-pjrt "
        "wheel): rebuild after scripts/python_env.sh, or set FERRY_PJRT_C_API_INCLUDE_DIR");
  });
#endif
}

}  // namespace ferry
