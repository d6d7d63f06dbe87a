// ferry_pjrt_plugin.so: a PJRT C API plugin that wraps another one (wrapped_plugin.h) and gives
// its callers (JAX, torch_xla) ferry's host transfers; docs/jax.md says how to load it. It exports
// GetPjrtApi and FerryPjrtPluginCounters (exports.map hides everything else, so the copy of ferry
// inside it never clashes with the one in ferry's Python module).
#include "pjrt_c_api.h"
#include "src/plugin/wrapped_plugin.h"

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  ferry::StatusOr<ferry::plugin::WrappedPlugin*> plugin = ferry::plugin::WrappedPlugin::Get();
  if (!plugin.ok()) return ferry::plugin::FailureTable(plugin.status());
  return (*plugin)->table();
}

// Which path the transfer entries took so far, for tests and users (ferry.jax.counters()): writes
// up to `size` of [puts by ferry, puts by the wrapped plugin, reads by ferry, reads by the wrapped
// plugin, calls refused for bad input, puts by ferry returned before ferry wrote them, bytes of
// memory ferry holds for the plugin's buffers now] to `out` and returns how many there are (7).
// Any thread.
namespace {

// Made by GetPjrtApi; a caller that asks before (C code reading the counters first) makes it here.
int64_t BytesInUse() {
  ferry::StatusOr<ferry::plugin::WrappedPlugin*> plugin = ferry::plugin::WrappedPlugin::Get();
  return plugin.ok() ? (*plugin)->memory()->in_use() : 0;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) int FerryPjrtPluginCounters(int64_t* out,
                                                                              int size) {
  const ferry::plugin::PathCounters& counters = ferry::plugin::Counters();
  const int64_t values[] = {counters.puts_by_ferry.load(),
                            counters.puts_by_plugin.load(),
                            counters.reads_by_ferry.load(),
                            counters.reads_by_plugin.load(),
                            counters.refused.load(),
                            counters.puts_after_the_call.load(),
                            BytesInUse()};
  constexpr int kCount = sizeof(values) / sizeof(values[0]);
  for (int i = 0; out != nullptr && i < size && i < kCount; ++i) out[i] = values[i];
  return kCount;
}
