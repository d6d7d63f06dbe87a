// The `ferry` command line: devices, put, sample, bench.
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "fmt/format.h"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/commands.h"

namespace ferry::bench {
int Main(int argc, char** argv);  // bench/ferry_bench.cc
}

int main(int argc, char** argv) {
  using namespace ferry::cli;
  // `ferry bench ...` is ferry-bench itself: the same cases, flags and JSON.
  if (argc >= 2 && std::string(argv[1]) == "bench") {
    std::vector<char*> bench_argv = {argv[0]};
    for (int i = 2; i < argc; ++i) bench_argv.push_back(argv[i]);
    return ferry::bench::Main(static_cast<int>(bench_argv.size()), bench_argv.data());
  }
  CLI::App app{"ferry: move tensors between host memory and devices directly"};
  app.require_subcommand(1);
  app.footer(
      "Also: ferry bench [--case NAME] [--size SCALE] [--json FILE] (see ferry bench --help)");
  // Options of the clients every command creates (the pjrt backend's plugin and its options);
  // accepted before or after the subcommand.
  app.fallthrough();
  std::string pjrt_plugin;
  std::vector<std::string> plugin_options;
  app.add_option("--pjrt-plugin", pjrt_plugin,
                 "PJRT plugin for pjrt:N devices: a .so path or an installed package name "
                 "(default: FERRY_PJRT_PLUGIN, else the first installed plugin)");
  app.add_option("--plugin-option", plugin_options,
                 "A PJRT client option NAME=VALUE, e.g. cpu_device_count=4 (repeatable)");
  CommandRunner devices = AddDevicesCommand(app);
  CommandRunner put = AddPutCommand(app);
  CommandRunner sample = AddSampleCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help exits 0; every usage error exits kExitUsage.
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }
  if (!pjrt_plugin.empty()) CommandClientOptions().pjrt_plugin = pjrt_plugin;
  for (const std::string& option : plugin_options) {
    if (ferry::Status status = AddPluginOption(option); !status.ok()) {
      fmt::print(stderr, "ferry: {}\n", std::string(status.message()));
      return kExitUsage;
    }
  }
  if (app.got_subcommand("devices")) return devices();
  if (app.got_subcommand("put")) return put();
  if (app.got_subcommand("sample")) return sample();
  return kExitUsage;
}
