// TensorSource: an immutable host tensor view plus the ownership of its memory.
//
// Sources are shared as `std::shared_ptr<const TensorSource>`. A transfer that reads a source
// asynchronously holds such a reference until it has read the last byte, then drops it on a
// runtime thread; so a source's destructor (and its keep-alive's deleter) may run on any thread.
// Keep-alives that must not be released on an arbitrary thread (Python objects) handle that
// themselves (the Python layer queues them for the GIL).
#pragma once

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

 protected:
  TensorSource(HostView view, std::string name) : view_(std::move(view)), name_(std::move(name)) {}

 private:
  HostView view_;
  std::string name_;
};

}  // namespace ferry
