// `ferry devices`: a table of every device of every backend that can start here.
#include <memory>

#include "ferry/device/registry.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/commands.h"

namespace ferry::cli {

CommandRunner AddDevicesCommand(CLI::App& app) {
  CLI::App* command =
      app.add_subcommand("devices", "List devices, their backends, memory and dtypes");
  return [command] {
    (void)command;
    fmt::print("{:<10} {:<8} {:>12}  {}\n", "device", "backend", "memory", "dtypes");
    for (const std::string& backend : RegisteredBackends()) {
      auto client = CreateClient(backend, CommandClientOptions());
      if (!client.ok()) {
        fmt::print("{:<10} {:<8} {:>12}  unavailable: {}\n", "-", backend, "-",
                   std::string(client.status().message()));
        continue;
      }
      for (Device* device : (*client)->devices()) {
        const auto& limit = device->capabilities().memory_limit_bytes;
        std::vector<std::string_view> dtypes;
        for (DType dtype : device->capabilities().HeldDTypes()) dtypes.push_back(DTypeName(dtype));
        fmt::print("{:<10} {:<8} {:>12}  {}\n", device->name(), backend,
                   limit ? FormatBytes(static_cast<double>(*limit)) : "host RAM",
                   fmt::join(dtypes, " "));
        if (const std::string description = device->description(); !description.empty()) {
          fmt::print("{:<10} {}\n", "", description);
        }
      }
    }
    return kExitOk;
  };
}

}  // namespace ferry::cli
