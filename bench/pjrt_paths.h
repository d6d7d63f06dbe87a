// The PJRT plugin's own transfers, written with its C API alone: the yardsticks of
// `ferry-bench --device pjrt:N` (the raw_pjrt_put case, and every case's vs_raw_pjrt). Nothing of
// ferry runs in them but, for a conversion, the old copy-convert into a fresh temporary
// (old_copy.h), which stands for numpy's `astype`: what a JAX user's `device_put(x.astype(t))`
// does before the plugin sees the bytes.
//
// In a build without the pjrt backend (no pjrt_c_api.h) IsPjrtDevice is false and the Make
// functions return FailedPrecondition.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ferry/core/dtype.h"
#include "ferry/core/status.h"
#include "ferry/device/device.h"
#include "ferry/runtime/tensor_source.h"
#include "ferry/runtime/transfer.h"
#include "transfer_paths.h"

namespace ferry::bench {

// True when `device` is a device of ferry's pjrt backend.
bool IsPjrtDevice(const Device* device);
// The plugin library of a pjrt device's client (for the jax peer, which loads the same plugin);
// empty for any other device.
std::string PjrtPluginPathOf(const Device* device);

// The plugin's put. Run(): per source i, in order, when `device_dtypes[i]` differs from the
// source's dtype a fresh temporary of that dtype filled by the old copy-convert (numpy's astype),
// then PJRT_Client_BufferFromHostBuffer of the source, or of the temporary, onto `devices[i]`'s
// default memory: with the source's byte strides unless it is row-major dense (then none, as for
// a dense numpy array), kImmutableOnlyDuringCall, then waiting for its done_with_host_buffer
// event and the buffer's ReadyEvent; each temporary is freed once its put returns. Release()
// destroys the plugin buffers. Results on the host: every buffer read back with ToHostBuffer.
// `sources`, `devices` and `device_dtypes` have one entry each per tensor; the sources must stay
// unchanged while the path lives (it shares them). FailedPrecondition unless every device is a
// pjrt device.
StatusOr<std::unique_ptr<Path>> MakePjrtPutPath(
    std::vector<std::shared_ptr<const TensorSource>> sources, std::vector<Device*> devices,
    std::vector<DType> device_dtypes);

// The plugin's read. At creation (untimed): each tensor of `data` read back in its device dtype
// by ferry, put as a plugin buffer of its own on the same device (so the plugin reads bytes it
// made itself), and a dense destination of the device dtype allocated and written once. Run():
// per tensor PJRT_Buffer_ToHostBuffer into that reused destination, waited on; then, when the
// tensor's logical dtype differs from its device dtype, a fresh temporary of the logical dtype
// filled from the destination by the old copy-convert (numpy's astype), kept as the run's result
// until Release(). Results on the host: those temporaries, or copies of the destinations.
// FailedPrecondition unless every tensor is on a pjrt device.
StatusOr<std::unique_ptr<Path>> MakePjrtReadPath(const std::vector<DataPtr>& data);

}  // namespace ferry::bench
