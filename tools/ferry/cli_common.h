// Shared pieces of the `ferry` command line: device look-up, sizes, errors, progress.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/core/status.h"
#include "ferry/device/client.h"
#include "ferry/device/registry.h"
#include "nlohmann/json.hpp"

namespace ferry::cli {

// Exit codes of every command.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 1;
inline constexpr int kExitUsage = 2;

// Prints "ferry <command>: error: <message>" on stderr (one line, or wrapped to the width of a
// terminal); returns kExitBadInput.
int ReportError(std::string_view command, const Status& status);

// The options of every client a command creates: set from the global flags --pjrt-plugin and
// --plugin-option before the command runs. Not thread-safe (set once in main).
ClientOptions& CommandClientOptions();
// Adds one "--plugin-option NAME=VALUE" to CommandClientOptions(): VALUE is an integer, a float
// (with a '.'), true/false, or else a string. InvalidArgument without '=' or with an empty NAME.
Status AddPluginOption(std::string_view name_equals_value);

// Clients created on demand, one per backend, owned here for the life of the command.
class DeviceSet {
 public:
  // "host:0", "opencl:1", or a bare backend name meaning its device 0.
  StatusOr<Device*> Find(std::string_view name);
  // The client of `backend`, created on first use.
  StatusOr<Client*> GetClient(const std::string& backend);

 private:
  std::map<std::string, std::unique_ptr<Client>, std::less<>> clients_;
};

// `text` that came from a file (a tensor name) or from elsewhere outside ferry, made safe to
// print: control characters, bidirectional controls and bytes that are not UTF-8 escaped
// (`\x1b`, `\n`, `\u202e`), exactly as error messages quote names (io_internal::EscapeForMessage),
// without a length limit (a table shortens it itself).
std::string Printable(std::string_view text);

// "file 'a.safetensors'" or "files 'a.safetensors', 'b.safetensors'" (each Printable), for a
// message about a set of files.
std::string FilesText(const std::vector<std::string>& paths);

// --semantics: "copy", "async" or "zero_copy" -> the HostBufferSemantics. InvalidArgument naming
// the flag on anything else.
StatusOr<HostBufferSemantics> ParseSemantics(const std::string& name);

// "1GiB", "64MiB", "100MB", "4096" -> bytes. InvalidArgument on anything else.
StatusOr<int64_t> ParseSize(std::string_view text);
// 1536 -> "1.50 KiB".
std::string FormatBytes(double bytes);

// Writes `json` (indented, with a final newline) to the file `path`, or to stdout when `path` is
// "-". Every character outside printable ASCII is written as a \uXXXX escape (and a byte that is
// not UTF-8 as U+FFFD), so the JSON is valid and no name from a file reaches a terminal raw.
// InvalidArgument naming the file when it cannot be written.
Status WriteJson(const nlohmann::json& json, const std::string& path);
// OK when a file can be written at `path` ("-" is stdout): its folder exists and is writable, and
// the file, if it exists, is a writable regular file. Nothing is created. `option` names the flag
// in the error ("--json"). Checked before a command starts its work, so that a mistyped output
// path is an error at once, not after the work. InvalidArgument as well when the path is named
// like a tensor file (.safetensors, .npy, .npz) or is one of `inputs` (the same file under any
// name): `ferry put --json a.safetensors b.safetensors` must not write its report over a
// checkpoint.
// A --device-dtype `requested` that applies to no tensor of the put (whose file dtypes are
// `held`) converts nothing: with `strict` that is InvalidArgument, else OK and a note on stderr
// (when `print`: rank 0 of a job only), so that a put does not exit 0 silently.
Status ReportRequestThatAppliesToNothing(DType requested, const std::vector<DType>& held,
                                         bool strict, bool print = true);

Status CheckOutputPath(const std::string& path, std::string_view option,
                       const std::vector<std::string>& inputs = {});

// A one-line progress bar on stderr (bytes, GB/s, time left), drawn only when stderr is a
// terminal and at most every 100 ms, as wide as the terminal (the bar grows with it, up to 60
// marks; a narrow one drops the time left). Not thread-safe.
class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total_bytes);
  void Update(int64_t done_bytes);
  // Clears the line.
  void Finish();

 private:
  const std::string label_;
  const int64_t total_bytes_;
  const bool enabled_;
  const int width_;
  const std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
};

}  // namespace ferry::cli
