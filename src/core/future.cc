#include "ferry/core/future.h"

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ferry {
namespace {

// Shared by the callbacks of one JoinFutures call. Each callback writes only its own slot, then
// counts down; the acq_rel decrement publishes the slots to the callback that reaches zero, which
// alone reads them all.
struct JoinState {
  explicit JoinState(size_t count) : statuses(count), remaining(count) {}

  void Complete(size_t index, const Status& status) {
    statuses[index] = status;
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    for (const Status& each : statuses) {
      if (!each.ok()) {
        promise.Set(each);
        return;
      }
    }
    promise.Set(OkStatus());
  }

  std::vector<Status> statuses;
  std::atomic<size_t> remaining;
  Promise<> promise;
};

}  // namespace

Future<> JoinFutures(absl::Span<const Future<>> futures) {
  if (futures.empty()) return Future<>::Ready(OkStatus());
  auto state = std::make_shared<JoinState>(futures.size());
  // Take the result future before registering callbacks: the last one may complete it inline.
  Future<> joined = state->promise.future();
  for (size_t i = 0; i < futures.size(); ++i) {
    if (!futures[i].valid()) {
      // An invalid future would never complete; report it instead of hanging every waiter.
      state->Complete(i, InvalidArgumentError(absl::StrCat("JoinFutures: future ", i,
                                                           " is invalid (default-constructed)")));
      continue;
    }
    futures[i].OnReady([state, i](const Status& status) { state->Complete(i, status); });
  }
  return joined;
}

}  // namespace ferry
