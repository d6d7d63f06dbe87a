// The two GIL defences of the Python layer (docs/python.md, "The GIL").
//
// 1. Never block while holding the GIL: every call that can wait holds a `ScopedGilRelease`,
//    which restores the thread state on every path, errors and exceptions included.
// 2. Never destroy a Python object off the GIL: a Python object owned by a transfer lives in a
//    `PyHeld`, and the last reference to a `PyHeld` is dropped through `ReleasePyHeld`. On a thread
//    without the GIL that queues it; the queue is emptied under the GIL at every API entry and
//    exit and by a scheduled pending call (`Py_AddPendingCall`).
// Either defence alone prevents the deadlock of a completion callback that needs the GIL while
// the main thread holds it and waits for that transfer. Both can be switched off for tests
// (ferry._testing); both default on.
#pragma once

#include <Python.h>

#include <atomic>
#include <cstdint>
#include <memory>

#include "ferry/core/future.h"

namespace ferry::python {

// fork(): a child process has none of the parent's threads (the backends' engines, runtime
// callbacks), so nothing made before the fork can be waited on in the child. Every fork bumps the
// generation (a pthread_atfork child handler: an atomic increment, async-signal-safe); state made
// in an older generation is abandoned in the child, never waited on and never destroyed (its
// destructor could wait for threads that do not exist or take a lock a vanished thread held).
// Installs the handler once; call at module import.
void InstallForkHandler();
// 0 in the process that imported ferry; +1 in a child per fork since.
uint64_t ForkGeneration();

// Records Python's main thread (the main interpreter's first thread state), the one that
// finalises the interpreter at exit; a forked child's is the thread that forked. Call at module
// import, with the GIL.
void RecordMainThread();
// Whether the calling thread is Python's main thread: the only one whose signal handlers run, and
// the only one that may take the GIL back while the interpreter finalises.
bool OnMainThread();

// Defence switches (tests only). Thread-safe.
void SetReleaseGil(bool enabled);
bool ReleaseGilEnabled();
void SetDeferredRelease(bool enabled);
bool DeferredReleaseEnabled();

// Releases the GIL for its scope when defence 1 is on (and `wanted`); re-acquires it on exit.
// Must be constructed on a thread that holds the GIL.
class ScopedGilRelease {
 public:
  explicit ScopedGilRelease(bool wanted = true);
  ~ScopedGilRelease();
  ScopedGilRelease(const ScopedGilRelease&) = delete;
  ScopedGilRelease& operator=(const ScopedGilRelease&) = delete;

 private:
  PyThreadState* saved_ = nullptr;
};

// Waits until `done` is ready, without the GIL (when defence 1 is on), in slices of a few tens of
// milliseconds; between slices it takes the GIL back and runs Python's signal handlers
// (PyErr_CheckSignals), so that Ctrl-C raises KeyboardInterrupt promptly on the main thread:
// then it throws nanobind::python_error and the transfer carries on to its end in the
// background (everything it uses is owned by it). Must be called with the GIL held.
void WaitInterruptibly(const Future<>& done);

// Something that owns Python references (an array, a buffer view, a DLPack import). Its
// destructor needs the GIL; it is only ever destroyed by `ReleasePyHeld` or under the GIL.
class PyHeld {
 public:
  virtual ~PyHeld() = default;
};

// Drops `held` now if this thread holds the GIL; otherwise queues it (defence 2) or, with
// defence 2 switched off, takes the GIL itself to drop it (the path that can deadlock).
void ReleasePyHeld(PyHeld* held);

// A shared_ptr that releases its PyHeld through ReleasePyHeld, whichever thread drops it last.
std::shared_ptr<const void> MakeKeepAlive(std::unique_ptr<PyHeld> held);

// Destroys every queued PyHeld. Requires the GIL. Cheap when the queue is empty.
void DrainReleaseQueue();

// Number of objects currently queued (tests).
size_t PendingReleaseCount();

// Drains the queue on construction and destruction: put one at every API entry point.
class ApiScope {
 public:
  ApiScope() { DrainReleaseQueue(); }
  ~ApiScope() { DrainReleaseQueue(); }
};

}  // namespace ferry::python
