#include "src/python/gil.h"

#include <mutex>
#include <vector>

namespace ferry::python {
namespace {

std::atomic<bool> release_gil{true};
std::atomic<bool> deferred_release{true};

struct ReleaseQueue {
  std::mutex mutex;
  std::vector<PyHeld*> queued;
  std::atomic<size_t> size{0};
  std::atomic<bool> pending_call_scheduled{false};
};

ReleaseQueue& Queue() {
  // Never destroyed: runtime threads may still queue objects while the interpreter exits.
  static ReleaseQueue* queue = new ReleaseQueue();
  return *queue;
}

bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

int DrainFromPendingCall(void*) {
  Queue().pending_call_scheduled.store(false);
  DrainReleaseQueue();
  return 0;
}

}  // namespace

void SetReleaseGil(bool enabled) { release_gil.store(enabled); }
bool ReleaseGilEnabled() { return release_gil.load(); }
void SetDeferredRelease(bool enabled) { deferred_release.store(enabled); }
bool DeferredReleaseEnabled() { return deferred_release.load(); }

ScopedGilRelease::ScopedGilRelease(bool wanted) {
  if (wanted && release_gil.load(std::memory_order_relaxed)) saved_ = PyEval_SaveThread();
}

ScopedGilRelease::~ScopedGilRelease() {
  if (saved_ != nullptr) PyEval_RestoreThread(saved_);
}

void ReleasePyHeld(PyHeld* held) {
  if (held == nullptr) return;
  if (PyGILState_Check()) {
    delete held;
    return;
  }
  if (InterpreterFinalizing())
    return;  // the interpreter is going away: leaking is the only safe choice
  if (deferred_release.load()) {
    ReleaseQueue& queue = Queue();
    {
      std::lock_guard<std::mutex> lock(queue.mutex);
      queue.queued.push_back(held);
      queue.size.store(queue.queued.size(), std::memory_order_relaxed);
    }
    // Py_AddPendingCall may be called without the GIL; it runs the drain on the main thread at
    // its next bytecode boundary.
    if (!queue.pending_call_scheduled.exchange(true)) {
      if (Py_AddPendingCall(&DrainFromPendingCall, nullptr) != 0) {
        queue.pending_call_scheduled.store(false);  // queue full: the next API call drains it
      }
    }
    return;
  }
  // Defence 2 is off: drop the references here, which needs the GIL.
  PyGILState_STATE state = PyGILState_Ensure();
  delete held;
  PyGILState_Release(state);
}

std::shared_ptr<const void> MakeKeepAlive(std::unique_ptr<PyHeld> held) {
  return std::shared_ptr<const void>(held.release(), [](const void* p) {
    ReleasePyHeld(static_cast<PyHeld*>(const_cast<void*>(p)));
  });
}

void DrainReleaseQueue() {
  ReleaseQueue& queue = Queue();
  if (queue.size.load(std::memory_order_relaxed) == 0) return;
  std::vector<PyHeld*> drained;
  {
    std::lock_guard<std::mutex> lock(queue.mutex);
    drained.swap(queue.queued);
    queue.size.store(0, std::memory_order_relaxed);
  }
  for (PyHeld* held : drained) delete held;
}

size_t PendingReleaseCount() { return Queue().size.load(); }

}  // namespace ferry::python
