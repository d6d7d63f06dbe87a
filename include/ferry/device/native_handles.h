// The device API, part 4: what a backend hands out of its own runtime, for code that talks to
// that runtime directly (interop with another library, a benchmark's raw yardstick), as PJRT's
// `UnsafeBufferPointer` and torch's `data_ptr` do.
//
// Ownership: everything here is borrowed. Device handles stay valid while the device's client
// lives; a buffer's handle and address while the buffer lives. Never release, destroy or free
// them; objects made with them (a cl_mem, a PJRT_Buffer) are the caller's to release, before the
// client goes. Threading: the handles may be used from any thread, as their runtime allows
// (OpenCL and PJRT calls are thread-safe); commands on ferry's OpenCL queue are ordered with
// ferry's own.
#pragma once

#include <cstdint>
#include <string>

namespace ferry {

// A device's runtime objects (Device::NativeHandles()), per backend:
//   "pjrt":   api = const PJRT_Api* (the plugin's function table), client = PJRT_Client*,
//             device = PJRT_Device*, memory = the device's default PJRT_Memory* (null on plugins
//             without memories), queue = null.
//   "opencl": client = cl_context, device = cl_device_id, queue = cl_command_queue (the in-order
//             queue every transfer of ferry on this device runs on), api = memory = null.
//   "host":   none (Unimplemented): its buffers are host memory, see Buffer::DataAddress().
struct NativeDeviceHandles {
  std::string backend;
  // The shared library the handles belong to: the PJRT plugin's path, OpenCL's ICD loader.
  std::string library;
  void* api = nullptr;
  void* client = nullptr;
  void* device = nullptr;
  void* memory = nullptr;
  void* queue = nullptr;
  // The device's buffers are host memory (pjrt: the plugin says PJRT_Buffer_IsOnCpu; opencl: PoCL's
  // CPU device). Tells a benchmark that device memory counts against the process's own.
  bool memory_on_host = false;
};

// A buffer's runtime object (Buffer::NativeHandle()): "pjrt": the PJRT_Buffer*; "opencl": the
// cl_mem (null for a 0-byte buffer). Written only by ferry until Ready(); read it after that.
struct NativeBufferHandle {
  void* object = nullptr;
};

// Where a memory address points, numbered as DLPack's DLDeviceType (dlpack.h).
enum class AddressSpace : int32_t {
  kHost = 1,   // kDLCPU: host memory
  kCuda = 2,   // kDLCUDA: CUDA device memory
  kRocm = 10,  // kDLROCM: ROCm device memory
};

// The address of a buffer's first byte (Buffer::DataAddress()): its bytes are dense row-major in
// the buffer's device dtype from there.
struct BufferAddress {
  AddressSpace space = AddressSpace::kHost;
  // The runtime's own number for the device the address belongs to (the CUDA ordinal); 0 for
  // host memory.
  int32_t device_ordinal = 0;
  void* data = nullptr;
};

}  // namespace ferry
