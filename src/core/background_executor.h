// BackgroundExecutor(): the process's one SerialExecutor (serial_executor.h) for continuations
// that belong to no client: the second half of a device-to-device copy through the host
// (Buffer::CopyToDevice's default), which must run neither on the thread that completed the
// read (a copy worker, a plugin's event thread) nor on the caller's.
//
// Ownership and threading: callable from any thread; the executor is never destroyed (its thread
// runs until the process exits, so nothing at exit waits for it). Fork-aware: a forked child gets
// an executor of its own on its first call (the parent's thread did not survive the fork; its
// executor, and whatever was queued on it, is abandoned, never touched again).
#pragma once

#include "ferry/core/future.h"

namespace ferry {

Executor& BackgroundExecutor();

}  // namespace ferry
