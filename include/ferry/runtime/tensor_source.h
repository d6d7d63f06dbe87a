// TensorSource: an immutable host tensor view plus the ownership of its memory.
//
// Sources are shared as `std::shared_ptr<const TensorSource>`. A transfer that reads a source
// asynchronously holds such a reference until it has read the last byte, then drops it on a
// runtime thread; so a source's destructor (and its keep-alive's deleter) may run on any thread.
// Keep-alives that must not be released on an arbitrary thread (Python objects) handle that
// themselves (the Python layer queues them for the GIL).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "ferry/core/host_tensor.h"
#include "ferry/core/host_view.h"
#include "ferry/core/status.h"

namespace ferry {

class TensorSource {
 public:
  virtual ~TensorSource() = default;

  // The tensor; valid for the life of this source.
  const HostView& view() const { return view_; }
  // Used in every error message about this tensor.
  const std::string& name() const { return name_; }

  // A source that owns `tensor`.
  static std::shared_ptr<const TensorSource> FromHostTensor(HostTensor tensor,
                                                            std::string name = "tensor");

  // A source that borrows `view`, whose memory lies inside [region_begin, region_begin +
  // region_size) and stays valid as long as `keep_alive` lives; the source holds `keep_alive`
  // and drops it when the source is destroyed. The view is validated against the region
  // (InvalidArgument naming the tensor, the dim and the stride).
  static StatusOr<std::shared_ptr<const TensorSource>> Borrow(
      const HostView& view, const void* region_begin, int64_t region_size,
      std::shared_ptr<const void> keep_alive, std::string name = "tensor");

  // The same, with `read_check`: called (on the thread that finished reading the source) once a
  // transfer has read every byte of it, it says whether what was read is the source's data. A
  // mapped file truncated under the read reads as zeros: its sources answer DataLoss, and the
  // transfer's Data::Ready() completes with that error (TransferFromDevice returns it).
  static StatusOr<std::shared_ptr<const TensorSource>> Borrow(
      const HostView& view, const void* region_begin, int64_t region_size,
      std::shared_ptr<const void> keep_alive, std::string name, std::function<Status()> read_check);

  // OK, or why the bytes a transfer just read from this source are not its data (see Borrow).
  // Only meaningful right after a read. The default: OK.
  virtual Status CheckRead() const { return OkStatus(); }
  // Whether CheckRead can ever fail (transfers skip the check otherwise).
  virtual bool ChecksReads() const { return false; }

 protected:
  TensorSource(HostView view, std::string name) : view_(std::move(view)), name_(std::move(name)) {}

 private:
  HostView view_;
  std::string name_;
};

}  // namespace ferry
