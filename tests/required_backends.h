// Whether this run must have every backend: in CI (CI=true, or FERRY_REQUIRE_ALL_BACKENDS=1) a
// backend, PJRT plugin or device that cannot start fails the tests that need it, with its reason,
// instead of skipping them; so a build that silently lost a backend (no pjrt_c_api.h, no PoCL, no
// plugin installed) is red there. Elsewhere such a test skips and names the reason.
// FERRY_REQUIRE_ALL_BACKENDS=0 turns the requirement off even in CI.
#pragma once

#include <cstdlib>
#include <string>
#include <string_view>

#include "gtest/gtest.h"

namespace ferry::test_support {

inline bool AllBackendsRequired() {
  if (const char* required = std::getenv("FERRY_REQUIRE_ALL_BACKENDS");
      required != nullptr && *required != '\0') {
    return std::string_view(required) != "0";
  }
  const char* ci = std::getenv("CI");
  return ci != nullptr && std::string_view(ci) == "true";
}

// What a test reports when what it needs is unavailable: the reason, and in CI why that fails.
inline std::string UnavailableMessage(std::string_view reason) {
  std::string message(reason);
  if (AllBackendsRequired()) {
    message +=
        " [every backend is required here (CI=true or FERRY_REQUIRE_ALL_BACKENDS=1): "
        "install what it needs, or set FERRY_REQUIRE_ALL_BACKENDS=0 to skip]";
  }
  return message;
}

}  // namespace ferry::test_support

// Skips the current test with `reason`, or fails it where every backend is required. Use it in a
// test body or SetUp (it returns from the function).
#define FERRY_SKIP_OR_FAIL_UNAVAILABLE(reason)             \
  do {                                                     \
    const std::string ferry_unavailable_message =          \
        ::ferry::test_support::UnavailableMessage(reason); \
    if (::ferry::test_support::AllBackendsRequired()) {    \
      GTEST_FAIL() << ferry_unavailable_message;           \
    }                                                      \
    GTEST_SKIP() << ferry_unavailable_message;             \
  } while (false)
