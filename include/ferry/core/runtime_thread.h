// Whether the calling thread is working for ferry's runtime: one of its own threads (transfer
// engine workers, staging ring workers, serial executors) or a thread of a device runtime that is
// running one of ferry's completion callbacks (an OpenCL event callback, a PJRT event's OnReady).
// Continuations of ferry's futures run there. A call that would otherwise wait for other
// transfers to end (a failing TransferToDevice letting what it started finish) does not wait on
// such a thread: the work it would wait for may be queued behind this very thread.
// Thread-safe (a thread-local count).
#pragma once

namespace ferry {

bool OnRuntimeThread();

// Marks the calling thread as a runtime thread for its lifetime; scopes nest.
class RuntimeThreadScope {
 public:
  RuntimeThreadScope();
  ~RuntimeThreadScope();
  RuntimeThreadScope(const RuntimeThreadScope&) = delete;
  RuntimeThreadScope& operator=(const RuntimeThreadScope&) = delete;
};

}  // namespace ferry
