// The subcommands of the `ferry` command line. Each Add*Command registers its options on `app`
// and returns the function that runs it (returning an exit code, see cli_common.h).
#pragma once

#include <functional>

#include "CLI/CLI.hpp"

namespace ferry::cli {

using CommandRunner = std::function<int()>;

CommandRunner AddDevicesCommand(CLI::App& app);
CommandRunner AddPutCommand(CLI::App& app);
CommandRunner AddSampleCommand(CLI::App& app);

}  // namespace ferry::cli
