#include "src/device/client_lifetime.h"

#include "fmt/format.h"

namespace ferry {

ClientLifetime::Token& ClientLifetime::Token::operator=(Token&& other) noexcept {
  if (this != &other) {
    Release();
    lifetime_ = std::move(other.lifetime_);
  }
  return *this;
}

void ClientLifetime::Token::Release() {
  if (lifetime_ == nullptr) return;
  std::shared_ptr<ClientLifetime> lifetime = std::move(lifetime_);
  lifetime->End();
}

ClientLifetime::Token ClientLifetime::Token::Share() const {
  if (lifetime_ == nullptr) return Token();
  {
    MutexLock lock(lifetime_->mutex_);
    ++lifetime_->in_flight_;
  }
  return Token(lifetime_);
}

StatusOr<ClientLifetime::Token> ClientLifetime::Begin(
    const std::shared_ptr<ClientLifetime>& lifetime, std::string_view what) {
  {
    MutexLock lock(lifetime->mutex_);
    if (lifetime->closed_) {
      return FailedPreconditionError(
          fmt::format("{}: the {} client has been shut down", what, lifetime->backend_));
    }
    ++lifetime->in_flight_;
  }
  return Token(lifetime);
}

bool ClientLifetime::closed() const {
  MutexLock lock(mutex_);
  return closed_;
}

void ClientLifetime::Close() {
  MutexLock lock(mutex_);
  closed_ = true;
}

void ClientLifetime::WaitUntilIdle() {
  MutexLock lock(mutex_);
  while (in_flight_ != 0) lock.Wait(idle_);
}

void ClientLifetime::End() {
  // Notified under the lock: the waiter cannot return (and destroy the client) before this
  // thread has let go of the mutex; the lifetime itself is kept alive by the caller's reference.
  MutexLock lock(mutex_);
  if (--in_flight_ == 0) idle_.notify_all();
}

}  // namespace ferry
