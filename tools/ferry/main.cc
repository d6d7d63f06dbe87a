// The `ferry` command line: devices, put, sample, bench.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "CLI/CLI.hpp"
#include "ferry/core/settings.h"
#include "ferry/version.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "tools/ferry/cli_common.h"
#include "tools/ferry/commands.h"
#include "tools/ferry/text_layout.h"

namespace {

// The first word of the command line that is neither an option nor an option's value: the
// subcommand the user asked for (empty when there is none). `options_with_values` are the global
// options that take a value as the next word.
std::string RequestedCommand(int argc, char** argv,
                             const std::vector<std::string>& options_with_values) {
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] != '-') return word;
    if (std::find(options_with_values.begin(), options_with_values.end(), word) !=
        options_with_values.end()) {
      ++i;  // its value
    }
  }
  return "";
}

// ferry-bench in this program's own folder (where a build from the source tree puts it; a pip
// install builds no benchmark).
std::filesystem::path BenchProgramPath(const char* argv0) {
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  return (error ? std::filesystem::path(argv0) : self).parent_path() / "ferry-bench";
}

constexpr std::string_view kNoBenchHint =
    "this install has no benchmark (pip builds none): build ferry from its source tree "
    "(scripts/build.sh plain) and run build/plain/ferry bench";

// Replaces this process with ferry-bench from this program's own folder (argv[2...] passed on);
// returns an exit code only when it cannot.
int RunBenchProgram(int argc, char** argv) {
  const std::filesystem::path bench = BenchProgramPath(argv[0]);
  std::error_code error;
  if (!std::filesystem::exists(bench, error)) {
    fmt::print(stderr, "ferry bench: {}\n", kNoBenchHint);
    return ferry::cli::kExitBadInput;
  }
  std::vector<std::string> arguments = {bench.string()};
  for (int i = 2; i < argc; ++i) arguments.emplace_back(argv[i]);
  std::vector<char*> bench_argv;
  for (std::string& argument : arguments) bench_argv.push_back(argument.data());
  bench_argv.push_back(nullptr);
  ::execv(bench.c_str(), bench_argv.data());
  fmt::print(stderr,
             "ferry bench: cannot run {}: {} (ferry bench needs ferry-bench next to ferry)\n",
             bench.string(), std::strerror(errno));
  return ferry::cli::kExitBadInput;
}

}  // namespace

// `exit_code`, unless what the command printed on stdout could not all be written (stdout closed,
// a full disk behind a redirect): then the command did not do what it was asked, and it says so on
// stderr and exits kExitBadInput instead of 0 with its report lost.
int WithOutputWritten(std::string_view command, int exit_code) {
  const bool flush_failed = std::fflush(stdout) != 0;
  const int flush_error = errno;
  if (!flush_failed && std::ferror(stdout) == 0) return exit_code;
  // Said as every command's errors are (wrapped on a terminal).
  const int reported = ferry::cli::ReportError(
      command, ferry::UnavailableError(fmt::format(
                   "its output could not be written to stdout{}",
                   flush_failed ? fmt::format(" ({})", std::strerror(flush_error)) : "")));
  return exit_code == ferry::cli::kExitOk ? reported : exit_code;
}

int main(int argc, char** argv) {
  using namespace ferry::cli;
  // `ferry bench ...` runs ferry-bench (the same cases, flags and JSON), the program installed
  // next to this one: the command line does not link the benchmark.
  if (argc >= 2 && std::string(argv[1]) == "bench") return RunBenchProgram(argc, argv);
  CLI::App app{"ferry: move tensors between host memory and devices directly"};
  // Help that fits the terminal; subcommands added below inherit it.
  app.formatter(std::make_shared<WrappingHelpFormatter>());
  app.set_version_flag("--version", fmt::format("ferry {}", ferry::kVersion));
  app.require_subcommand(1);
  std::error_code no_bench;
  app.footer(std::filesystem::exists(BenchProgramPath(argv[0]), no_bench)
                 ? "Also: ferry bench [--case NAME] [--size SCALE] [--json FILE] (see ferry "
                   "bench --help)"
                 : fmt::format("Also: ferry bench, the benchmark; {}", kNoBenchHint));
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
  // A mistyped command is named, with the ones that exist (CLI11 would only say that an argument
  // was not expected).
  const std::vector<std::string> kCommands = {"devices", "put", "sample", "bench"};
  if (const std::string command =
          RequestedCommand(argc, argv, {"--pjrt-plugin", "--plugin-option"});
      !command.empty() &&
      std::find(kCommands.begin(), kCommands.end(), command) == kCommands.end()) {
    fmt::print(stderr, "ferry: unknown command '{}' (commands: {}; see ferry --help)\n", command,
               fmt::join(kCommands, ", "));
    return kExitUsage;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    // --help exits 0; every usage error exits kExitUsage.
    return app.exit(error) == 0 ? kExitOk : kExitUsage;
  }
  // A bad value of a setting (docs/settings.md) is named before any command starts.
  if (ferry::Status status = ferry::CheckSettings(); !status.ok()) {
    fmt::print(stderr, "ferry: {}\n", std::string(status.message()));
    return kExitBadInput;
  }
  if (!pjrt_plugin.empty()) CommandClientOptions().pjrt_plugin = pjrt_plugin;
  for (const std::string& option : plugin_options) {
    if (ferry::Status status = AddPluginOption(option); !status.ok()) {
      fmt::print(stderr, "ferry: {}\n", std::string(status.message()));
      return kExitUsage;
    }
  }
  if (app.got_subcommand("devices")) return WithOutputWritten("devices", devices());
  if (app.got_subcommand("put")) return WithOutputWritten("put", put());
  if (app.got_subcommand("sample")) return WithOutputWritten("sample", sample());
  return kExitUsage;
}
