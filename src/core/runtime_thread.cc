#include "ferry/core/runtime_thread.h"

namespace ferry {
namespace {

thread_local int runtime_depth = 0;

}  // namespace

bool OnRuntimeThread() { return runtime_depth > 0; }

RuntimeThreadScope::RuntimeThreadScope() { ++runtime_depth; }
RuntimeThreadScope::~RuntimeThreadScope() { --runtime_depth; }

}  // namespace ferry
