#include "ferry/core/settings.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ferry/core/mutex.h"
#include "fmt/format.h"
#include "src/core/fork_locks.h"
#include "src/core/host_memory_cache.h"

namespace ferry {
namespace {

// GCC says __SANITIZE_ADDRESS__, clang __has_feature(address_sanitizer).
#if defined(__SANITIZE_ADDRESS__)
#define FERRY_SETTINGS_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FERRY_SETTINGS_ASAN 1
#endif
#endif
#if defined(FERRY_SETTINGS_ASAN)
// Off under AddressSanitizer, so that a use after free of a cached block stays detectable.
constexpr int64_t kDefaultHostMemoryCacheBytes = 0;
#else
constexpr int64_t kDefaultHostMemoryCacheBytes = int64_t{1} << 30;
#endif
constexpr int kDefaultHostDevices = 1;
constexpr int kMaxHostDevices = 1024;
constexpr double kDefaultDistributedTimeoutSeconds = 300;

constexpr std::string_view kByteCount = "a byte count (an integer >= 0)";
constexpr std::string_view kDeviceCount = "a device count (an integer from 1 to 1024)";
constexpr std::string_view kSeconds = "a number of seconds (> 0)";
constexpr std::string_view kKernelLevel = "a kernel level (portable, avx2 or avx512)";
constexpr std::string_view kPath = "a path or a Python package name";
constexpr std::string_view kPathList = "a ':'-separated list of folders";
constexpr std::string_view kLibrary = "a shared library's name or path";
constexpr std::string_view kHugePagesChoice = "auto, on or off";
constexpr std::string_view kOnOff = "on or off";
constexpr std::string_view kThreadCount = "a thread count (an integer from 1 to 1024)";
constexpr std::string_view kReadSize = "a read size (an integer from 4096 to 1073741824 bytes)";
constexpr int64_t kDefaultLoadWindowBytes = int64_t{256} << 20;
constexpr int64_t kDefaultLoadReadBytes = int64_t{8} << 20;

// Sorted by name (AllSettings promises it; a test checks it).
constexpr SettingInfo kSettings[] = {
    {"FERRY_CONVERT_KERNELS", SettingScope::kProcess, kKernelLevel, "none (the best the CPU has)",
     "",
     "Caps the conversion kernels at this instruction set level (a level the CPU lacks is never "
     "used)."},
    {"FERRY_DISTRIBUTED_TIMEOUT_S", SettingScope::kProcess, kSeconds, "300", "",
     "Seconds a collective call waits for the other processes before it fails (a dead peer on "
     "this machine is found within about 0.1 s whatever this is)."},
    {"FERRY_HOST_DEVICES", SettingScope::kClient, kDeviceCount, "1", "ClientOptions::num_devices",
     "How many devices the host backend presents."},
    {"FERRY_HOST_HUGE_PAGES", SettingScope::kProcess, kHugePagesChoice, "auto", "",
     "Whether host allocations of 2 MiB or more ask the kernel for transparent huge pages "
     "(MADV_HUGEPAGE). auto: only where the kernel's THP defrag setting (defer or never) cannot "
     "stall a page fault in memory compaction, which turns a load on a busy machine into seconds; "
     "on: always; off: never (MADV_NOHUGEPAGE: none even where THP is always on). `ferry devices` "
     "says what auto chose and why."},
    {"FERRY_HOST_MEMORY_CACHE_BYTES", SettingScope::kProcess, kByteCount,
     "1073741824 (1 GiB); 0 in AddressSanitizer builds", "",
     "The most bytes of freed host memory kept for reuse by later allocations of the same size "
     "(0 turns the cache off). The metrics HostMemoryCacheBytes and HostMemoryCacheLimitBytes "
     "show what it holds and this limit."},
    {"FERRY_HOST_MEMORY_LIMIT", SettingScope::kClient, kByteCount, "none",
     "ClientOptions::capabilities (memory_limit_bytes)",
     "Each host device's memory limit in bytes (a transfer beyond it is ResourceExhausted)."},
    {"FERRY_HOST_PREFAULT", SettingScope::kProcess, kOnOff, "on", "",
     "Whether ferry's large writes into host-addressed memory (the transfer engine's copies into "
     "a dense destination, a load's reads into device memory) first fault in, with "
     "MADV_POPULATE_WRITE (Linux 5.14 on), each MiB of the destination that holds pages not yet "
     "resident: one system call instead of a page fault per 4 KiB page. A copy into fresh memory "
     "gets faster (a load into fresh memory about 1.2-1.4x here); memory written before is only "
     "checked (mincore). The metric HostBytesPrefaulted counts the bytes faulted in. off: never."},
    {"FERRY_LOAD_READ_BYTES", SettingScope::kProcess, kReadSize, "8388608 (8 MiB)", "",
     "The size of each read a load makes from a file straight into device memory (`ferry put`, "
     "`load_file(path, device)` on host devices: pread); a large tensor is read in pieces of "
     "this size, FERRY_LOAD_READ_THREADS of them at once."},
    {"FERRY_LOAD_READ_THREADS", SettingScope::kProcess, kThreadCount,
     "none: one per core, more while other work keeps the cores busy", "",
     "How many reads of a file being loaded are in flight at once (`ferry put`, "
     "`load_file(path, device)`): the threads that read tensors straight into host-writable "
     "device memory (pread) and those that fault in the next window of the mapped file; a cold "
     "file on a fast disk needs several to reach its bandwidth. Unset, a load takes one per core "
     "when nothing else is runnable, and three more for each thread of other work runnable when "
     "it starts (/proc/loadavg), at most four per core: the scheduler shares the cores among "
     "runnable threads, so a busy machine would otherwise give the load a fraction of them."},
    {"FERRY_LOAD_WINDOW_BYTES", SettingScope::kProcess, kByteCount, "268435456 (256 MiB)", "",
     "How many bytes of a file a load puts at a time (`ferry put`, `load_file(path, device)`, "
     "`ferry.jax.load_file`) before it gives their mapped pages back; the load holds about two "
     "windows of the file beside the device copy. 0: the whole file at once (its pages are kept "
     "until the load ends)."},
    {"FERRY_OPENCL_LIBRARY", SettingScope::kClient, kLibrary, "libOpenCL.so.1 (the ICD loader)",
     "ClientOptions::opencl_library", "The OpenCL library the opencl backend opens."},
    {"FERRY_PJRT_PLUGIN", SettingScope::kClient, kPath,
     "none: the first plugin found in the search path", "ClientOptions::pjrt_plugin",
     "The PJRT plugin the pjrt backend opens: a path to its shared library, or the name of an "
     "installed Python package that ships one (xla_cpu_pjrt)."},
    {"FERRY_PJRT_SEARCH_PATH", SettingScope::kProcess, kPathList,
     "none (the Python package sets it "
     "from sys.path)",
     "",
     "Folders where Python packages are installed, searched for PJRT plugins before PYTHONPATH, "
     "$VIRTUAL_ENV's site-packages and the site-packages ferry was built against."},
    {"FERRY_PJRT_WRAPPED_PLUGIN", SettingScope::kPlugin, kPath,
     "none: the plugin FERRY_PJRT_PLUGIN or the search would pick", "",
     "The PJRT plugin that ferry_pjrt_plugin.so (ferry's plugin for JAX) wraps."},
};

// The value as an error message shows it: quoted, with control characters escaped.
std::string Quoted(std::string_view text) {
  return absl::CHexEscape(absl::string_view(text.data(), text.size()));
}

Status UnknownSetting(std::string_view name) {
  return absl::NotFoundError(
      fmt::format("'{}' is not a ferry setting (docs/settings.md lists them)", Quoted(name)));
}

Status BadValue(std::string_view name, std::string_view text, std::string_view kind) {
  return InvalidArgumentError(fmt::format("{}=\"{}\": not {}", name, Quoted(text), kind));
}

StatusOr<int64_t> ParseByteCount(std::string_view name, std::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::string_view(text.data(), text.size()), &value) || value < 0)
    return BadValue(name, text, kByteCount);
  return value;
}

StatusOr<int64_t> ParseReadSize(std::string_view name, std::string_view text) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(absl::string_view(text.data(), text.size()), &value) || value < 4096 ||
      value > (int64_t{1} << 30)) {
    return BadValue(name, text, kReadSize);
  }
  return value;
}

StatusOr<int> ParseDeviceCount(std::string_view name, std::string_view text) {
  int value = 0;
  if (!absl::SimpleAtoi(absl::string_view(text.data(), text.size()), &value) || value < 1 ||
      value > kMaxHostDevices) {
    return BadValue(name, text, kDeviceCount);
  }
  return value;
}

StatusOr<int> ParseThreadCount(std::string_view name, std::string_view text) {
  int value = 0;
  if (!absl::SimpleAtoi(absl::string_view(text.data(), text.size()), &value) || value < 1 ||
      value > 1024) {
    return BadValue(name, text, kThreadCount);
  }
  return value;
}

StatusOr<double> ParseSeconds(std::string_view name, std::string_view text) {
  double value = 0;
  if (!absl::SimpleAtod(absl::string_view(text.data(), text.size()), &value) ||
      !std::isfinite(value) || value <= 0) {
    return BadValue(name, text, kSeconds);
  }
  return value;
}

StatusOr<settings::HugePagesSetting> ParseHugePages(std::string_view name, std::string_view text) {
  if (text == "auto") return settings::HugePagesSetting::kAuto;
  if (text == "on") return settings::HugePagesSetting::kOn;
  if (text == "off") return settings::HugePagesSetting::kOff;
  return BadValue(name, text, kHugePagesChoice);
}

StatusOr<bool> ParseOnOff(std::string_view name, std::string_view text) {
  if (text == "on") return true;
  if (text == "off") return false;
  return BadValue(name, text, kOnOff);
}

StatusOr<ConvertKernelLevel> ParseKernelLevel(std::string_view name, std::string_view text) {
  StatusOr<ConvertKernelLevel> level = ConvertKernelLevelFromName(text);
  if (!level.ok()) return BadValue(name, text, kKernelLevel);
  return level;
}

// Checks `text` as a value of the setting `name` (any text is a path).
Status Validate(std::string_view name, std::string_view text) {
  if (name == "FERRY_HOST_MEMORY_CACHE_BYTES" || name == "FERRY_HOST_MEMORY_LIMIT") {
    return ParseByteCount(name, text).status();
  }
  if (name == "FERRY_HOST_DEVICES") return ParseDeviceCount(name, text).status();
  if (name == "FERRY_LOAD_READ_THREADS") return ParseThreadCount(name, text).status();
  if (name == "FERRY_LOAD_READ_BYTES") return ParseReadSize(name, text).status();
  if (name == "FERRY_LOAD_WINDOW_BYTES") return ParseByteCount(name, text).status();
  if (name == "FERRY_DISTRIBUTED_TIMEOUT_S") return ParseSeconds(name, text).status();
  if (name == "FERRY_CONVERT_KERNELS") return ParseKernelLevel(name, text).status();
  if (name == "FERRY_HOST_HUGE_PAGES") return ParseHugePages(name, text).status();
  if (name == "FERRY_HOST_PREFAULT") return ParseOnOff(name, text).status();
  return OkStatus();
}

struct Overrides {
  Mutex mutex;
  std::map<std::string, std::string, std::less<>> values ABSL_GUARDED_BY(mutex);
};

// Never destroyed: settings may be read while static destructors run.
Overrides& GetOverrides() {
  static auto* const overrides = [] {
    auto* created = new Overrides();
    internal::RegisterForkLock(internal::ForkLockRank::kSettings, created->mutex);
    return created;
  }();
  return *overrides;
}

std::atomic<uint64_t> generation{0};

// The value of a setting known to be in the table: the override, else the environment; an empty
// value is unset.
SettingValue ValueOf(std::string_view name) {
  SettingValue value;
  {
    Overrides& overrides = GetOverrides();
    MutexLock lock(overrides.mutex);
    if (auto it = overrides.values.find(name); it != overrides.values.end()) {
      value.source = SettingSource::kOverride;
      if (!it->second.empty()) value.text = it->second;
      return value;
    }
  }
  const std::string variable(name);
  if (const char* env = std::getenv(variable.c_str()); env != nullptr && *env != '\0') {
    value.source = SettingSource::kEnvironment;
    value.text = env;
  }
  return value;
}

// The settings whose owner keeps a value read earlier and must take a change at once, not at its
// next read (the others are read where they are used, or check SettingsGeneration()).
void ApplyNow(std::string_view name) {
  if (name == "FERRY_HOST_MEMORY_CACHE_BYTES") internal::ApplyHostMemoryCacheSetting();
}

}  // namespace

absl::Span<const SettingInfo> AllSettings() { return kSettings; }

const SettingInfo* FindSetting(std::string_view name) {
  for (const SettingInfo& setting : kSettings) {
    if (setting.name == name) return &setting;
  }
  return nullptr;
}

Status SetSetting(std::string_view name, std::string_view value) {
  if (FindSetting(name) == nullptr) {
    return UnknownSetting(name);
  }
  if (FindSetting(name)->scope == SettingScope::kPlugin) {
    return FailedPreconditionError(fmt::format(
        "{} is read by ferry_pjrt_plugin.so from the environment only, when a framework "
        "loads it: set it in the environment before the plugin is loaded",
        name));
  }
  if (!value.empty()) FERRY_RETURN_IF_ERROR(Validate(name, value));
  {
    Overrides& overrides = GetOverrides();
    MutexLock lock(overrides.mutex);
    overrides.values.insert_or_assign(std::string(name), std::string(value));
    generation.fetch_add(1, std::memory_order_acq_rel);
  }
  ApplyNow(name);
  return OkStatus();
}

Status ClearSetting(std::string_view name) {
  if (FindSetting(name) == nullptr) {
    return UnknownSetting(name);
  }
  {
    Overrides& overrides = GetOverrides();
    MutexLock lock(overrides.mutex);
    if (auto it = overrides.values.find(name); it != overrides.values.end()) {
      overrides.values.erase(it);
    }
    generation.fetch_add(1, std::memory_order_acq_rel);
  }
  ApplyNow(name);
  return OkStatus();
}

StatusOr<SettingValue> CurrentSettingValue(std::string_view name) {
  if (FindSetting(name) == nullptr) {
    return UnknownSetting(name);
  }
  return ValueOf(name);
}

Status CheckSettings() {
  for (const SettingInfo& setting : kSettings) {
    const SettingValue value = ValueOf(setting.name);
    if (value.text.has_value()) FERRY_RETURN_IF_ERROR(Validate(setting.name, *value.text));
  }
  return OkStatus();
}

uint64_t SettingsGeneration() { return generation.load(std::memory_order_acquire); }

namespace settings {

StatusOr<int64_t> HostMemoryCacheBytes() {
  constexpr std::string_view kName = "FERRY_HOST_MEMORY_CACHE_BYTES";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return kDefaultHostMemoryCacheBytes;
  return ParseByteCount(kName, *value.text);
}

StatusOr<std::optional<ConvertKernelLevel>> ConvertKernels() {
  constexpr std::string_view kName = "FERRY_CONVERT_KERNELS";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return std::optional<ConvertKernelLevel>();
  FERRY_ASSIGN_OR_RETURN(const ConvertKernelLevel level, ParseKernelLevel(kName, *value.text));
  return std::optional<ConvertKernelLevel>(level);
}

StatusOr<int> HostDevices() {
  constexpr std::string_view kName = "FERRY_HOST_DEVICES";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return kDefaultHostDevices;
  return ParseDeviceCount(kName, *value.text);
}

StatusOr<HugePagesSetting> HostHugePages() {
  constexpr std::string_view kName = "FERRY_HOST_HUGE_PAGES";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return HugePagesSetting::kAuto;
  return ParseHugePages(kName, *value.text);
}

StatusOr<bool> HostPrefault() {
  constexpr std::string_view kName = "FERRY_HOST_PREFAULT";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return true;
  return ParseOnOff(kName, *value.text);
}

StatusOr<std::optional<int64_t>> HostMemoryLimit() {
  constexpr std::string_view kName = "FERRY_HOST_MEMORY_LIMIT";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return std::optional<int64_t>();
  FERRY_ASSIGN_OR_RETURN(const int64_t limit, ParseByteCount(kName, *value.text));
  return std::optional<int64_t>(limit);
}

StatusOr<int64_t> LoadReadBytes() {
  constexpr std::string_view kName = "FERRY_LOAD_READ_BYTES";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return kDefaultLoadReadBytes;
  return ParseReadSize(kName, *value.text);
}

StatusOr<std::optional<int>> LoadReadThreads() {
  constexpr std::string_view kName = "FERRY_LOAD_READ_THREADS";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return std::optional<int>();
  FERRY_ASSIGN_OR_RETURN(const int threads, ParseThreadCount(kName, *value.text));
  return std::optional<int>(threads);
}

StatusOr<int64_t> LoadWindowBytes() {
  constexpr std::string_view kName = "FERRY_LOAD_WINDOW_BYTES";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return kDefaultLoadWindowBytes;
  return ParseByteCount(kName, *value.text);
}

std::optional<std::string> OpenClLibrary() { return ValueOf("FERRY_OPENCL_LIBRARY").text; }

std::optional<std::string> PjrtPlugin() { return ValueOf("FERRY_PJRT_PLUGIN").text; }

std::vector<std::string> PjrtSearchPath() {
  std::vector<std::string> folders;
  const std::optional<std::string> text = ValueOf("FERRY_PJRT_SEARCH_PATH").text;
  if (!text.has_value()) return folders;
  for (absl::string_view folder : absl::StrSplit(*text, ':', absl::SkipEmpty())) {
    folders.emplace_back(folder);
  }
  return folders;
}

std::optional<std::string> PjrtWrappedPlugin() { return ValueOf("FERRY_PJRT_WRAPPED_PLUGIN").text; }

StatusOr<double> DistributedTimeoutSeconds() {
  constexpr std::string_view kName = "FERRY_DISTRIBUTED_TIMEOUT_S";
  const SettingValue value = ValueOf(kName);
  if (!value.text.has_value()) return kDefaultDistributedTimeoutSeconds;
  return ParseSeconds(kName, *value.text);
}

}  // namespace settings
}  // namespace ferry
