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

  // An error a replaced entry may return: the patched error entries answer it with `code` and
  // `message` (AnswerSentinelError), and forward every other error to the plugin.
  static PJRT_Error* SentinelError() {
    static char sentinel;
    return reinterpret_cast<PJRT_Error*>(&sentinel);
  }
  void AnswerSentinelError(const char* message, PJRT_Error_Code code) {
    sentinel_message_ = message;
    sentinel_code_ = code;
    patched_.PJRT_Error_Message = [](PJRT_Error_Message_Args* args) {
      if (args->error != SentinelError()) return real().PJRT_Error_Message(args);
      args->message = sentinel_message_;
      args->message_size = std::strlen(sentinel_message_);
    };
    patched_.PJRT_Error_GetCode = [](PJRT_Error_GetCode_Args* args) -> PJRT_Error* {
      if (args->error != SentinelError()) return real().PJRT_Error_GetCode(args);
      args->code = sentinel_code_;
      return nullptr;
    };
    patched_.PJRT_Error_Destroy = [](PJRT_Error_Destroy_Args* args) {
      if (args->error != SentinelError()) real().PJRT_Error_Destroy(args);
    };
  }

 private:
  pjrt::PjrtLibrary* const library_;
  static inline const PJRT_Api* real_ = nullptr;
  static inline const char* sentinel_message_ = "";
  static inline PJRT_Error_Code sentinel_code_ = PJRT_Error_Code_UNKNOWN;
  PJRT_Api patched_{};
};

}  // namespace ferry
