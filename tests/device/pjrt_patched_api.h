// PatchedPjrtApi: a copy of a PJRT plugin's function table, installed in ferry's cached
// PjrtLibrary for the plugin while it lives, so that tests can make the real plugin misbehave in
// one entry (fail, copy where it would alias) and forward everything else to it.
#pragma once

#include <algorithm>
#include <cstring>

#include "pjrt_c_api.h"
#include "src/device/pjrt/pjrt_library.h"

namespace ferry {

class PatchedPjrtApi {
 public:
  // Installs the copy; the caller replaces entries in api() before it makes a client (a client
  // calls the table installed when it makes each call). One at a time.
  explicit PatchedPjrtApi(const pjrt::PjrtLibrary* library)
      : library_(const_cast<pjrt::PjrtLibrary*>(library)) {
    real_ = library->api;
    std::memcpy(&patched_, real_, std::min(real_->struct_size, sizeof(PJRT_Api)));
    library_->api = &patched_;
  }
  // Puts the plugin's own table back; every client made meanwhile must be gone.
  ~PatchedPjrtApi() { library_->api = real_; }
  PatchedPjrtApi(const PatchedPjrtApi&) = delete;
  PatchedPjrtApi& operator=(const PatchedPjrtApi&) = delete;

  PJRT_Api& api() { return patched_; }
  // The plugin's own table, for replaced entries (plain functions, no captures) to forward to.
  static const PJRT_Api& real() { return *real_; }

 private:
  pjrt::PjrtLibrary* const library_;
  static inline const PJRT_Api* real_ = nullptr;
  PJRT_Api patched_{};
};

}  // namespace ferry
