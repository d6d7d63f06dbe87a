// Runs the device-API conformance suite on the pjrt backend, three ways:
// - "pjrt": the plugin found as a user's program finds it (FERRY_PJRT_PLUGIN, else the first
//   installed one: here the XLA CPU plugin, API 0.81), with every path ferry picks for it (on
//   the CPU plugin: direct writes into ferry's memory, handed to the plugin as views);
// - "pjrt_plugin_paths": the same plugin with direct host access turned off, so every transfer
//   goes through the plugin's own entries as it would on a GPU (BufferFromHostBuffer with byte
//   strides, the transfer manager fed from staging chunks, partial reads);
// - "pjrt_api115": the same plugin built at API 0.115 (lammps-jax-pjrt-cpu), through its own
//   entries too: ferry's 0.81 header driving a newer plugin;
// - "pjrt_layout_aware": the plugin's own entries, with ferry told not to rely on row-major device
//   layouts (ClientOptions::pjrt_row_major_layouts = false), as on a TPU's tiled ones: every read
//   through ToHostBuffer with a row-major host layout (strided and converting ones through a dense
//   temporary), every converting put through a converted dense temporary, never an access at a
//   byte offset.
// Where no plugin is installed, the factory returns Unavailable and every test skips with that
// reason (fails, in CI: tests/required_backends.h).
#include <map>
#include <string>

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
                              std::optional<bool> direct, std::optional<bool> row_major) {
  if (plugin.has_value()) options.pjrt_plugin = plugin;
  options.pjrt_direct_host_access = direct;
  options.pjrt_row_major_layouts = row_major;
  return options;
}

// Create-then-fill writes each piece at its byte offset in the row-major array: refused, with the
// reason, where the device layout may be another.
std::map<std::string, std::string> WriterTestsWithoutRowMajorLayouts() {
  const std::string reason =
      "create-then-fill writes at byte offsets of a row-major array: the pjrt backend refuses it "
      "(Unimplemented) where it may not rely on row-major device layouts";
  std::map<std::string, std::string> skipped;
  for (const char* test :
       {"PiecesInAnyOrderFillTheBufferExactly", "InPlaceRangesFillTheBufferWhereTheHostCanWriteIt",
        "BadWritesAreRefusedAndLeaveTheFillGoing", "AnUnfinishedFillFailsTheBufferInsteadOfHanging",
        "ContinuationsOnReadyMayCallBackIntoTheWriter", "AnEmptyBufferIsReadyAtOnce",
        "ReadsOfABufferStillBeingFilledReturnAtOnce"}) {
    skipped[std::string("ConformanceWriter.") + test] = reason;
  }
  // Its original is a buffer still being filled: made by create-then-fill.
  skipped["ConformancePartial.CopyToDeviceNeverWaitsForTheOriginal"] = reason;
  return skipped;
}

// The CPU plugins accept cpu_device_count, so several devices may be asked for; the memory limit
// and the dtype profile are ferry's own accounting, honoured on every plugin.
ferry::conformance::ConformanceBackend PjrtBackend(std::string variant,
                                                   std::optional<std::string> plugin,
                                                   std::optional<bool> direct,
                                                   std::optional<bool> row_major = std::nullopt) {
  ferry::conformance::ConformanceBackend backend{
      .name = "pjrt",
      .variant = std::move(variant),
      .make_client = [plugin, direct, row_major](const ferry::ClientOptions& options)
          -> ferry::StatusOr<std::unique_ptr<ferry::Client>> {
        return ferry::CreateClient("pjrt", WithPjrt(options, plugin, direct, row_major));
      },
      // The CPU plugin aliases dense, 64-byte-aligned sources with kImmutableZeroCopy (where
      // ferry may rely on its row-major layouts: it tells an alias by the buffer's address).
      .can_alias_host_memory = row_major != false,
      .honours_num_devices_option = true,
      .honours_memory_limit_option = true,
      .honours_capabilities_option = true,
      .skipped_tests = row_major == false ? WriterTestsWithoutRowMajorLayouts()
                                          : std::map<std::string, std::string>{},
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
[[maybe_unused]] const bool kPjrtLayoutAwareRegistered =
    ferry::conformance::RegisterConformanceBackend(
        PjrtBackend("layout_aware", std::nullopt, false, false));

}  // namespace
