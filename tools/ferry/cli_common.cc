#include "tools/ferry/cli_common.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/str_split.h"
#include "ferry/device/registry.h"
#include "ferry/io/tensor_file.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/io/utf8.h"
#include "tools/ferry/text_layout.h"

namespace ferry::cli {

int ReportError(std::string_view command, const Status& status) {
  const std::string line =
      fmt::format("ferry {}: error: {}", command, std::string(status.message()));
  // On a terminal each line of the message wraps to its width; into a pipe or a file it keeps
  // its own lines (one, unless the message is laid out in lines), for the programs that read it.
  if (isatty(STDERR_FILENO) != 1) {
    fmt::print(stderr, "{}\n", line);
    return kExitBadInput;
  }
  const int width = OutputWidth(STDERR_FILENO);
  for (absl::string_view piece : absl::StrSplit(line, '\n')) {
    fmt::print(stderr, "{}\n", WrapToString(std::string_view(piece.data(), piece.size()), width));
  }
  return kExitBadInput;
}

std::string Printable(std::string_view text) {
  return io_internal::EscapeForMessage(text, text.size());
}

std::string FilesText(const std::vector<std::string>& paths) {
  std::vector<std::string> quoted;
  for (const std::string& path : paths) quoted.push_back(fmt::format("'{}'", Printable(path)));
  return fmt::format("{} {}", paths.size() == 1 ? "file" : "files", fmt::join(quoted, ", "));
}

ClientOptions& CommandClientOptions() {
  static ClientOptions* options = new ClientOptions();
  return *options;
}

Status AddPluginOption(std::string_view name_equals_value) {
  const size_t equals = name_equals_value.find('=');
  if (equals == std::string_view::npos || equals == 0) {
    return InvalidArgumentError(fmt::format(
        "--plugin-option '{}' is not NAME=VALUE (e.g. cpu_device_count=4)", name_equals_value));
  }
  const std::string name(name_equals_value.substr(0, equals));
  const std::string text(name_equals_value.substr(equals + 1));
  ClientOptions::PluginOptionValue value = text;
  int64_t integer = 0;
  double real = 0;
  if (auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), integer);
      error == std::errc() && end == text.data() + text.size() && !text.empty()) {
    value = integer;
  } else if (text == "true" || text == "false") {
    value = text == "true";
  } else if (auto [real_end, real_error] =
                 std::from_chars(text.data(), text.data() + text.size(), real);
             real_error == std::errc() && real_end == text.data() + text.size() &&
             text.find('.') != std::string::npos) {
    value = real;
  }
  CommandClientOptions().plugin_options[name] = std::move(value);
  return OkStatus();
}

StatusOr<Client*> DeviceSet::GetClient(const std::string& backend) {
  auto it = clients_.find(backend);
  if (it == clients_.end()) {
    FERRY_ASSIGN_OR_RETURN(std::unique_ptr<Client> client,
                           CreateClient(backend, CommandClientOptions()));
    it = clients_.emplace(backend, std::move(client)).first;
  }
  return it->second.get();
}

StatusOr<Device*> DeviceSet::Find(std::string_view name) {
  const size_t colon = name.find(':');
  const std::string backend(name.substr(0, colon));
  int index = 0;
  if (colon != std::string_view::npos) {
    std::string_view digits = name.substr(colon + 1);
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (error != std::errc() || end != digits.data() + digits.size() || digits.empty()) {
      return InvalidArgumentError(
          fmt::format("device '{}' is not of the form backend:index (e.g. host:0)", name));
    }
  }
  FERRY_ASSIGN_OR_RETURN(Client * client, GetClient(backend));
  auto devices = client->devices();
  if (index < 0 || index >= static_cast<int>(devices.size())) {
    const std::string hint = DeviceCountHint(backend);
    return absl::NotFoundError(fmt::format("device '{}' does not exist: {} has {} device(s){}",
                                           name, backend, devices.size(),
                                           hint.empty() ? "" : "; " + hint));
  }
  return devices[index];
}

StatusOr<HostBufferSemantics> ParseSemantics(const std::string& name) {
  if (name == "copy") return HostBufferSemantics::kImmutableOnlyDuringCall;
  if (name == "async") return HostBufferSemantics::kImmutableUntilTransferCompletes;
  if (name == "zero_copy") return HostBufferSemantics::kImmutableZeroCopy;
  return InvalidArgumentError(
      fmt::format("--semantics must be copy, async or zero_copy, not '{}'", name));
}

StatusOr<int64_t> ParseSize(std::string_view text) {
  double number = 0;
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) {
    ++i;
  }
  std::string digits(text.substr(0, i));
  char* parse_end = nullptr;
  number = std::strtod(digits.c_str(), &parse_end);
  std::string unit(text.substr(i));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  static const std::map<std::string, double> kUnits = {
      {"", 1},     {"b", 1},         {"k", 1e3}, {"kb", 1e3}, {"kib", 1 << 10},        {"m", 1e6},
      {"mb", 1e6}, {"mib", 1 << 20}, {"g", 1e9}, {"gb", 1e9}, {"gib", double(1 << 30)}};
  auto unit_it = kUnits.find(unit);
  if (digits.empty() || parse_end != digits.c_str() + digits.size() || unit_it == kUnits.end() ||
      number <= 0) {
    return InvalidArgumentError(
        fmt::format("size '{}' is not a positive size like 64MiB, 1GiB or 100MB", text));
  }
  const double bytes = number * unit_it->second;
  if (!(bytes < 0x1p63)) {  // beyond int64 (and inf): no machine has that much
    return InvalidArgumentError(fmt::format("size '{}' is larger than 2^63 bytes", text));
  }
  return static_cast<int64_t>(bytes);
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 4) {
    bytes /= 1024;
    ++unit;
  }
  return unit == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.2f} {}", bytes, units[unit]);
}

Status ReportRequestThatAppliesToNothing(DType requested, const std::vector<DType>& held,
                                         bool strict, bool print) {
  std::set<std::string_view> names;
  for (DType dtype : held) names.insert(DTypeName(dtype));
  const std::string note = fmt::format(
      "--device-dtype {} applies to no tensor here (they are {}): nothing is converted; "
      "--device-dtype-all applies it to every tensor",
      DTypeName(requested), fmt::join(names, ", "));
  if (strict) return InvalidArgumentError(note);
  if (print) {
    // As ReportError lays out errors: wrapped on a terminal, one line for the programs reading it.
    const std::string line = fmt::format("ferry put: note: {}", note);
    fmt::print(stderr, "{}\n",
               isatty(STDERR_FILENO) == 1 ? WrapToString(line, OutputWidth(STDERR_FILENO)) : line);
  }
  return OkStatus();
}

Status CheckOutputPath(const std::string& path, std::string_view option,
                       const std::vector<std::string>& inputs) {
  if (path == "-") return OkStatus();
  // A report is never a tensor file: a path named like one is a checkpoint that a mistyped
  // command line gave as the option's value (`put --json a.safetensors b.safetensors`).
  if (TensorFileFormatFromName(path).has_value()) {
    return InvalidArgumentError(fmt::format(
        "{} '{}' is named like a tensor file: {} writes a report there, not tensors (was it "
        "meant as an input? give {} its own path, or '-' for stdout)",
        option, Printable(path), option, option));
  }
  std::error_code error;
  const std::filesystem::path file(path);
  if (std::filesystem::exists(file, error)) {
    if (std::filesystem::is_directory(file, error)) {
      return InvalidArgumentError(fmt::format("{} '{}' is a directory", option, path));
    }
    for (const std::string& input : inputs) {
      std::error_code not_comparable;  // an input that does not exist is never the output
      if (std::filesystem::equivalent(file, input, not_comparable)) {
        return InvalidArgumentError(fmt::format(
            "{} '{}' is the input file '{}': it would be overwritten (give {} its own path, "
            "or '-' for stdout)",
            option, Printable(path), Printable(input), option));
      }
    }
    if (::access(path.c_str(), W_OK) != 0) {
      return InvalidArgumentError(
          fmt::format("{} '{}' cannot be written: {}", option, path, std::strerror(errno)));
    }
    return OkStatus();
  }
  const std::filesystem::path folder =
      file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  if (!std::filesystem::is_directory(folder, error)) {
    return InvalidArgumentError(
        fmt::format("{} '{}': the folder '{}' does not exist", option, path, folder.string()));
  }
  if (::access(folder.c_str(), W_OK) != 0) {
    return InvalidArgumentError(fmt::format("{} '{}': the folder '{}' cannot be written: {}",
                                            option, path, folder.string(), std::strerror(errno)));
  }
  return OkStatus();
}

Status WriteJson(const nlohmann::json& json, const std::string& path) {
  const std::string text =
      json.dump(2, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
  if (path == "-") {
    fmt::print("{}\n", text);
    std::fflush(stdout);
    return std::ferror(stdout) ? InvalidArgumentError("cannot write the JSON to stdout")
                               : OkStatus();
  }
  std::ofstream out(path);
  out << text << "\n";
  if (!out) return InvalidArgumentError(fmt::format("cannot write --json file '{}'", path));
  return OkStatus();
}

ProgressBar::ProgressBar(std::string label, int64_t total_bytes)
    : label_(std::move(label)),
      total_bytes_(total_bytes),
      enabled_(isatty(STDERR_FILENO) == 1),
      width_(OutputWidth(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

void ProgressBar::Update(int64_t done_bytes) {
  if (!enabled_) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && now - last_draw_ < std::chrono::milliseconds(100) && done_bytes < total_bytes_) {
    return;
  }
  last_draw_ = now;
  drawn_ = true;
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const double fraction = total_bytes_ > 0 ? static_cast<double>(done_bytes) / total_bytes_ : 1.0;
  const double rate = seconds > 0 ? done_bytes / seconds : 0;
  const double left = rate > 0 ? (total_bytes_ - done_bytes) / rate : 0;
  // "label [####......] 1.50 GiB / 3.00 GiB  1.23 GB/s  4.5s left", one column short of the
  // terminal's width (a line that fills the last column makes some terminals wrap).
  const std::string amounts = fmt::format("{} / {}  {:.2f} GB/s", FormatBytes(done_bytes),
                                          FormatBytes(total_bytes_), rate / 1e9);
  std::string tail = fmt::format("{}  {:.1f}s left", amounts, left);
  const int room = width_ - 1;
  const auto bar_room = [&] {
    return room - static_cast<int>(label_.size() + tail.size()) - 4;  // " [" "] " around the bar
  };
  if (bar_room() < 10) tail = amounts;
  const int bar_width = std::clamp(bar_room(), 0, 60);
  const int filled = static_cast<int>(fraction * bar_width);
  std::string line = fmt::format("{} [{}{}] {}", label_, std::string(filled, '#'),
                                 std::string(bar_width - filled, '.'), tail);
  if (static_cast<int>(line.size()) > room) line.resize(room);
  fmt::print(stderr, "\r\033[K{}", line);
  std::fflush(stderr);
}

void ProgressBar::Finish() {
  if (enabled_ && drawn_) fmt::print(stderr, "\r\033[K");
}

}  // namespace ferry::cli
