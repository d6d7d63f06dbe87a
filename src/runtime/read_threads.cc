#include "src/runtime/read_threads.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

namespace ferry {

int LoadReadThreadsFor(int cores, int other_runnable) {
  cores = std::max(cores, 1);
  if (other_runnable <= 0) return cores;
  return std::min(4 * cores, cores + 3 * other_runnable);
}

std::optional<int> RunnableThreadsIn(std::string_view loadavg) {
  // Three load averages, then "running/total".
  size_t field_start = 0;
  for (int field = 0; field < 3; ++field) {
    field_start = loadavg.find(' ', field_start);
    if (field_start == std::string_view::npos) return std::nullopt;
    field_start = loadavg.find_first_not_of(' ', field_start);
    if (field_start == std::string_view::npos) return std::nullopt;
  }
  const std::string_view rest = loadavg.substr(field_start);
  int runnable = 0;
  const auto [end, error] = std::from_chars(rest.data(), rest.data() + rest.size(), runnable);
  if (error != std::errc() || end == rest.data() || end == rest.data() + rest.size() ||
      *end != '/' || runnable < 0) {
    return std::nullopt;
  }
  return runnable;
}

int OtherRunnableThreadsNow() {
  std::optional<int> least;
  for (int reading = 0; reading < 3; ++reading) {
    std::ifstream file("/proc/loadavg");
    const std::string text((std::istreambuf_iterator<char>(file)),
                           std::istreambuf_iterator<char>());
    const std::optional<int> runnable = RunnableThreadsIn(text);
    if (!runnable.has_value()) return 0;
    least = std::min(least.value_or(*runnable), *runnable);
  }
  return std::max(*least - 1, 0);  // this thread is running: it is one of them
}

int DefaultLoadReadThreads() {
  cpu_set_t allowed;
  int cores = 0;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) cores = CPU_COUNT(&allowed);
  if (cores <= 0) cores = static_cast<int>(std::thread::hardware_concurrency());
  return LoadReadThreadsFor(cores, OtherRunnableThreadsNow());
}

}  // namespace ferry
