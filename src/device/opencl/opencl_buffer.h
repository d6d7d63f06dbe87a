// The opencl backend's device memory and buffers, and the shared state that lets a buffer
// outlive its client.
//
// Lifetimes: a client owns its devices; each device shares its `DeviceQueue` (context and
// command queue) with every `DeviceMemory` made on it, so cl objects are released by their last
// holder, after the client if buffers outlive it. Every operation that will finish in an OpenCL
// event callback holds a `ClientLifetime::Token`; the client's destructor waits for all of them,
// so no callback ever runs ferry code that needs the client after it is gone, and the last
// reference to a context or queue is never dropped on the runtime's callback threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "ferry/core/future.h"
#include "ferry/core/metrics.h"
#include "ferry/device/buffer.h"
#include "ferry/device/device.h"
#include "ferry/device/memory_account.h"
#include "src/core/freed_memory_cache.h"
#include "src/device/client_lifetime.h"
#include "src/device/opencl/opencl_library.h"

namespace ferry {
class StagingRing;
}  // namespace ferry

namespace ferry::opencl {

class OpenClDevice;

// One device's cl_context (a context of its own), in-order command queue and cache of freed
// device memory. OpenCL 1.1+ makes every call used here thread-safe, so the queue is shared without
// a lock. Released by the last holder.
//
// Freed cl_mems go to a FreedMemoryCache (freed_memory_cache.h says why: on PoCL's CPU device a
// 256 MiB write into a fresh cl_mem takes ~9x as long as into one written before). Reusing a
// cl_mem is safe with one in-order queue: every command on the old buffer was enqueued before its
// memory came back to the cache, so it runs before any command of the new buffer.
class DeviceQueue {
 public:
  // `name` is the ferry device name ("opencl:0"), for messages. At most `cache_limit_bytes` of
  // freed memory are kept for reuse.
  static StatusOr<std::shared_ptr<DeviceQueue>> Create(const OpenClLibrary& cl, cl_device_id device,
                                                       bool opencl_1x, std::string name,
                                                       int64_t cache_limit_bytes);
  ~DeviceQueue();
  DeviceQueue(const DeviceQueue&) = delete;
  DeviceQueue& operator=(const DeviceQueue&) = delete;

  const OpenClLibrary& cl() const { return cl_; }
  cl_device_id device() const { return device_; }
  cl_context context() const { return context_; }
  cl_command_queue queue() const { return queue_; }
  const std::string& name() const { return name_; }

  // A cl_mem of `size_bytes` (> 0): from the cache when it holds one of that size, else
  // clCreateBuffer (emptying the cache and retrying once when that runs out of memory).
  // `tensor_name` is for the error message.
  StatusOr<cl_mem> AllocateMemory(int64_t size_bytes, std::string_view tensor_name);
  // Gives back memory from AllocateMemory, to the cache or released.
  void FreeMemory(cl_mem mem, int64_t size_bytes) { cache_.Give(mem, size_bytes); }
  // Releases the cached memory and caches no more (the client's destructor).
  void CloseCache() { cache_.Close(); }
  int64_t cached_bytes() const { return cache_.cached_bytes(); }

 private:
  DeviceQueue(const OpenClLibrary& cl, cl_device_id device, cl_context context,
              cl_command_queue queue, std::string name, int64_t cache_limit_bytes)
      : cl_(cl),
        device_(device),
        context_(context),
        queue_(queue),
        name_(std::move(name)),
        cache_(
            cache_limit_bytes, /*min_cached_bytes=*/0,
            [&cl](cl_mem mem) { cl.clReleaseMemObject(mem); }, metrics::DeviceMemoryCacheBytes(),
            metrics::DeviceMemoryCacheLimitBytes()) {}

  const OpenClLibrary& cl_;
  const cl_device_id device_;
  const cl_context context_;
  const cl_command_queue queue_;
  const std::string name_;
  FreedMemoryCache<cl_mem> cache_;
};

// One cl_mem of device memory, accounted against its device. Shared by the buffer and the
// staged transfers still to be enqueued on it; commands already enqueued keep the cl_mem alive on
// their own (OpenCL retains the memory objects of pending commands), so the last holder may give
// it back to the queue's cache (or release it) at once.
class DeviceMemory {
 public:
  // Reserves and creates `size_bytes` (no cl_mem for 0 bytes). ResourceExhausted when the
  // account or OpenCL says no.
  static StatusOr<std::shared_ptr<DeviceMemory>> Create(std::shared_ptr<DeviceQueue> queue,
                                                        std::shared_ptr<MemoryAccount> account,
                                                        int64_t size_bytes,
                                                        std::string_view tensor_name);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  // Null for an empty buffer.
  cl_mem mem() const { return mem_; }
  int64_t size_bytes() const { return size_bytes_; }
  const DeviceQueue& queue() const { return *queue_; }

 private:
  DeviceMemory(std::shared_ptr<DeviceQueue> queue, std::shared_ptr<MemoryAccount> account,
               cl_mem mem, int64_t size_bytes)
      : queue_(std::move(queue)),
        account_(std::move(account)),
        mem_(mem),
        size_bytes_(size_bytes) {}

  const std::shared_ptr<DeviceQueue> queue_;
  const std::shared_ptr<MemoryAccount> account_;
  const cl_mem mem_;
  const int64_t size_bytes_;
};

class OpenClBuffer final : public Buffer {
 public:
  // A buffer whose data arrives in `memory`. `enqueued` completes once every command writing it
  // has been enqueued (reads are enqueued after it, so the in-order queue runs them after the
  // writes), with the error if the writes never started; `ready` completes when the data has
  // arrived. `ring` belongs to the client and is used only while a token of `lifetime` is held.
  OpenClBuffer(OpenClDevice* device, DType device_dtype, Dims dims,
               std::shared_ptr<DeviceMemory> memory, Future<> ready, Future<> enqueued,
               std::shared_ptr<ClientLifetime> lifetime, StagingRing* ring,
               std::string tensor_name);
  ~OpenClBuffer() override = default;

  Device* device() const override;
  DType device_dtype() const override { return device_dtype_; }
  const Dims& dims() const override { return dims_; }
  int64_t size_bytes() const override { return memory_->size_bytes(); }
  Future<> Ready() const override { return ready_; }
  // Direct clEnqueueReadBuffer(Rect) into `dst` when it is dense or rectangular in the device
  // dtype; otherwise through staging and the fused copy-convert. Completes from the event
  // callback of the last read, after Ready().
  Future<> ToHost(const MutableHostView& dst) override;
  // One blocking clEnqueueReadBuffer of the range, after the writes of this buffer were
  // enqueued (the in-order queue runs it after them). Never call it from an event callback.
  Future<> CopyRawToHost(int64_t offset_bytes, int64_t size_bytes, void* dst) override;
  // The cl_mem (null for 0 bytes). A cl_mem has no address: DataAddress() is Unimplemented.
  StatusOr<NativeBufferHandle> NativeHandle() const override;
  StatusOr<BufferAddress> DataAddress() const override;

 private:
  OpenClDevice* const device_;
  const DType device_dtype_;
  const Dims dims_;
  const std::shared_ptr<DeviceMemory> memory_;
  const Future<> ready_;
  const Future<> enqueued_;
  const std::shared_ptr<ClientLifetime> lifetime_;
  StagingRing* const ring_;
  const std::string tensor_name_;
};

}  // namespace ferry::opencl
