#include "ferry/runtime/tensor_source.h"

namespace ferry {
namespace {

class OwnedTensorSource final : public TensorSource {
 public:
  OwnedTensorSource(HostTensor tensor, std::string name)
      : TensorSource(tensor.view(), std::move(name)), tensor_(std::move(tensor)) {}

 private:
  HostTensor tensor_;
};

class BorrowedTensorSource final : public TensorSource {
 public:
  BorrowedTensorSource(HostView view, std::shared_ptr<const void> keep_alive, std::string name,
                       std::function<Status()> read_check)
      : TensorSource(std::move(view), std::move(name)),
        keep_alive_(std::move(keep_alive)),
        read_check_(std::move(read_check)) {}

  Status CheckRead() const override { return read_check_ ? read_check_() : OkStatus(); }
  bool ChecksReads() const override { return static_cast<bool>(read_check_); }

 private:
  std::shared_ptr<const void> keep_alive_;
  std::function<Status()> read_check_;
};

}  // namespace

std::shared_ptr<const TensorSource> TensorSource::FromHostTensor(HostTensor tensor,
                                                                 std::string name) {
  return std::make_shared<OwnedTensorSource>(std::move(tensor), std::move(name));
}

StatusOr<std::shared_ptr<const TensorSource>> TensorSource::Borrow(
    const HostView& view, const void* region_begin, int64_t region_size,
    std::shared_ptr<const void> keep_alive, std::string name) {
  return Borrow(view, region_begin, region_size, std::move(keep_alive), std::move(name), nullptr);
}

StatusOr<std::shared_ptr<const TensorSource>> TensorSource::Borrow(
    const HostView& view, const void* region_begin, int64_t region_size,
    std::shared_ptr<const void> keep_alive, std::string name, std::function<Status()> read_check) {
  FERRY_RETURN_IF_ERROR(view.ValidateWithin(region_begin, region_size, name));
  return std::shared_ptr<const TensorSource>(std::make_shared<BorrowedTensorSource>(
      view, std::move(keep_alive), std::move(name), std::move(read_check)));
}

}  // namespace ferry
