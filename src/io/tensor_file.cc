#include "ferry/io/tensor_file.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <utility>

#include "fmt/format.h"
#include "src/io/npy.h"
#include "src/io/npz.h"
#include "src/io/safetensors.h"
#include "src/io/stored_tensor.h"

namespace ferry {
namespace {

// Whether `name` ends in `extension` (ASCII, any case).
bool HasExtension(std::string_view name, std::string_view extension) {
  if (name.size() < extension.size()) return false;
  const std::string_view tail = name.substr(name.size() - extension.size());
  for (size_t i = 0; i < tail.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(tail[i])) != extension[i]) return false;
  }
  return true;
}

// safetensors has no magic (it starts with its header size), so it is what is left. A file too
// short to hold any format's start (an empty or cut-off .npy) is judged by its name instead, so
// that its error speaks of the format it was meant to be.
TensorFileFormat DetectFormat(const MappedFile& file) {
  const auto starts_with = [&](std::string_view magic) {
    return file.size() >= static_cast<int64_t>(magic.size()) &&
           std::memcmp(file.data(), magic.data(), magic.size()) == 0;
  };
  if (starts_with("\x93NUMPY")) return TensorFileFormat::kNpy;
  if (starts_with("PK\x03\x04") || starts_with("PK\x05\x06")) return TensorFileFormat::kNpz;
  constexpr int64_t kSafetensorsMinimumBytes = 8;  // the header's size, a little-endian u64
  if (file.size() < kSafetensorsMinimumBytes) {
    return TensorFileFormatFromName(file.display_name()).value_or(TensorFileFormat::kSafetensors);
  }
  return TensorFileFormat::kSafetensors;
}

// The kernel's read-around on a page fault of a file mapping reads a window around the page
// (read_ahead_kb: 8 MiB on this machine). Reading a header through the mapping would then read that
// much of the tensors after it, which a process that loads only its own shards never needs
// (docs/distributed.md). So read-around is off while the metadata is parsed (a parser that reads a
// long header reads it ahead itself, MappedFile::Prefetch) and back to the default after.
class NoReadAroundWhileParsing {
 public:
  explicit NoReadAroundWhileParsing(const MappedFile& file) : file_(file) { Advise(MADV_RANDOM); }
  ~NoReadAroundWhileParsing() { Advise(MADV_NORMAL); }
  NoReadAroundWhileParsing(const NoReadAroundWhileParsing&) = delete;
  NoReadAroundWhileParsing& operator=(const NoReadAroundWhileParsing&) = delete;

 private:
  void Advise(int advice) {
    if (!file_.is_mapped() || file_.size() == 0) return;
    // Advice only (errors ignored): the data reads the same either way.
    ::madvise(const_cast<std::byte*>(file_.data()), static_cast<size_t>(file_.size()), advice);
  }
  const MappedFile& file_;
};

// The file bytes of `tensors` (those stored in the file), sorted, with ranges less than a page
// apart merged: the kernel reads whole pages anyway, and thousands of small adjacent tensors
// become one read-ahead instead of thousands.
std::vector<std::pair<int64_t, int64_t>> SelectedDataRanges(
    const std::vector<TensorFileEntry>& tensors, int64_t file_size) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const TensorFileEntry& entry : tensors) {
    if (entry.file_offset < 0) continue;  // inflated: its bytes are in memory already
    const int64_t size = entry.source->view().dense_size_bytes();
    ranges.emplace_back(entry.file_offset, std::min(file_size, entry.file_offset + size));
  }
  std::sort(ranges.begin(), ranges.end());
  const int64_t page_size = ::sysconf(_SC_PAGESIZE);
  std::vector<std::pair<int64_t, int64_t>> merged;
  for (const auto& range : ranges) {
    if (!merged.empty() && range.first <= merged.back().second + page_size) {
      merged.back().second = std::max(merged.back().second, range.second);
    } else {
      merged.push_back(range);
    }
  }
  return merged;
}

}  // namespace

std::string_view TensorFileFormatName(TensorFileFormat format) {
  switch (format) {
    case TensorFileFormat::kSafetensors:
      return "safetensors";
    case TensorFileFormat::kNpy:
      return "npy";
    case TensorFileFormat::kNpz:
      return "npz";
  }
  return "unknown";
}

std::optional<TensorFileFormat> TensorFileFormatFromName(std::string_view name) {
  for (const TensorFileFormat format :
       {TensorFileFormat::kSafetensors, TensorFileFormat::kNpy, TensorFileFormat::kNpz}) {
    if (HasExtension(name, fmt::format(".{}", TensorFileFormatName(format)))) return format;
  }
  return std::nullopt;
}

StatusOr<TensorFile> TensorFile::Open(const std::string& path, const TensorFileOptions& options) {
  FERRY_ASSIGN_OR_RETURN(std::shared_ptr<const MappedFile> file, MappedFile::Open(path));
  return ParseTensorFile(std::move(file), options);
}

const TensorFileEntry* TensorFile::Find(std::string_view name) const {
  for (const TensorFileEntry& entry : tensors_) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

void TensorFile::Prefetch(int touch_threads) const {
  for (const auto& [begin, end] : data_ranges_) file_->Prefetch(begin, end - begin, touch_threads);
}

StatusOr<TensorFile> ParseTensorFile(std::shared_ptr<const MappedFile> file,
                                     const TensorFileOptions& options) {
  if (file == nullptr) return InvalidArgumentError("ParseTensorFile: no file");
  NoReadAroundWhileParsing no_read_around(*file);
  const TensorFileFormat format = options.format.value_or(DetectFormat(*file));
  StatusOr<io_internal::ParsedTensors> parsed = InvalidArgumentError("unknown tensor file format");
  switch (format) {
    case TensorFileFormat::kSafetensors:
      parsed = io_internal::ParseSafetensors(file);
      break;
    case TensorFileFormat::kNpy:
      parsed = io_internal::ParseNpyFile(file);
      break;
    case TensorFileFormat::kNpz:
      parsed = io_internal::ParseNpz(file, options);
      break;
  }
  if (!parsed.ok()) {
    // A file named .npy or .npz that does not start like one was read as safetensors (the format
    // without a magic): say so, or the safetensors error alone (a huge "header size") misleads.
    const std::optional<TensorFileFormat> by_name = TensorFileFormatFromName(file->display_name());
    const char* named = nullptr;
    if (by_name == TensorFileFormat::kNpz) {
      named =
          "an .npz archive, but it does not start like one (a zip file starts with \"PK\"; "
          "bytes before the archive are refused)";
    } else if (by_name == TensorFileFormat::kNpy) {
      named = "an .npy file, but it does not start like one (with \"\\x93NUMPY\")";
    }
    if (!options.format.has_value() && format == TensorFileFormat::kSafetensors &&
        named != nullptr) {
      return Status(parsed.status().code(),
                    fmt::format("{} (read as safetensors: its name says {})",
                                std::string(parsed.status().message()), named));
    }
    return parsed.status();
  }
  TensorFile result;
  result.format_ = format;
  result.metadata_ = std::move(parsed->metadata);
  if (options.selector == nullptr) {
    result.tensors_ = std::move(parsed->tensors);
    result.data_ranges_.emplace_back(parsed->data_begin, parsed->data_end);
  } else {
    // ParseNpz asked the selector already (to leave unselected members unread); the other
    // formats' entries only point into the mapping, so they are chosen here.
    for (TensorFileEntry& entry : parsed->tensors) {
      if (format == TensorFileFormat::kNpz || options.selector->Selects(entry.name)) {
        result.tensors_.push_back(std::move(entry));
      }
    }
    result.data_ranges_ = SelectedDataRanges(result.tensors_, file->size());
  }
  result.file_ = std::move(file);
  return result;
}

}  // namespace ferry
