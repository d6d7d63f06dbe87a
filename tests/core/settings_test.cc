#include "ferry/core/settings.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ferry/core/convert.h"
#include "ferry/core/host_tensor.h"
#include "ferry/core/metrics.h"
#include "ferry/device/registry.h"
#include "ferry/distributed/process_group.h"
#include "fmt/format.h"

namespace ferry {
namespace {

using ::testing::HasSubstr;

// Sets (or unsets) an environment variable for one test, and puts back what was there.
class ScopedEnvironment {
 public:
  ScopedEnvironment(std::string name, std::optional<std::string> value) : name_(std::move(name)) {
    if (const char* old = std::getenv(name_.c_str()); old != nullptr) old_ = old;
    if (value.has_value()) {
      setenv(name_.c_str(), value->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ~ScopedEnvironment() {
    if (old_.has_value()) {
      setenv(name_.c_str(), old_->c_str(), 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// Every test starts and ends without overrides.
class SettingsTest : public ::testing::Test {
 protected:
  void SetUp() override { ClearAll(); }
  void TearDown() override { ClearAll(); }
  static void ClearAll() {
    for (const SettingInfo& setting : AllSettings()) ASSERT_TRUE(ClearSetting(setting.name).ok());
  }
};

std::string ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST_F(SettingsTest, table_is_sorted_unique_and_names_ferry_variables) {
  std::set<std::string_view> names;
  std::string_view previous;
  for (const SettingInfo& setting : AllSettings()) {
    EXPECT_THAT(std::string(setting.name), ::testing::StartsWith("FERRY_"));
    EXPECT_LT(previous, setting.name) << "the table must stay sorted by name";
    EXPECT_TRUE(names.insert(setting.name).second) << setting.name;
    EXPECT_FALSE(setting.value_kind.empty()) << setting.name;
    EXPECT_FALSE(setting.default_value.empty()) << setting.name;
    EXPECT_FALSE(setting.meaning.empty()) << setting.name;
    EXPECT_EQ(FindSetting(setting.name), &setting);
    previous = setting.name;
  }
  EXPECT_EQ(FindSetting("FERRY_NO_SUCH_SETTING"), nullptr);
}

// docs/settings.md's table is the code's table, row for row (the row a test would write is
// printed on failure, ready to paste).
TEST_F(SettingsTest, docs_table_equals_the_code_table) {
  const std::string doc = ReadFile(std::filesystem::path(FERRY_SOURCE_DIR) / "docs/settings.md");
  ASSERT_FALSE(doc.empty()) << "cannot read docs/settings.md";
  std::vector<std::string> doc_rows;
  std::istringstream lines(doc);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind("| `FERRY_", 0) == 0) doc_rows.push_back(line);
  }
  std::vector<std::string> code_rows;
  for (const SettingInfo& setting : AllSettings()) {
    std::string scope = "process";
    std::string from_code = "`SetSetting`";
    if (setting.scope == SettingScope::kClient) scope = "client";
    if (setting.scope == SettingScope::kPlugin) {
      scope = "plugin";
      from_code = "environment only";
    }
    if (!setting.client_option.empty()) from_code = fmt::format("`{}`", setting.client_option);
    code_rows.push_back(fmt::format("| `{}` | {} | {} | {} | {} | {} |", setting.name, scope,
                                    setting.value_kind, setting.default_value, from_code,
                                    setting.meaning));
  }
  EXPECT_EQ(doc_rows, code_rows);
}

// No source file but settings.cc reads a FERRY_ variable: the table is the whole story.
TEST_F(SettingsTest, only_settings_cc_reads_ferry_variables) {
  const std::filesystem::path root(FERRY_SOURCE_DIR);
  std::vector<std::string> readers;
  for (const char* folder : {"src", "tools", "bench", "include"}) {
    for (const auto& entry : std::filesystem::recursive_directory_iterator(root / folder)) {
      const std::string extension = entry.path().extension().string();
      if (extension != ".cc" && extension != ".h") continue;
      if (entry.path().filename() == "settings.cc") continue;
      const std::string text = ReadFile(entry.path());
      if (text.find("getenv(\"FERRY_") != std::string::npos ||
          text.find("getenv(\"FERRY") != std::string::npos) {
        readers.push_back(std::filesystem::relative(entry.path(), root).string());
      }
    }
  }
  EXPECT_THAT(readers, ::testing::IsEmpty());
}

struct BadValue {
  const char* name;
  const char* value;
  const char* expected;  // the whole message
};

// Each typed setting: SetSetting refuses a bad value with a message naming the variable, and the
// same value in the environment is reported by CheckSettings and the typed getter.
TEST_F(SettingsTest, bad_values_are_errors_that_name_the_variable) {
  const BadValue cases[] = {
      {"FERRY_HOST_MEMORY_CACHE_BYTES", "abc",
       R"(FERRY_HOST_MEMORY_CACHE_BYTES="abc": not a byte count (an integer >= 0))"},
      {"FERRY_HOST_MEMORY_CACHE_BYTES", "-1", nullptr},
      {"FERRY_HOST_MEMORY_CACHE_BYTES", "1.5", nullptr},
      {"FERRY_HOST_MEMORY_CACHE_BYTES", "99999999999999999999", nullptr},
      {"FERRY_HOST_MEMORY_CACHE_BYTES", "1GiB", nullptr},
      {"FERRY_HOST_MEMORY_LIMIT", "lots",
       R"(FERRY_HOST_MEMORY_LIMIT="lots": not a byte count (an integer >= 0))"},
      {"FERRY_HOST_MEMORY_LIMIT", "-5", nullptr},
      {"FERRY_HOST_DEVICES", "0",
       R"(FERRY_HOST_DEVICES="0": not a device count (an integer from 1 to 1024))"},
      {"FERRY_HOST_DEVICES", "1025", nullptr},
      {"FERRY_HOST_DEVICES", "two", nullptr},
      {"FERRY_DISTRIBUTED_TIMEOUT_S", "soon",
       R"(FERRY_DISTRIBUTED_TIMEOUT_S="soon": not a number of seconds (> 0))"},
      {"FERRY_DISTRIBUTED_TIMEOUT_S", "0", nullptr},
      {"FERRY_DISTRIBUTED_TIMEOUT_S", "-3", nullptr},
      {"FERRY_DISTRIBUTED_TIMEOUT_S", "inf", nullptr},
      {"FERRY_DISTRIBUTED_TIMEOUT_S", "nan", nullptr},
      {"FERRY_CONVERT_KERNELS", "sse4",
       R"(FERRY_CONVERT_KERNELS="sse4": not a kernel level (portable, avx2 or avx512))"},
      {"FERRY_CONVERT_KERNELS", "AVX2", nullptr},
      // Control characters are escaped in the message (surrounding whitespace is allowed).
      {"FERRY_HOST_DEVICES", "4\x01",
       R"(FERRY_HOST_DEVICES="4\x01": not a device count (an integer from 1 to 1024))"},
  };
  for (const BadValue& bad : cases) {
    SCOPED_TRACE(fmt::format("{}={}", bad.name, bad.value));
    const Status set = SetSetting(bad.name, bad.value);
    EXPECT_EQ(set.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(set.message()), HasSubstr(fmt::format("{}=\"", bad.name)));
    if (bad.expected != nullptr) {
      EXPECT_EQ(set.message(), bad.expected);
    }
    // Refused: no override was made.
    StatusOr<SettingValue> value = CurrentSettingValue(bad.name);
    ASSERT_TRUE(value.ok());
    EXPECT_NE(value->source, SettingSource::kOverride);

    ScopedEnvironment environment(bad.name, bad.value);
    const Status checked = CheckSettings();
    EXPECT_EQ(checked.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(checked.message(), set.message());
  }
  EXPECT_TRUE(CheckSettings().ok()) << CheckSettings();
  ASSERT_TRUE(SetSetting("FERRY_HOST_DEVICES", " 4\n").ok());
  EXPECT_EQ(settings::HostDevices().value(), 4);
}

TEST_F(SettingsTest, typed_getters_read_the_environment_and_return_the_errors) {
  {
    ScopedEnvironment environment("FERRY_HOST_MEMORY_CACHE_BYTES", "x1");
    EXPECT_THAT(std::string(settings::HostMemoryCacheBytes().status().message()),
                HasSubstr("FERRY_HOST_MEMORY_CACHE_BYTES=\"x1\""));
  }
  {
    ScopedEnvironment environment("FERRY_HOST_MEMORY_LIMIT", "-2");
    EXPECT_THAT(std::string(settings::HostMemoryLimit().status().message()),
                HasSubstr("FERRY_HOST_MEMORY_LIMIT=\"-2\""));
  }
  {
    ScopedEnvironment environment("FERRY_HOST_DEVICES", "2000");
    EXPECT_THAT(std::string(settings::HostDevices().status().message()),
                HasSubstr("FERRY_HOST_DEVICES=\"2000\""));
  }
  {
    ScopedEnvironment environment("FERRY_DISTRIBUTED_TIMEOUT_S", "never");
    EXPECT_THAT(std::string(settings::DistributedTimeoutSeconds().status().message()),
                HasSubstr("FERRY_DISTRIBUTED_TIMEOUT_S=\"never\""));
  }
  {
    ScopedEnvironment environment("FERRY_CONVERT_KERNELS", "neon");
    EXPECT_THAT(std::string(settings::ConvertKernels().status().message()),
                HasSubstr("FERRY_CONVERT_KERNELS=\"neon\""));
  }
  // Good values, and the defaults.
  ScopedEnvironment cache("FERRY_HOST_MEMORY_CACHE_BYTES", "4096");
  ScopedEnvironment limit("FERRY_HOST_MEMORY_LIMIT", std::nullopt);
  ScopedEnvironment devices("FERRY_HOST_DEVICES", " 3 ");
  ScopedEnvironment timeout("FERRY_DISTRIBUTED_TIMEOUT_S", "0.25");
  ScopedEnvironment kernels("FERRY_CONVERT_KERNELS", "portable");
  ScopedEnvironment opencl("FERRY_OPENCL_LIBRARY", "/opt/cl/libOpenCL.so");
  ScopedEnvironment plugin("FERRY_PJRT_PLUGIN", std::nullopt);
  ScopedEnvironment search("FERRY_PJRT_SEARCH_PATH", "/a::/b:");
  ScopedEnvironment wrapped("FERRY_PJRT_WRAPPED_PLUGIN", "");
  EXPECT_EQ(settings::HostMemoryCacheBytes().value(), 4096);
  EXPECT_EQ(settings::HostMemoryLimit().value(), std::nullopt);
  EXPECT_EQ(settings::HostDevices().value(), 3);
  EXPECT_DOUBLE_EQ(settings::DistributedTimeoutSeconds().value(), 0.25);
  EXPECT_DOUBLE_EQ(distributed::CollectiveTimeoutSeconds(), 0.25);
  EXPECT_EQ(settings::ConvertKernels().value(), ConvertKernelLevel::kPortable);
  EXPECT_EQ(settings::OpenClLibrary(), "/opt/cl/libOpenCL.so");
  EXPECT_EQ(settings::PjrtPlugin(), std::nullopt);
  EXPECT_THAT(settings::PjrtSearchPath(), ::testing::ElementsAre("/a", "/b"));
  EXPECT_EQ(settings::PjrtWrappedPlugin(), std::nullopt);  // empty is unset
  EXPECT_TRUE(CheckSettings().ok());
}

// Client option > SetSetting > environment > default.
TEST_F(SettingsTest, code_overrides_take_precedence_over_the_environment) {
  auto host_devices = [](const ClientOptions& options) -> StatusOr<size_t> {
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, CreateClient("host", options));
    return client->devices().size();
  };
  ScopedEnvironment environment("FERRY_HOST_DEVICES", "5");
  EXPECT_EQ(host_devices({}).value(), 5u);
  ASSERT_TRUE(SetSetting("FERRY_HOST_DEVICES", "2").ok());
  StatusOr<SettingValue> value = CurrentSettingValue("FERRY_HOST_DEVICES");
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(value->source, SettingSource::kOverride);
  EXPECT_EQ(value->text, "2");
  EXPECT_EQ(host_devices({}).value(), 2u);
  ClientOptions options;
  options.num_devices = 3;
  EXPECT_EQ(host_devices(options).value(), 3u);
  // An empty override hides the environment: the default.
  ASSERT_TRUE(SetSetting("FERRY_HOST_DEVICES", "").ok());
  EXPECT_EQ(host_devices({}).value(), 1u);
  ASSERT_TRUE(ClearSetting("FERRY_HOST_DEVICES").ok());
  EXPECT_EQ(host_devices({}).value(), 5u);
  value = CurrentSettingValue("FERRY_HOST_DEVICES");
  ASSERT_TRUE(value.ok());
  EXPECT_EQ(value->source, SettingSource::kEnvironment);

  // The memory limit: the override beats the environment; capabilities from code beat both.
  ScopedEnvironment limit("FERRY_HOST_MEMORY_LIMIT", "1000");
  ASSERT_TRUE(SetSetting("FERRY_HOST_MEMORY_LIMIT", "2000").ok());
  StatusOr<std::unique_ptr<Client>> client = CreateClient("host", {});
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->devices()[0]->capabilities().memory_limit_bytes, 2000);
  options.capabilities = DeviceCapabilities::All();
  options.capabilities->memory_limit_bytes = 3000;
  client = CreateClient("host", options);
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->devices()[0]->capabilities().memory_limit_bytes, 3000);

  // Plain strings too.
  ScopedEnvironment plugin("FERRY_PJRT_PLUGIN", "from_environment");
  ASSERT_TRUE(SetSetting("FERRY_PJRT_PLUGIN", "from_code").ok());
  EXPECT_EQ(settings::PjrtPlugin(), "from_code");
  ASSERT_TRUE(ClearSetting("FERRY_PJRT_PLUGIN").ok());
  EXPECT_EQ(settings::PjrtPlugin(), "from_environment");
}

// The OpenCL library: the client option beats SetSetting, which beats the environment (a library
// that does not exist makes the backend Unavailable, naming it).
TEST_F(SettingsTest, opencl_library_comes_from_the_option_then_the_setting) {
  ScopedEnvironment environment("FERRY_OPENCL_LIBRARY", "/no/such/environment/libOpenCL.so");
  auto opencl_error = [](const ClientOptions& options) {
    return std::string(CreateClient("opencl", options).status().message());
  };
  EXPECT_THAT(opencl_error({}), HasSubstr("/no/such/environment/libOpenCL.so"));
  ASSERT_TRUE(SetSetting("FERRY_OPENCL_LIBRARY", "/no/such/override/libOpenCL.so").ok());
  EXPECT_THAT(opencl_error({}), HasSubstr("/no/such/override/libOpenCL.so"));
  ClientOptions options;
  options.opencl_library = "/no/such/option/libOpenCL.so";
  EXPECT_THAT(opencl_error(options), HasSubstr("/no/such/option/libOpenCL.so"));
}

TEST_F(SettingsTest, unknown_names_and_plugin_settings_are_refused) {
  EXPECT_EQ(SetSetting("FERRY_HOST_DEVICE", "2").code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(SetSetting("FERRY_HOST_DEVICE", "2").message()),
              HasSubstr("FERRY_HOST_DEVICE"));
  EXPECT_EQ(ClearSetting("NOPE").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(CurrentSettingValue("NOPE").status().code(), absl::StatusCode::kNotFound);
  const Status plugin = SetSetting("FERRY_PJRT_WRAPPED_PLUGIN", "xla_cpu_pjrt");
  EXPECT_EQ(plugin.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(plugin.message()), HasSubstr("environment"));
}

// Any client creation reports a bad value of any setting, naming it.
TEST_F(SettingsTest, creating_a_client_reports_a_bad_environment_value) {
  for (const char* name : {"FERRY_HOST_MEMORY_CACHE_BYTES", "FERRY_CONVERT_KERNELS",
                           "FERRY_DISTRIBUTED_TIMEOUT_S", "FERRY_HOST_DEVICES"}) {
    ScopedEnvironment environment(name, "bad");
    StatusOr<std::unique_ptr<Client>> client = CreateClient("host");
    EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(client.status().message()), HasSubstr(fmt::format("{}=\"bad\"", name)));
  }
  EXPECT_TRUE(CreateClient("host").ok());
}

// The host memory cache follows FERRY_HOST_MEMORY_CACHE_BYTES while running, and the gauges
// follow the cache.
TEST_F(SettingsTest, host_memory_cache_limit_follows_the_setting_and_shows_in_the_metrics) {
  ASSERT_TRUE(SetSetting("FERRY_HOST_MEMORY_CACHE_BYTES", "8388608").ok());
  EXPECT_EQ(HostMemoryCacheLimitBytes(), 8388608);
  ReleaseCachedHostMemory();
  constexpr int64_t kBlock = (int64_t{5} << 20) + 4096;  // a size no other test uses
  std::byte* block = AllocateHostMemory(kBlock);
  ASSERT_NE(block, nullptr);
  FreeHostMemory(block, kBlock);
  EXPECT_EQ(CachedHostMemoryBytes(), kBlock);
  std::map<std::string, double> snapshot = MetricsSnapshot();
  EXPECT_EQ(snapshot["HostMemoryCacheBytes"], static_cast<double>(kBlock));
  EXPECT_EQ(snapshot["HostMemoryCacheLimitBytes"], 8388608.0);
  const std::string report = MetricsReport();
  EXPECT_THAT(report, HasSubstr("Gauge: HostMemoryCacheBytes\n  Value: 5.00MB\n"));
  EXPECT_THAT(report, HasSubstr("Gauge: HostMemoryCacheLimitBytes\n  Value: 8.00MB\n"));
  ResetMetrics();  // gauges are levels: kept
  EXPECT_EQ(MetricsSnapshot()["HostMemoryCacheBytes"], static_cast<double>(kBlock));

  // A smaller limit releases what no longer fits, at once.
  ASSERT_TRUE(SetSetting("FERRY_HOST_MEMORY_CACHE_BYTES", "1048576").ok());
  EXPECT_EQ(HostMemoryCacheLimitBytes(), 1048576);
  EXPECT_EQ(CachedHostMemoryBytes(), 0);
  snapshot = MetricsSnapshot();
  EXPECT_EQ(snapshot["HostMemoryCacheBytes"], 0.0);
  EXPECT_EQ(snapshot["HostMemoryCacheLimitBytes"], 1048576.0);
}

// A bad value in the environment is not replaced by the default: the cache keeps nothing and
// HostTensor::Allocate (and client creation) report it until it is fixed.
TEST_F(SettingsTest, bad_cache_size_in_the_environment_is_reported_by_allocations) {
  {
    ScopedEnvironment environment("FERRY_HOST_MEMORY_CACHE_BYTES", "1e9");
    ASSERT_TRUE(ClearSetting("FERRY_HOST_MEMORY_CACHE_BYTES").ok());  // read it again now
    StatusOr<HostTensor> tensor = HostTensor::Allocate(DType::kF32, {16});
    EXPECT_EQ(tensor.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(tensor.status().message(),
              R"(FERRY_HOST_MEMORY_CACHE_BYTES="1e9": not a byte count (an integer >= 0))");
    EXPECT_EQ(HostMemoryCacheLimitBytes(), 0);
    EXPECT_EQ(CreateClient("host").status().code(), absl::StatusCode::kInvalidArgument);
    // Code can fix it without touching the environment.
    ASSERT_TRUE(SetSetting("FERRY_HOST_MEMORY_CACHE_BYTES", "65536").ok());
    EXPECT_TRUE(HostTensor::Allocate(DType::kF32, {16}).ok());
    EXPECT_EQ(HostMemoryCacheLimitBytes(), 65536);
    ASSERT_TRUE(ClearSetting("FERRY_HOST_MEMORY_CACHE_BYTES").ok());
    EXPECT_FALSE(HostTensor::Allocate(DType::kF32, {16}).ok());
  }
  ASSERT_TRUE(ClearSetting("FERRY_HOST_MEMORY_CACHE_BYTES").ok());
  EXPECT_TRUE(HostTensor::Allocate(DType::kF32, {16}).ok());
}

// FERRY_CONVERT_KERNELS applies at once when set from code; a bad one in the environment is
// reported by every conversion until it is changed.
TEST_F(SettingsTest, convert_kernel_cap_follows_the_setting) {
  ScopedEnvironment environment("FERRY_CONVERT_KERNELS", std::nullopt);
  ASSERT_TRUE(ClearSetting("FERRY_CONVERT_KERNELS").ok());
  EXPECT_EQ(ActiveConvertKernelLevel().value(), BestConvertKernelLevel());
  ASSERT_TRUE(SetSetting("FERRY_CONVERT_KERNELS", "portable").ok());
  EXPECT_EQ(ActiveConvertKernelLevel().value(), ConvertKernelLevel::kPortable);
  ASSERT_TRUE(SetSetting("FERRY_CONVERT_KERNELS", "avx512").ok());
  EXPECT_EQ(ActiveConvertKernelLevel().value(), BestConvertKernelLevel());
  {
    ScopedEnvironment bad("FERRY_CONVERT_KERNELS", "fast");
    ASSERT_TRUE(ClearSetting("FERRY_CONVERT_KERNELS").ok());
    EXPECT_THAT(std::string(ActiveConvertKernelLevel().status().message()),
                HasSubstr("FERRY_CONVERT_KERNELS=\"fast\""));
    EXPECT_EQ(GetConvertKernel(DType::kF32, DType::kF16).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  ASSERT_TRUE(ClearSetting("FERRY_CONVERT_KERNELS").ok());
  EXPECT_EQ(ActiveConvertKernelLevel().value(), BestConvertKernelLevel());
}

}  // namespace
}  // namespace ferry
