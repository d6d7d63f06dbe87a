// The single-process group, the process-wide group, and error agreement (engine-independent: built
// on AllGather).
#include "ferry/distributed/process_group.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "ferry/core/mutex.h"
#include "ferry/core/settings.h"
#include "fmt/format.h"
#include "fmt/ranges.h"
#include "src/distributed/mpi_process_group.h"

namespace ferry::distributed {
namespace {

class SingleProcessGroup final : public ProcessGroup {
 public:
  std::string_view engine() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  Status Barrier(std::string_view) override { return OkStatus(); }
  StatusOr<std::vector<std::string>> AllGather(std::string_view local, std::string_view) override {
    return std::vector<std::string>{std::string(local)};
  }
};

struct CurrentGroup {
  Mutex mutex;
  std::unique_ptr<ProcessGroup> group ABSL_GUARDED_BY(mutex);
  bool initialized ABSL_GUARDED_BY(mutex) = false;
};

CurrentGroup& Current() {
  static auto* current = new CurrentGroup();  // lives until exit: groups are used from atexit
  return *current;
}

// "<code>\n<message>": a status as bytes for the all-gather.
std::string Encode(const Status& status) {
  return fmt::format("{}\n{}", static_cast<int>(status.code()), std::string(status.message()));
}

Status Decode(std::string_view bytes) {
  const size_t newline = bytes.find('\n');
  int code = static_cast<int>(absl::StatusCode::kUnknown);
  if (newline == std::string_view::npos ||
      !absl::SimpleAtoi(std::string(bytes.substr(0, newline)), &code)) {
    return absl::UnknownError(fmt::format("a malformed status from a peer: '{}'", bytes));
  }
  return Status(static_cast<absl::StatusCode>(code), std::string(bytes.substr(newline + 1)));
}

bool IsUtf8Continuation(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// The characters (UTF-8 code points) in `text`: what a reader counts, where bytes are not.
size_t CharacterCount(std::string_view text) {
  return static_cast<size_t>(
      std::count_if(text.begin(), text.end(), [](char c) { return !IsUtf8Continuation(c); }));
}

// The columns a terminal gives `text` (UTF-8): two for an East Asian wide or fullwidth character
// (Unicode's EastAsianWidth W and F blocks: Hangul, CJK, kana, fullwidth forms), one for any other.
size_t DisplayWidth(std::string_view text) {
  size_t width = 0;
  for (size_t i = 0; i < text.size();) {
    const auto lead = static_cast<unsigned char>(text[i]);
    const size_t length = lead < 0x80 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4;
    uint32_t code = length == 1 ? lead : lead & (0x7F >> length);
    for (size_t k = 1; k < length && i + k < text.size(); ++k) {
      code = (code << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    }
    const bool wide = (code >= 0x1100 && code <= 0x115F) || (code >= 0x2E80 && code <= 0xA4CF) ||
                      (code >= 0xAC00 && code <= 0xD7A3) || (code >= 0xF900 && code <= 0xFAFF) ||
                      (code >= 0xFE30 && code <= 0xFE4F) || (code >= 0xFF00 && code <= 0xFF60) ||
                      (code >= 0xFFE0 && code <= 0xFFE6) || (code >= 0x20000 && code <= 0x3FFFD);
    width += wide ? 2 : 1;
    i += length;
  }
  return width;
}

// The lines of a value (a value without '\n' is one line).
std::vector<std::string_view> Lines(std::string_view value) {
  std::vector<std::string_view> lines;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(value.data(), value.size()), '\n')) {
    lines.emplace_back(line.data(), line.size());
  }
  return lines;
}

// "name" of a line "name: value", else "".
std::string_view FieldName(std::string_view line) {
  const size_t colon = line.find(": ");
  return colon == std::string_view::npos ? std::string_view() : line.substr(0, colon);
}

// `text` cut to at most kExcerptWidth bytes around byte `at`, the same cut for every text that
// is equal up to `at` (so that excerpts of two values line up): a "..." where text was left out.
// Returns the excerpt and the column of `at` in it.
constexpr size_t kExcerptWidth = 64;
constexpr size_t kContextBefore = 24;
std::pair<std::string, size_t> Excerpt(std::string_view text, size_t at) {
  // From the start while that shows the difference with some text after it.
  size_t begin = at + kContextBefore + 3 > kExcerptWidth ? at - kContextBefore : 0;
  // Never from inside a UTF-8 sequence (the same bytes in both values: the same begin).
  while (begin > 0 && IsUtf8Continuation(text[begin])) --begin;
  std::string out = begin > 0 ? "..." : "";
  const size_t column = out.size() + (at - begin);
  size_t end = std::min(text.size(), begin + kExcerptWidth - out.size());
  if (end < text.size()) {
    end -= std::min<size_t>(3, end - begin);
    while (end > begin && end < text.size() && IsUtf8Continuation(text[end])) --end;
  }
  out += text.substr(begin, end - begin);
  if (end < text.size()) out += "...";
  return {out, column};
}

// The message of AgreeOnValue: which ranks differ from rank 0, the first field (a value's line
// "name: ...") or character where the first of them does, and both values around it, on lines
// that fit 80 columns:
//   the command line differs between ranks 0 and 1
//   (ranks 2, 3 differ from rank 0 too)        <- only when they do
//   first in --shard-dim:
//     rank 0: 0
//     rank 1: 1
//             ^
std::string DescribeDifference(std::string_view what, const std::vector<std::string>& all,
                               const std::vector<int>& differing) {
  const int first = differing.front();
  std::string message = fmt::format("{} differs between ranks 0 and {}", what, first);
  if (differing.size() > 1) {
    constexpr size_t kListed = 8;
    std::vector<int> others(differing.begin() + 1,
                            differing.begin() + std::min(differing.size(), kListed + 1));
    message += fmt::format("\n(rank{} {}{} differ{} from rank 0 too)", others.size() > 1 ? "s" : "",
                           fmt::join(others, ", "),
                           differing.size() > kListed + 1
                               ? fmt::format(" and {} more", differing.size() - kListed - 1)
                               : "",
                           differing.size() > 2 ? "" : "s");
  }
  const std::vector<std::string_view> ours = Lines(all[0]);
  const std::vector<std::string_view> theirs = Lines(all[static_cast<size_t>(first)]);
  size_t line = 0;
  while (line < ours.size() && line < theirs.size() && ours[line] == theirs[line]) ++line;
  std::string_view a = line < ours.size() ? ours[line] : std::string_view();
  std::string_view b = line < theirs.size() ? theirs[line] : std::string_view();
  // A named field whose name both ranks give: named, and only the values compared.
  const std::string_view name = FieldName(a);
  const bool named = !name.empty() && FieldName(b) == name;
  if (named) {
    a.remove_prefix(name.size() + 2);
    b.remove_prefix(name.size() + 2);
    // A long name keeps its ends (a tensor's name says most there), cut between characters.
    constexpr size_t kNameWidth = 68;
    std::string shown(name);
    if (name.size() > kNameWidth) {
      size_t head = kNameWidth / 2 - 2;
      size_t tail = name.size() - (kNameWidth / 2 - 1);
      while (head > 0 && IsUtf8Continuation(name[head])) --head;
      while (tail < name.size() && IsUtf8Continuation(name[tail])) ++tail;
      shown = fmt::format("{}...{}", name.substr(0, head), name.substr(tail));
    }
    message += fmt::format("\nfirst in {}:", shown);
  }
  size_t at = 0;
  while (at < a.size() && at < b.size() && a[at] == b[at]) ++at;
  if (!named) {
    const size_t character = CharacterCount(a.substr(0, at)) + 1;
    message += ours.size() > 1 || theirs.size() > 1
                   ? fmt::format("\nfirst on line {}, at character {}:", line + 1, character)
                   : fmt::format("\nfirst at character {}:", character);
  }
  const std::string label_0 = "  rank 0: ";
  const std::string label_r = fmt::format("  rank {}: ", first);
  const size_t label_width = std::max(label_0.size(), label_r.size());
  const auto [excerpt_a, column] = Excerpt(a, at);
  const std::string excerpt_b = Excerpt(b, at).first;
  message += fmt::format("\n{:<{}}{}", label_0, label_width, excerpt_a);
  message += fmt::format("\n{:<{}}{}", label_r, label_width, excerpt_b);
  // Under the difference: as many columns as a terminal gives what comes before it.
  message += "\n" + std::string(label_width + DisplayWidth(excerpt_a.substr(0, column)), ' ') + "^";
  return message;
}

}  // namespace

std::unique_ptr<ProcessGroup> MakeSingleProcessGroup() {
  return std::make_unique<SingleProcessGroup>();
}

double CollectiveTimeoutSeconds() {
  // A bad value was refused by Initialize, which every multi-process group comes from; the
  // default stands in only for a value that went bad since (the environment changed under us).
  return settings::DistributedTimeoutSeconds().value_or(300);
}

bool StartedByMpiLauncher() {
  for (const char* name : {"PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

bool HaveMpi() { return internal::kHaveMpi; }

StatusOr<ProcessGroup*> Initialize() {
  CurrentGroup& current = Current();
  MutexLock lock(current.mutex);
  if (current.initialized) return current.group.get();
  FERRY_RETURN_IF_ERROR(CheckSettings());
  if (StartedByMpiLauncher()) {
    if (!HaveMpi()) {
      return UnavailableError(
          "this process was started by an MPI launcher (mpiexec), but this build of ferry has no "
          "MPI: rebuild it with MPI found by CMake (Debian: libmpich-dev)");
    }
    FERRY_ASSIGN_OR_RETURN(current.group, internal::MakeMpiProcessGroup());
  } else {
    current.group = MakeSingleProcessGroup();
  }
  current.initialized = true;
  return current.group.get();
}

ProcessGroup& CurrentProcessGroup() {
  CurrentGroup& current = Current();
  MutexLock lock(current.mutex);
  if (current.group == nullptr) current.group = MakeSingleProcessGroup();
  return *current.group;
}

void Finalize() {
  CurrentGroup& current = Current();
  MutexLock lock(current.mutex);
  if (current.initialized && current.group != nullptr) internal::FinalizeIfMpi(*current.group);
}

Status AgreeOnStatus(ProcessGroup& group, const Status& local, std::string_view step) {
  // Each rank's step goes with its status: ranks that reached different steps (a rank that left
  // a loop early, calls made in another order) are told so, the same on every rank, instead of
  // agreeing on the wrong step's outcome and waiting for each other later.
  FERRY_ASSIGN_OR_RETURN(
      std::vector<std::string> all,
      group.AllGather(fmt::format("{}:{}{}", step.size(), step, Encode(local)), step));
  std::vector<std::string_view> steps;
  std::vector<std::string_view> statuses;
  for (const std::string& entry : all) {
    const size_t colon = entry.find(':');
    size_t length = 0;
    if (colon == std::string::npos || !absl::SimpleAtoi(entry.substr(0, colon), &length) ||
        length > entry.size() - colon - 1) {
      return absl::UnknownError(fmt::format("a malformed status from a peer: '{}'", entry));
    }
    steps.push_back(std::string_view(entry).substr(colon + 1, length));
    statuses.push_back(std::string_view(entry).substr(colon + 1 + length));
  }
  for (size_t rank = 1; rank < steps.size(); ++rank) {
    if (steps[rank] != steps[0]) {
      return FailedPreconditionError(fmt::format(
          "the processes are at different collective steps: rank 0 at '{}', rank {} at '{}' "
          "(every process must make the same collective calls in the same order)",
          steps[0], rank, steps[rank]));
    }
  }
  int first = -1;
  Status first_status;
  std::vector<int> others;
  for (size_t rank = 0; rank < statuses.size(); ++rank) {
    Status status = Decode(statuses[rank]);
    if (status.ok()) continue;
    if (first < 0) {
      first = static_cast<int>(rank);
      first_status = std::move(status);
    } else {
      others.push_back(static_cast<int>(rank));
    }
  }
  if (first < 0) return OkStatus();
  std::string message = fmt::format("rank {} of {} failed during {}: {}", first, group.size(), step,
                                    std::string(first_status.message()));
  if (!others.empty()) {
    message += fmt::format(" ({} {} failed too)", others.size() == 1 ? "rank" : "ranks",
                           fmt::join(others, ", "));
  }
  return Status(first_status.code(), message);
}

Status AgreeOnValue(ProcessGroup& group, std::string_view local, std::string_view what) {
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> all, group.AllGather(local, what));
  std::vector<int> differing;
  for (size_t rank = 1; rank < all.size(); ++rank) {
    if (all[rank] != all[0]) differing.push_back(static_cast<int>(rank));
  }
  if (differing.empty()) return OkStatus();
  return InvalidArgumentError(DescribeDifference(what, all, differing));
}

StatusOr<std::vector<uint64_t>> AllReduceSum(ProcessGroup& group,
                                             const std::vector<uint64_t>& local,
                                             std::string_view step) {
  std::string bytes(local.size() * sizeof(uint64_t), '\0');
  if (!local.empty()) std::memcpy(bytes.data(), local.data(), bytes.size());
  FERRY_ASSIGN_OR_RETURN(std::vector<std::string> all, group.AllGather(bytes, step));
  std::vector<uint64_t> sums(local.size(), 0);
  for (size_t rank = 0; rank < all.size(); ++rank) {
    if (all[rank].size() != bytes.size()) {
      return InvalidArgumentError(fmt::format("{}: rank {} summed {} values, this rank {}", step,
                                              rank, all[rank].size() / sizeof(uint64_t),
                                              local.size()));
    }
    for (size_t i = 0; i < sums.size(); ++i) {
      uint64_t value = 0;
      std::memcpy(&value, all[rank].data() + i * sizeof(uint64_t), sizeof(value));
      sums[i] += value;
    }
  }
  return sums;
}

}  // namespace ferry::distributed
