#include "src/python/gil.h"

#include <cxxabi.h>
#include <nanobind/nanobind.h>
#include <pthread.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "ferry/core/mutex.h"

namespace ferry::python {
namespace {

std::atomic<bool> release_gil{true};
std::atomic<bool> deferred_release{true};
std::atomic<uint64_t> fork_generation{0};

// The ident of Python's main thread: the one that runs the interpreter's finalisation at exit,
// which may take the GIL back while finalising (module globals' __del__, generators closed at
// exit: a ferry call there must finish, not park). 0 until RecordMainThread.
std::atomic<unsigned long> main_thread_ident{0};

void OnForkInChild() {
  fork_generation.fetch_add(1, std::memory_order_relaxed);
  // The forking thread is the child's main thread (CPython's PyOS_AfterFork_Child says so too).
  main_thread_ident.store(PyThread_get_thread_ident(), std::memory_order_relaxed);
}

struct ReleaseQueue {
  explicit ReleaseQueue(uint64_t generation) : generation(generation) {}
  const uint64_t generation;
  Mutex mutex;
  std::vector<PyHeld*> queued ABSL_GUARDED_BY(mutex);
  std::atomic<size_t> size{0};
  std::atomic<bool> pending_call_scheduled{false};
};

ReleaseQueue& Queue() {
  // Never destroyed: runtime threads may still queue objects while the interpreter exits. A
  // forked child gets a new queue: the parent's mutex may have been held by a thread that does
  // not exist in the child, and what it queued belongs to transfers the child cannot see end.
  static std::atomic<ReleaseQueue*> current{new ReleaseQueue(0)};
  ReleaseQueue* queue = current.load(std::memory_order_acquire);
  const uint64_t generation = ForkGeneration();
  while (queue->generation != generation) {
    auto* fresh = new ReleaseQueue(generation);
    if (current.compare_exchange_strong(queue, fresh, std::memory_order_acq_rel)) return *fresh;
    delete fresh;  // another thread of the child made one first; `queue` is now that one
  }
  return *queue;
}

bool InterpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing();
#else
  return _Py_IsFinalizing();
#endif
}

// Whether this thread may not take the GIL back: the interpreter finalises and this thread is not
// the one finalising it (CPython would end it in PyEval_RestoreThread).
bool MustNotRetakeTheGil() {
  return InterpreterFinalizing() &&
         PyThread_get_thread_ident() != main_thread_ident.load(std::memory_order_relaxed);
}

[[noreturn]] void ParkForever() {
  for (;;) ::pause();
}

int DrainFromPendingCall(void*) {
  Queue().pending_call_scheduled.store(false);
  DrainReleaseQueue();
  return 0;
}

}  // namespace

void InstallForkHandler() {
  static const bool installed = [] {
    return pthread_atfork(nullptr, nullptr, &OnForkInChild) == 0;
  }();
  (void)installed;
}

void RecordMainThread() {
  // The main interpreter's oldest thread state: the main thread's, made at start-up and kept to
  // the end (new ones go to the head of the list). Not threading.main_thread(), which before
  // Python 3.13 is whichever thread first imported threading (ferry imported from a thread made
  // with _thread would then park the real main thread at exit).
  PyThreadState* oldest = nullptr;
  for (PyThreadState* state = PyInterpreterState_ThreadHead(PyInterpreterState_Main());
       state != nullptr; state = PyThreadState_Next(state)) {
    oldest = state;
  }
  if (oldest != nullptr) main_thread_ident.store(oldest->thread_id, std::memory_order_relaxed);
}

bool OnMainThread() {
  return PyThread_get_thread_ident() == main_thread_ident.load(std::memory_order_relaxed);
}

uint64_t ForkGeneration() { return fork_generation.load(std::memory_order_relaxed); }

void SetReleaseGil(bool enabled) { release_gil.store(enabled); }
bool ReleaseGilEnabled() { return release_gil.load(); }
void SetDeferredRelease(bool enabled) { deferred_release.store(enabled); }
bool DeferredReleaseEnabled() { return deferred_release.load(); }

ScopedGilRelease::ScopedGilRelease(bool wanted) {
  if (wanted && release_gil.load(std::memory_order_relaxed)) saved_ = PyEval_SaveThread();
}

ScopedGilRelease::~ScopedGilRelease() {
  if (saved_ == nullptr) return;
  // A thread that wants the GIL back while the interpreter finalises is ended by Python
  // (pthread_exit in PyEval_RestoreThread), which unwinds this noexcept destructor and so calls
  // std::terminate (a daemon thread inside a blocking call at exit: rc 134). Such a thread never
  // returns to Python: it parks here, for good, and the process exits around it (as Python 3.14
  // does with its own threads). The check below closes the common case; the catch closes the
  // window between the check and the restore. The main thread, which finalises, takes the GIL
  // back as ever: a ferry call in a __del__ run at exit finishes (parking it hung the exit).
  if (MustNotRetakeTheGil()) ParkForever();
  try {
    PyEval_RestoreThread(saved_);
  } catch (abi::__forced_unwind&) {
    ParkForever();  // never leaves the handler, so the unwind is neither finished nor swallowed
  }
}

void WaitInterruptibly(const Future<>& done) {
  if (done.IsReady()) return;
  struct Waiter {
    Mutex mutex;
    std::condition_variable ready_cv;
    bool ready ABSL_GUARDED_BY(mutex) = false;
  };
  auto waiter = std::make_shared<Waiter>();
  done.OnReady([waiter](const Status&) {
    {
      MutexLock lock(waiter->mutex);
      waiter->ready = true;
    }
    waiter->ready_cv.notify_all();
  });
  for (;;) {
    bool ready = false;
    {
      ScopedGilRelease unlocked;
      MutexLock lock(waiter->mutex);
      if (!waiter->ready) lock.WaitFor(waiter->ready_cv, std::chrono::milliseconds(20));
      ready = waiter->ready;
    }
    if (ready) return;
    if (PyErr_CheckSignals() != 0) throw nanobind::python_error();
  }
}

namespace {

// Whether the calling thread holds the GIL: its own thread state is the current one. Not
// PyGILState_Check, which answers 1 on every thread once the process has made a subinterpreter
// (CPython then turns its check off), so a copy worker would drop Python objects without the GIL.
// A runtime thread has no thread state of its own: never.
bool ThisThreadHoldsTheGil() {
  PyThreadState* mine = PyGILState_GetThisThreadState();
#if PY_VERSION_HEX >= 0x030D0000
  PyThreadState* current = PyThreadState_GetUnchecked();
#else
  PyThreadState* current = _PyThreadState_UncheckedGet();
#endif
  return mine != nullptr && mine == current;
}

}  // namespace

void ReleasePyHeld(PyHeld* held) {
  if (held == nullptr) return;
  if (ThisThreadHoldsTheGil()) {
    delete held;
    return;
  }
  if (InterpreterFinalizing())
    return;  // the interpreter is going away: leaking is the only safe choice
  if (deferred_release.load()) {
    ReleaseQueue& queue = Queue();
    {
      MutexLock lock(queue.mutex);
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
    MutexLock lock(queue.mutex);
    drained.swap(queue.queued);
    queue.size.store(0, std::memory_order_relaxed);
  }
  for (PyHeld* held : drained) delete held;
}

size_t PendingReleaseCount() { return Queue().size.load(); }

}  // namespace ferry::python
