// ClientLifetime: operations begin only while the client runs, continuations of an operation in
// flight go on while it closes, and the client waits for every one of them.
#include "src/device/client_lifetime.h"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "gtest/gtest.h"

namespace ferry {
namespace {

TEST(ClientLifetimeTest, NothingBeginsOnceClosedButSharesOfAHeldTokenDo) {
  auto lifetime = std::make_shared<ClientLifetime>("test");
  StatusOr<ClientLifetime::Token> token = ClientLifetime::Begin(lifetime, "operation");
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_TRUE(token->held());
  lifetime->Close();
  const StatusOr<ClientLifetime::Token> late = ClientLifetime::Begin(lifetime, "late operation");
  EXPECT_TRUE(absl::IsFailedPrecondition(late.status())) << late.status();
  EXPECT_NE(late.status().message().find("late operation: the test client has been shut down"),
            std::string::npos)
      << late.status();
  ClientLifetime::Token continuation = token->Share();
  EXPECT_TRUE(continuation.held());
  EXPECT_FALSE(ClientLifetime::Token().Share().held());

  // The client waits for the share too, not only for the token it came from.
  std::atomic<bool> idle{false};
  std::thread waiter([&] {
    lifetime->WaitUntilIdle();
    idle = true;
  });
  token->Release();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(idle) << "idle while a shared token was still held";
  continuation.Release();
  waiter.join();
  EXPECT_TRUE(idle);
}

}  // namespace
}  // namespace ferry
