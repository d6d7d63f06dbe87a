// The `ferry` command line: devices, put, sample, bench.
#include <cstdio>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
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
  CommandRunner devices = AddDevicesCommand(app);
  CommandRunner put = AddPutCommand(app);
  CommandRunner sample = AddSampleCommand(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help exits 0; every usage error exits kExitUsage.
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }
  if (app.got_subcommand("devices")) return devices();
  if (app.got_subcommand("put")) return put();
  if (app.got_subcommand("sample")) return sample();
  return kExitUsage;
}
