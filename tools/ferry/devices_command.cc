// `ferry devices`: a table of every device of every backend that can start here, laid out for the
// terminal (see text_layout.h): the dtype lists and descriptions wrap under their own column.
#include <unistd.h>

#include <memory>

#include "ferry/core/host_tensor.h"
#include "ferry/core/prefault.h"
#include "ferry/device/registry.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/commands.h"
#include "tools/ferry/text_layout.h"

namespace ferry::cli {
namespace {

// "<left><text wrapped to `width`, continuation lines indented to left's width>\n".
std::string HangingParagraph(const std::string& left, const std::string& text, int width) {
  const int indent = static_cast<int>(left.size());
  std::string out;
  const std::vector<std::string> lines = WrapText(text, width - indent, 0);
  for (size_t i = 0; i < lines.size(); ++i) {
    out += (i == 0 ? left : std::string(indent, ' ')) + lines[i] + "\n";
  }
  return out;
}

}  // namespace

CommandRunner AddDevicesCommand(CLI::App& app) {
  CLI::App* command =
      app.add_subcommand("devices", "List devices, their backends, memory and dtypes");
  return [command] {
    (void)command;
    const int width = OutputWidth(STDOUT_FILENO);
    const auto columns = [](std::string_view device, std::string_view backend,
                            std::string_view memory) {
      return fmt::format("{:<10} {:<8} {:>12}  ", device, backend, memory);
    };
    std::string out = columns("device", "backend", "memory") + "dtypes\n";
    // A plugin named with --pjrt-plugin that cannot start is an error, not a table row: the user
    // asked for it (a backend merely missing from the machine is a row).
    Status requested_plugin_failed;
    for (const std::string& backend : RegisteredBackends()) {
      auto client = CreateClient(backend, CommandClientOptions());
      if (!client.ok()) {
        if (backend == "pjrt" && CommandClientOptions().pjrt_plugin.has_value()) {
          requested_plugin_failed = client.status();
        }
        out += HangingParagraph(
            columns("-", backend, "-"),
            fmt::format("unavailable: {}", std::string(client.status().message())), width);
        continue;
      }
      for (Device* device : (*client)->devices()) {
        const auto& limit = device->capabilities().memory_limit_bytes;
        std::vector<std::string_view> dtypes;
        for (DType dtype : device->capabilities().HeldDTypes()) dtypes.push_back(DTypeName(dtype));
        out +=
            HangingParagraph(columns(device->name(), backend,
                                     limit ? FormatBytes(static_cast<double>(*limit)) : "host RAM"),
                             fmt::format("{}", fmt::join(dtypes, " ")), width);
        if (const std::string description = device->description(); !description.empty()) {
          out += HangingParagraph(std::string(11, ' '), description, width);
        }
      }
    }
    // Where transfers land in host memory (host devices, staging, the CPU plugins' views): whether
    // ferry asks for huge pages there, from the kernel's settings (ferry/core/host_tensor.h), and
    // whether it faults fresh pages in ahead (ferry/core/prefault.h).
    out += "\n" + HangingParagraph("host memory: ",
                                   fmt::format("huge pages {}; {}", HostHugePagePolicy().reason,
                                               PrefaultDescription()),
                                   width);
    fmt::print("{}", out);
    if (!requested_plugin_failed.ok()) {
      fmt::print(stderr, "ferry devices: --pjrt-plugin {}: {}\n",
                 *CommandClientOptions().pjrt_plugin,
                 std::string(requested_plugin_failed.message()));
      return kExitBadInput;
    }
    return kExitOk;
  };
}

}  // namespace ferry::cli
