// `ferry-bench --device-queues`: staged puts and staged reads on one device alone against the
// same transfer on every device at once, one per device (issue 27: each pjrt device and direction
// has its own staging ring and worker, so that devices do not queue behind one another).
//
// The pjrt client is made with direct host access off, so that the CPU plugin's devices take the
// paths a GPU's take: a put converting float32 to bfloat16 streams through the device's
// host-to-device staging ring (CreateBuffersForAsyncHostToDevice + TransferData per chunk), and a
// read converting back to float32 through its device-to-host ring (CopyRawToHost per chunk). The
// puts are asynchronous (kImmutableUntilTransferCompletes), all started from one thread, as a
// sharded put starts them; the reads are one TransferFromDeviceInto over every handle. Then reads
// queued on one device: eight dense float32 reads (the plugin's ToHostBuffer, which the staging
// worker starts and the plugin's event finishes) started at once, against one after the other.
#pragma once

#include <string>

namespace ferry::bench {

struct DeviceQueuesOptions {
  std::string backend = "pjrt";
  int devices = 4;
  int64_t bytes_per_device = int64_t{64} << 20;  // of the float32 source
  int repeats = 7;
  std::string json_path;  // also write the JSON there when not empty
};

// Prints a table (medians of `repeats` runs, one device and all devices interleaved) and one JSON
// line; returns the process exit code (1 when the backend or its devices are missing, or a
// transfer fails).
int RunDeviceQueues(const DeviceQueuesOptions& options);

}  // namespace ferry::bench
