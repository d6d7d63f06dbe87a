// Runs the device-API conformance suite on the pjrt backend, three ways:
// - "pjrt": the plugin found as a user's program finds it (FERRY_PJRT_PLUGIN, else the first
//   installed one: here the XLA CPU plugin, API 0.81), with every path ferry picks for it (on
//   the CPU plugin: direct writes into ferry's memory, handed to the plugin as views);
// - "pjrt_plugin_paths": the same plugin with direct host access turned off, so every transfer
//   goes through the plugin's own entries as it would on a GPU (BufferFromHostBuffer with byte
//   strides, the transfer manager fed from staging chunks, partial reads);
// - "pjrt_api115": the same plugin built at API 0.115 (lammps-jax-pjrt-cpu), through its own
//   entries too: ferry's 0.81 header driving a newer plugin.
// Where no plugin is installed, the factory returns Unavailable and every test skips with that
// reason (fails, in CI: tests/required_backends.h).
#include "conformance_suite.h"

namespace {

// Under ThreadSanitizer only the "pjrt" registration runs. The other two go through the plugin's
// own entries for every transfer: code built without TSan, whose thread hand-offs it cannot see
// (tests/tsan_suppressions.txt) and which it slows down past any CI budget (one round-trip test
// ran for more than ten minutes); ASan and the plain build run them.
#if defined(__SANITIZE_THREAD__)
constexpr bool kPluginPathsUnderTsan = true;
#else
constexpr bool kPluginPathsUnderTsan = false;
#endif

ferry::ClientOptions WithPjrt(ferry::ClientOptions options, std::optional<std::string> plugin,
                              std::optional<bool> direct) {
  if (plugin.has_value()) options.pjrt_plugin = plugin;
  options.pjrt_direct_host_access = direct;
  return options;
}

// The CPU plugins accept cpu_device_count, so several devices may be asked for; the memory limit
// and the dtype profile are ferry's own accounting, honoured on every plugin.
ferry::conformance::ConformanceBackend PjrtBackend(std::string variant,
                                                   std::optional<std::string> plugin,
                                                   std::optional<bool> direct) {
  ferry::conformance::ConformanceBackend backend{
      .name = "pjrt",
      .variant = std::move(variant),
      .make_client = [plugin, direct](const ferry::ClientOptions& options)
          -> ferry::StatusOr<std::unique_ptr<ferry::Client>> {
        return ferry::CreateClient("pjrt", WithPjrt(options, plugin, direct));
      },
      // The CPU plugin aliases dense, 64-byte-aligned sources with kImmutableZeroCopy.
      .can_alias_host_memory = true,
      .honours_num_devices_option = true,
      .honours_memory_limit_option = true,
      .honours_capabilities_option = true,
      .skipped_tests = {},
  };
  if (kPluginPathsUnderTsan && direct == false) {
    backend.skip_all =
        "skipped under ThreadSanitizer: these paths run inside the uninstrumented plugin (see "
        "pjrt_conformance.cc); the ASan and plain builds run them";
  }
  return backend;
}

[[maybe_unused]] const bool kPjrtRegistered =
    ferry::conformance::RegisterConformanceBackend(PjrtBackend("", std::nullopt, std::nullopt));
[[maybe_unused]] const bool kPjrtPluginPathsRegistered =
    ferry::conformance::RegisterConformanceBackend(
        PjrtBackend("plugin_paths", std::nullopt, false));
[[maybe_unused]] const bool kPjrtApi115Registered = ferry::conformance::RegisterConformanceBackend(
    PjrtBackend("api115", "lammps_jax_pjrt_cpu", false));

}  // namespace
