// ClientLifetime: whether a backend's client still runs, and how many operations it still has in
// flight. Shared by the client, its buffers and the operations themselves, so that a buffer may
// outlive its client (its calls then fail with FailedPrecondition) and so that the client's
// destructor can wait for every operation that will finish on a runtime thread (an OpenCL event
// callback, a PJRT event continuation) before it tears down what those operations use.
// Used by every backend whose completions run on threads it does not own. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/base/thread_annotations.h"
#include "ferry/core/mutex.h"
#include "ferry/core/status.h"

namespace ferry {

class ClientLifetime {
 public:
  // `backend` names the client in errors ("the opencl client has been shut down").
  explicit ClientLifetime(std::string backend) : backend_(std::move(backend)) {}

  // Proof that an operation is in flight; the client's destructor waits until every token is
  // released. Move-only; releasing it is the last thing an operation does.
  class Token {
   public:
    Token() = default;
    explicit Token(std::shared_ptr<ClientLifetime> lifetime) : lifetime_(std::move(lifetime)) {}
    Token(Token&& other) noexcept = default;
    Token& operator=(Token&& other) noexcept;
    ~Token() { Release(); }
    void Release();
    // Whether this token still holds an operation in flight.
    bool held() const { return lifetime_ != nullptr; }
    // Another token for a continuation of this token's operation (a completion that outlives the
    // part holding this one). Succeeds even once the client is closing: the client cannot be
    // idle while this token is held. An empty token shares into an empty token.
    Token Share() const;

   private:
    std::shared_ptr<ClientLifetime> lifetime_;
  };

  // A token for a new operation; FailedPrecondition (naming `what`) once the client is closing.
  static StatusOr<Token> Begin(const std::shared_ptr<ClientLifetime>& lifetime,
                               std::string_view what);
  bool closed() const;
  // No Begin succeeds after this.
  void Close();
  // Blocks until every token has been released. Never call it from a runtime callback thread.
  void WaitUntilIdle();

 private:
  void End();

  const std::string backend_;
  mutable Mutex mutex_;
  std::condition_variable idle_;
  bool closed_ ABSL_GUARDED_BY(mutex_) = false;
  int64_t in_flight_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace ferry
