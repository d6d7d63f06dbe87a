// ferry_pjrt_plugin.so: a PJRT C API plugin that wraps another one (wrapped_plugin.h) and gives
// its callers (JAX, torch_xla) ferry's host transfers; docs/jax.md says how to load it. The one
// symbol it exports is GetPjrtApi (the link's version script hides everything else, so the
// copy of ferry inside it never clashes with the one in ferry's Python module).
#include "pjrt_c_api.h"
#include "src/plugin/wrapped_plugin.h"

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  ferry::StatusOr<ferry::plugin::WrappedPlugin*> plugin = ferry::plugin::WrappedPlugin::Get();
  if (!plugin.ok()) return ferry::plugin::FailureTable(plugin.status());
  return (*plugin)->table();
}
